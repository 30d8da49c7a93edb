"""Typed settings: one TOML file plus `EXECGATE_<SECTION>_<KEY>` overrides.

Every model forbids unknown keys and every default is the safe one, so a typo in
a security setting is a start-up error naming the key, never a silent default.
"""

from __future__ import annotations

import ipaddress
import json
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from backends import REGISTRY, BackendError, backend_class
from gateway.settings.ingress import McpSettings, RouteSettings

ENV_PREFIX = "EXECGATE_"
# EXECGATE_* variables that are not gateway settings: the config path, and what the
# CLI and the test suite read for themselves.
NOT_SETTINGS = frozenset(
    {"CONFIG", "URL", "TOKEN", "LOG_LEVEL", "OPA_BIN", "NSJAIL_BIN", "REGEN_GOLDEN"}
)
# What `make` built on this machine (the Makefile exports them): a gateway started as a
# subprocess with a clean EXECGATE_* environment still runs the same OPA and nsjail.
BUILT_TOOLS_ENV = frozenset({"EXECGATE_OPA_BIN", "EXECGATE_NSJAIL_BIN"})


class SettingsError(Exception):
    """Configuration is unusable; the message names the offending key."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)


class ServerSettings(Section):
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    max_body_bytes: int = Field(10 * 1024 * 1024, gt=0)
    # Code is handed to the policy engine whole; bigger programs cost the engine
    # tens of milliseconds per MiB, so they are refused at the edge instead.
    max_code_bytes: int = Field(1024 * 1024, gt=0)
    # Prometheus text at /metrics; operators may hide it behind their own proxy.
    metrics_public: bool = True
    # Upper bound of `?wait=` on GET /v1/executions/{id}.
    max_wait_s: float = Field(60.0, ge=0)
    # On SIGTERM: stop accepting, let running executions finish for this long, then
    # kill the rest (audited as such) and flush the audit log.
    shutdown_grace_s: float = Field(30.0, ge=0)
    # "json": one object per line with request_id / execution_id (for log shippers).
    log_format: Literal["text", "json"] = "text"


class AuthSettings(Section):
    tenant_claim: str = "tenant"
    issuer: str = ""
    audience: str = ""
    hs256_secret_file: str = "var/dev-hs256.key"
    public_keys: list[str] = []
    jwks_url: str = ""
    jwks_cache_s: int = Field(300, ge=0)
    # At most one JWKS fetch per this many seconds, however many unknown kids arrive.
    jwks_min_refresh_s: float = Field(10.0, ge=0)
    leeway_s: int = Field(30, ge=0, le=300)
    # Tokens valid longer than this are refused even if signed correctly.
    max_token_ttl_s: int = Field(24 * 3600, gt=0)


class PolicySettings(Section):
    # "embedded": OPA-compiled Wasm in-process; "rego-cpp": the older in-process
    # evaluator (regopy); "opa": an OPA server at opa_url.
    engine: Literal["embedded", "rego-cpp", "opa"] = "embedded"
    path: str = "policies"
    # The OPA binary that compiles the policy for "embedded" (empty: $EXECGATE_OPA_BIN,
    # then `opa` on PATH, then the one `make opa` builds).
    opa_bin: str = ""
    opa_url: str = "http://127.0.0.1:8181"
    # The bundle (in OPA's configuration) whose revision names each OPA decision.
    opa_bundle: str = "execgate"
    timeout_ms: int = Field(200, gt=0)
    # Embedded engines: how often `path` is checked for edits (0: never, restart to reload).
    reload_interval_s: float = Field(2.0, ge=0)
    # Each decision's input (masked by policies/system/log.rego, as OPA's decision log
    # is) and verdict, kept for `execgate policy replay` / `policy eval --execution`.
    record_inputs: bool = True
    # Empty: decision-inputs.db beside state.path.
    inputs_path: str = ""
    inputs_retention_days: float = Field(7.0, gt=0)
    inputs_max_mb: int = Field(256, gt=0)


class TenantSettings(Section):
    rate_per_s: float = Field(10.0, gt=0)
    burst: int = Field(20, gt=0)
    max_concurrent: int = Field(4, gt=0)
    cpu_s_per_hour: float = Field(3600.0, gt=0)
    executions_per_day: int = Field(100_000, gt=0)
    timeout_s: float = Field(30.0, gt=0)
    memory_mb: int = Field(512, gt=0)
    cpus: float = Field(1.0, gt=0)
    pids: int = Field(64, gt=0)
    disk_mb: int = Field(64, gt=0)
    output_bytes: int = Field(1_048_576, gt=0)
    languages: list[str] = ["python", "bash", "javascript"]


class ApprovalsSettings(Section):
    # Where approval requests are POSTed (Standard Webhooks signed); empty: nowhere,
    # approvers use the API, the CLI or the console.
    webhook_url: str = ""
    webhook_secret_file: str = ""
    # Secret that signs decision callbacks (Standard Webhooks); empty: JWT only.
    callback_secret_file: str = ""
    ttl_s: int = Field(900, gt=0)
    # Ed25519 key that signs approval tokens (aud execgate:approval); generated if missing.
    signing_key_file: str = "var/approval-ed25519.pem"
    # On approval the gateway runs the held execution itself, spending the token;
    # false: the requester presents the token in a new POST /v1/executions.
    run_held: bool = True
    delivery_attempts: int = Field(6, ge=1, le=20)
    delivery_timeout_s: float = Field(5.0, gt=0)
    backoff_initial_s: float = Field(0.5, gt=0)
    backoff_max_s: float = Field(60.0, gt=0)
    callback_tolerance_s: int = Field(300, gt=0)
    # Base of the links in webhook payloads, e.g. "https://execgate.example.com".
    public_url: str = ""
    expiry_check_s: float = Field(1.0, gt=0)


class ReviewSettings(Section):
    # After each execution that tried anything, the policy's second question,
    # `data.execgate.review`, over its behaviour record; off: nothing is flagged.
    enabled: bool = True
    # Where flagged executions are POSTed (Standard Webhooks signed); empty: nowhere,
    # reviewers read the audit log and the console.
    webhook_url: str = ""
    webhook_secret_file: str = ""
    delivery_attempts: int = Field(6, ge=1, le=20)
    delivery_timeout_s: float = Field(5.0, gt=0)
    backoff_initial_s: float = Field(0.5, gt=0)
    backoff_max_s: float = Field(60.0, gt=0)
    # Deliveries waiting beyond this are dropped (and audited): a flood of flagged
    # executions against a dead receiver costs bounded memory.
    max_pending: int = Field(1000, ge=1)
    # Base of the links in webhook payloads, e.g. "https://execgate.example.com".
    public_url: str = ""


class AuditSettings(Section):
    path: str = "var/audit.jsonl"
    # Extra wait to gather more records into one fsync. Records that arrive while an
    # fsync runs already share the next one, so 0 is best unless the disk has a
    # small IOPS budget. No record is acknowledged before its fsync has returned.
    flush_interval_ms: float = Field(0.0, ge=0)


class EgressSecretSettings(Section):
    """A tenant's credential for one destination, added by the egress proxy to
    plain-HTTP requests for it; the value is read from a file at each use and
    never reaches a sandbox, a log line or a policy input."""

    destination: str = Field(pattern=r"^[A-Za-z0-9.-]+:[0-9]{1,5}$")
    header: str = Field("Authorization", pattern=r"^[A-Za-z0-9-]{1,64}$")
    value_file: str


class EgressSettings(Section):
    # tenant -> secret name -> secret (`[egress.secrets.<tenant>.<name>]`).
    secrets: dict[str, dict[str, EgressSecretSettings]] = {}
    # Internal ranges (CIDR, e.g. "10.20.0.0/16") an allowed *name* may resolve to.
    # Empty: a name that leads to loopback, private, link-local, CGNAT... is refused
    # (backends/egress/addresses.py); only literal entries reach those addresses.
    internal_allow: list[str] = []

    @field_validator("internal_allow")
    @classmethod
    def _cidrs(cls, value: list[str]) -> list[str]:
        for item in value:
            try:
                ipaddress.ip_network(item, strict=True)
            except ValueError as exc:
                raise ValueError(f"{item!r} is not a CIDR range: {exc}") from None
        return value


class ToolSettings(Section):
    """How one tool name runs code: where its language, code and files sit in the
    call's arguments. A fixed `language` ignores `language_arg`."""

    language: str | None = None
    language_arg: str = "language"
    code_arg: str = "code"
    files_arg: str = "files"
    stdin_arg: str = "stdin"


