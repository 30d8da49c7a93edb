from pathlib import Path

import pytest

from gateway.settings.model import SettingsError, load_settings


def test_embedded_defaults_without_a_file() -> None:
    s = load_settings(env={})
    assert (s.server.host, s.server.port) == ("127.0.0.1", 8080)
    assert s.policy.engine == "embedded"
    assert s.default_backend == "nsjail"
    assert s.audit.path == "var/audit.jsonl"
    assert s.state.backend == "sqlite"
    assert "default" in s.tenants


def test_file_and_env_overrides(tmp_path: Path) -> None:
    cfg = tmp_path / "execgate.toml"
    cfg.write_text(
        '[server]\nport = 9000\n[backends]\ndefault = "noop"\n'
        "[tenants.acme]\nrate_per_s = 5\nmax_concurrent = 2\n"
    )
    s = load_settings(
        cfg,
        env={
            "EXECGATE_SERVER_PORT": "9100",
            "EXECGATE_TENANTS_ACME_MEMORY_MB": "128",
            "EXECGATE_POLICY_TIMEOUT_MS": "50",
        },
    )
    assert s.server.port == 9100
    assert s.default_backend == "noop"
    acme = s.tenant("acme")
    assert (acme.rate_per_s, acme.max_concurrent, acme.memory_mb) == (5, 2, 128)
    assert s.tenant("unknown") is s.tenants["default"]
    assert s.policy.timeout_ms == 50


def test_config_path_from_environment(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text("[server]\nport = 7000\n")
    assert load_settings(env={"EXECGATE_CONFIG": str(cfg)}).server.port == 7000


@pytest.mark.parametrize(
    ("toml", "env", "needle"),
    [
        ("[server]\nprot = 1\n", {}, "server.prot"),
        ("[server]\nport = 'abc'\n", {}, "server.port"),
        ("[nonsense]\nx = 1\n", {}, "nonsense"),
        ("[tenants.acme]\nmemroy_mb = 1\n", {}, "tenants.acme.memroy_mb"),
        ("[backends]\ndefault = 'qemu'\n", {}, "qemu"),
        (
            "[backends]\ndefault = 'noop'\n[backends.noop]\nlanguage = ['x']\n",
            {},
            "backends.noop.language",
        ),
        ("[policy]\nengine = 'magic'\n", {}, "policy.engine"),
        ("", {"EXECGATE_SERVER_PROT": "1"}, "EXECGATE_SERVER_PROT"),
        ("", {"EXECGATE_NOPE_X": "1"}, "EXECGATE_NOPE_X"),
        ("", {"EXECGATE_SERVER_PORT": "x"}, "server.port"),
        ("[server\n", {}, "not valid TOML"),
    ],
)
def test_bad_configuration_names_the_key(
    tmp_path: Path, toml: str, env: dict[str, str], needle: str
) -> None:
    cfg = tmp_path / "execgate.toml"
    cfg.write_text(toml)
    with pytest.raises(SettingsError, match=needle.replace(".", r"\.").replace("[", r"\[")):
        base = {} if "backends" in toml else {"EXECGATE_BACKENDS_DEFAULT": "noop"}
        load_settings(cfg, env={**base, **env})


def test_missing_explicit_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="not found"):
        load_settings(tmp_path / "absent.toml", env={})
