"""deploy/k8s: every manifest passes the Kubernetes 1.37 schema (strict: unknown fields
fail), and the properties the deployment promises hold."""

from __future__ import annotations

import copy
from typing import Any

import kubernetes_validate
import pytest
import yaml

from gateway.settings.model import load_settings
from tests.deploy.manifests import DEPLOY, K8S, k8s_documents
from tests.deploy.test_example_config import EXAMPLE

VERSION = "1.37.0"


def by_kind(kind: str) -> list[dict[str, Any]]:
    return [doc for _, doc in k8s_documents() if doc["kind"] == kind]


def gateway_pod() -> dict[str, Any]:
    [deployment] = [d for d in by_kind("Deployment") if d["metadata"]["name"] == "execgate-gateway"]
    return deployment["spec"]["template"]["spec"]


def test_every_kustomization_file_exists_and_is_listed() -> None:
    listed = set(yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"])
    on_disk = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == on_disk


@pytest.mark.parametrize("name,doc", k8s_documents(), ids=lambda v: v if isinstance(v, str) else "")
def test_manifest_passes_the_schema(name: str, doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, VERSION, strict=True)


def test_the_validator_rejects_a_misspelt_field() -> None:
    doc = copy.deepcopy(by_kind("Deployment")[0])
    doc["spec"]["template"]["spec"]["containers"][0]["securityContxt"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, VERSION, strict=True)


def test_gateway_env_names_real_settings() -> None:
    env = {e["name"]: e["value"] for e in gateway_pod()["containers"][0]["env"]}
    settings = load_settings(EXAMPLE, env=env)  # an unknown name would raise
    assert settings.policy.engine == "opa"
    assert settings.state.backend == "redis"


def test_shutdown_grace_fits_in_the_termination_grace_period() -> None:
    grace = load_settings(EXAMPLE, env={}).server.shutdown_grace_s
    pre_stop = gateway_pod()["containers"][0]["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    assert gateway_pod()["terminationGracePeriodSeconds"] > grace + float(pre_stop[1])


def test_probes_use_readyz_and_healthz() -> None:
    gateway = gateway_pod()["containers"][0]
    assert gateway["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert gateway["livenessProbe"]["httpGet"]["path"] == "/healthz"


def test_every_other_container_meets_the_restricted_profile() -> None:
    for deployment in by_kind("Deployment"):
        for container in deployment["spec"]["template"]["spec"]["containers"]:
            if container["name"] == "gateway":
                continue
            ctx = container["securityContext"]
            assert ctx["runAsNonRoot"] and not ctx["allowPrivilegeEscalation"], container["name"]
            assert ctx["capabilities"]["drop"] == ["ALL"], container["name"]
            assert ctx["seccompProfile"]["type"] == "RuntimeDefault", container["name"]
            assert ctx["readOnlyRootFilesystem"], container["name"]
            assert "limits" in container["resources"], container["name"]


def test_opa_sidecar_is_only_on_loopback_and_logs_decisions() -> None:
    [opa] = [c for c in gateway_pod()["containers"] if c["name"] == "opa"]
    assert "--addr=127.0.0.1:8181" in opa["args"]
    [config_map] = by_kind("ConfigMap")
    config = yaml.safe_load(config_map["data"]["config.yaml"])
    shipped = yaml.safe_load((DEPLOY / "opa" / "config.yaml").read_text())
    # The same configuration as deploy/opa/config.yaml, but for where the bundles come from.
    assert config["bundles"] == shipped["bundles"]
    assert config["decision_logs"] == shipped["decision_logs"]
    assert config["decision_logs"]["mask_decision"] == "/system/log/mask"


def test_network_policy_denies_egress_but_redis_and_dns() -> None:
    [policy] = [p for p in by_kind("NetworkPolicy") if p["metadata"]["name"] == "execgate-gateway"]
    assert set(policy["spec"]["policyTypes"]) == {"Ingress", "Egress"}
    ports = {
        (port["protocol"], port["port"])
        for rule in policy["spec"]["egress"]
        for port in rule["ports"]
    }
    assert ports == {("TCP", 6379), ("UDP", 53), ("TCP", 53)}
    assert all(rule.get("to") for rule in policy["spec"]["egress"])  # never "anywhere"


def test_gvisor_runtime_class_and_pod_security() -> None:
    [runtime] = by_kind("RuntimeClass")
    assert runtime["handler"] == "runsc"
    [namespace] = by_kind("Namespace")
    labels = namespace["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/warn"] == "restricted"
    assert labels["pod-security.kubernetes.io/audit"] == "restricted"
    assert not gateway_pod()["automountServiceAccountToken"]