def _default_tools() -> dict[str, ToolSettings]:
    return {
        "run_python": ToolSettings(language="python"),
        "execute_python": ToolSettings(language="python"),
        "run_code": ToolSettings(),
        "bash": ToolSettings(language="bash", code_arg="command"),
        "shell": ToolSettings(language="bash", code_arg="command"),
    }


class IngressSettings(Section):
    # Tool names whose calls run code (POST /v1/tool-calls); other names are refused.
    tools: dict[str, ToolSettings] = Field(default_factory=_default_tools)
    max_calls_per_request: int = Field(16, ge=1, le=256)
    # POST/GET/DELETE /mcp, and reverse-proxied path prefixes (gateway/settings/ingress.py).
    mcp: McpSettings = McpSettings()
    routes: list[RouteSettings] = []


class StateSettings(Section):
    backend: Literal["sqlite", "redis"] = "sqlite"
    path: str = "var/state.db"
    redis_url: str = "redis://127.0.0.1:6379/0"
    # A Redis slower than this fails the request closed (503 state_unavailable).
    redis_timeout_s: float = Field(0.5, gt=0)


class AdmissionSettings(Section):
    # Executions running at once across all tenants (shared fairly); 0: no global cap.
    max_concurrent_executions: int = Field(64, ge=0)
    # How long a request may wait for a global slot before 503 queue_timeout.
    queue_timeout_s: float = Field(5.0, ge=0)
    # Leases of a replica that stops renewing them (it died) lapse after this.
    lease_ttl_s: float = Field(30.0, gt=1)


