"""deploy/compose.yaml: parsed and validated by a Compose-spec parser (compose_spec, the
Rust library's bindings: unknown keys and malformed values fail), plus the promises."""

from __future__ import annotations

from typing import Any

import yaml
from compose_spec import PyCompose

from gateway.settings.model import load_settings
from tests.deploy.manifests import COMPOSE, DEPLOY, compose_text, seconds
from tests.deploy.test_example_config import EXAMPLE


def compose() -> dict[str, Any]:
    return yaml.safe_load(compose_text())


def test_the_compose_file_passes_the_compose_spec() -> None:
    parsed = PyCompose.from_yaml(compose_text())
    parsed.validate()
    assert set(parsed.service_names()) == {"gateway", "opa", "redis", "bundles"}


def test_the_parser_rejects_a_misspelt_key() -> None:
    broken = compose_text().replace("stop_grace_period:", "stop_grace_periode:")
    try:
        PyCompose.from_yaml(broken)
    except ValueError as exc:
        assert "stop_grace_periode" in str(exc)
    else:
        raise AssertionError("a misspelt key was accepted")


def test_gateway_env_names_real_settings() -> None:
    env = compose()["services"]["gateway"]["environment"]
    settings = load_settings(EXAMPLE, env=env)
    assert settings.policy.opa_url == "http://opa:8181"
    assert settings.state.redis_url.startswith("redis://redis:")


def test_stop_grace_period_outlasts_the_shutdown_grace() -> None:
    grace = load_settings(EXAMPLE, env={}).server.shutdown_grace_s
    assert seconds(compose()["services"]["gateway"]["stop_grace_period"]) > grace


def test_only_the_gateway_reaches_the_engine_socket() -> None:
    services = compose()["services"]
    holders = [
        name
        for name, service in services.items()
        for volume in service.get("volumes", [])
        if "docker.sock" in volume
    ]
    assert holders == ["gateway"]


def test_files_and_volumes_it_names_exist() -> None:
    doc = compose()
    declared = set(doc["volumes"])
    for service in doc["services"].values():
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            if source.startswith("."):
                assert (COMPOSE.parent / source).exists(), source
            elif not source.startswith("/"):
                assert source in declared, source
    assert (DEPLOY / "opa" / "config.yaml").exists()


def test_secrets_are_files_never_environment_values() -> None:
    env = compose()["services"]["gateway"]["environment"]
    for name, value in env.items():
        if any(word in name for word in ("SECRET", "KEY", "TOKEN", "PASSWORD")):
            assert name.endswith("_FILE") and str(value).startswith("/"), name


def test_opa_logs_decisions_and_reads_the_shipped_config() -> None:
    opa = compose()["services"]["opa"]
    assert "--config-file=/config/config.yaml" in opa["command"]
    assert any(v.startswith("./opa/config.yaml:") for v in opa["volumes"])
    assert compose()["services"]["gateway"]["depends_on"]["opa"]["condition"] == "service_healthy"