class EscapeTestSettings(Section):
    # Seconds between runs of the escape suite against the live backends (0: only
    # on demand, POST /v1/admin/escape-test). A backend with an escape is taken
    # out of service until an operator clears it.
    interval_s: float = Field(0.0, ge=0)


class TelemetrySettings(Section):
    # OpenTelemetry traces (needs `pip install execgate[telemetry]`): a span per request
    # and per stage (policy, approval, sandbox...). Off: no tracing code runs at all.
    enabled: bool = False
    service_name: str = "execgate"
    # "console" (spans as JSON on stdout) or "otlp" (OTLP/HTTP; needs
    # opentelemetry-exporter-otlp-proto-http) to `otlp_endpoint`.
    exporter: Literal["console", "otlp"] = "otlp"
    otlp_endpoint: str = "http://127.0.0.1:4318/v1/traces"


def _default_tenants() -> dict[str, TenantSettings]:
    return {"default": TenantSettings()}


class Settings(Section):
    server: ServerSettings = ServerSettings()
    auth: AuthSettings = AuthSettings()
    policy: PolicySettings = PolicySettings()
    # `default` names the backend; every other key is a backend's own table.
    backends: dict[str, Any] = {"default": "nsjail"}
    tenants: dict[str, TenantSettings] = Field(default_factory=_default_tenants)
    approvals: ApprovalsSettings = ApprovalsSettings()
    review: ReviewSettings = ReviewSettings()
    audit: AuditSettings = AuditSettings()
    egress: EgressSettings = EgressSettings()
    ingress: IngressSettings = IngressSettings()
    state: StateSettings = StateSettings()
    admission: AdmissionSettings = AdmissionSettings()
    escape_test: EscapeTestSettings = EscapeTestSettings()
    telemetry: TelemetrySettings = TelemetrySettings()

    @field_validator("backends")
    @classmethod
    def _check_backends(cls, value: dict[str, Any]) -> dict[str, Any]:
        value = dict(value)
        default = value.setdefault("default", "nsjail")
        if not isinstance(default, str) or default not in REGISTRY:
            raise ValueError(f"default: unknown backend {default!r} (known: {sorted(REGISTRY)})")
        for name, table in value.items():
            if name == "default":
                continue
            if name not in REGISTRY:
                raise ValueError(f"{name}: unknown backend (known: {sorted(REGISTRY)})")
            if not isinstance(table, Mapping | BaseModel):
                raise ValueError(f"{name}: must be a table")
        return value

    @field_validator("tenants")
    @classmethod
    def _ensure_default_tenant(cls, value: dict[str, TenantSettings]) -> dict[str, TenantSettings]:
        value = dict(value)
        value.setdefault("default", TenantSettings())
        return value

    @property
    def default_backend(self) -> str:
        return str(self.backends["default"])

    def enabled_backends(self) -> list[str]:
        """The default backend plus every backend that has its own table."""
        names = [self.default_backend]
        names += [n for n in self.backends if n not in ("default", self.default_backend)]
        return names

    def backend_settings(self, name: str) -> BaseModel:
        table = self.backends.get(name, {})
        if isinstance(table, BaseModel):
            return table
        return backend_class(name).Settings.model_validate(table)

    def tenant(self, tenant_id: str) -> TenantSettings:
        return self.tenants.get(tenant_id) or self.tenants["default"]


# --- loading -----------------------------------------------------------------

_SECTIONS = {
    "server": ServerSettings,
    "auth": AuthSettings,
    "policy": PolicySettings,
    "approvals": ApprovalsSettings,
    "review": ReviewSettings,
    "audit": AuditSettings,
    "egress": EgressSettings,
    "ingress": IngressSettings,
    "state": StateSettings,
    "admission": AdmissionSettings,
    "escape_test": EscapeTestSettings,
    "telemetry": TelemetrySettings,
}


def _parse_env_value(raw: str) -> Any:
    # JSON where it parses (numbers, booleans, lists), else the plain string.
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def _match_suffix(rest: str, keys: list[str]) -> tuple[str, str] | None:
    """Split "<name>_<key>" where key is one of `keys` (keys may contain underscores)."""
    for key in sorted(keys, key=len, reverse=True):
        if rest.endswith("_" + key) and len(rest) > len(key) + 1:
            return rest[: -len(key) - 1], key
    return None


def _apply_env(data: dict[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
    for var, raw in sorted(env.items()):
        if not var.startswith(ENV_PREFIX) or var[len(ENV_PREFIX) :] in NOT_SETTINGS:
            continue
        path = var[len(ENV_PREFIX) :].lower()
        value = _parse_env_value(raw)
        section, _, rest = path.partition("_")
        if section in _SECTIONS and rest:
            if rest not in _SECTIONS[section].model_fields:
                raise SettingsError(f"{var}: unknown key {section}.{rest}")
            data.setdefault(section, {})[rest] = value
        elif section == "backends" and rest:
            if rest == "default":
                data.setdefault("backends", {})["default"] = value
                continue
            names = {n.replace("-", "_"): n for n in REGISTRY}
            for env_name in sorted(names, key=len, reverse=True):
                if rest.startswith(env_name + "_"):
                    key = rest[len(env_name) + 1 :]
                    table = data.setdefault("backends", {}).setdefault(names[env_name], {})
                    table[key] = value
                    break
            else:
                raise SettingsError(f"{var}: no backend named in {rest!r}")
        elif section == "tenants" and rest:
            split = _match_suffix(rest, list(TenantSettings.model_fields))
            if split is None:
                raise SettingsError(f"{var}: unknown tenant key in {rest!r}")
            tenant, key = split
            data.setdefault("tenants", {}).setdefault(tenant, {})[key] = value
        else:
            raise SettingsError(f"{var}: unknown setting")
    return data


def _format_error(exc: ValidationError, prefix: str = "") -> str:
    lines = []
    for err in exc.errors():
        loc = prefix + ".".join(str(p) for p in err["loc"])
        lines.append(f"{loc}: {err['msg']}")
    return "invalid configuration: " + "; ".join(lines)


def load_settings(
    path: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
) -> Settings:
    """Load `path` (or $EXECGATE_CONFIG, or nothing: embedded defaults) plus overrides."""
    env = os.environ if env is None else env
    explicit = path if path is not None else env.get(ENV_PREFIX + "CONFIG")
    data: dict[str, Any] = {}
    if explicit:
        file = Path(explicit)
        try:
            data = tomllib.loads(file.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise SettingsError(f"config file not found: {file}") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise SettingsError(f"config file unreadable: {file}: {exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise SettingsError(f"config file is not valid TOML: {file}: {exc}") from None
    data = _apply_env(data, env)
    try:
        settings = Settings.model_validate(data)
    except ValidationError as exc:
        raise SettingsError(_format_error(exc)) from None
    # Validate each backend's own table now, so its typos fail at start-up too.
    backends = dict(settings.backends)
    for name in settings.enabled_backends():
        try:
            backends[name] = settings.backend_settings(name)
        except ValidationError as exc:
            raise SettingsError(_format_error(exc, prefix=f"backends.{name}.")) from None
        except BackendError as exc:
            raise SettingsError(f"invalid configuration: backends.{name}: {exc}") from None
    settings.backends = backends
    return settings
