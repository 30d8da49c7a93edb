"""`execgate policy replay` and `policy eval` against decisions a real gateway made.

A gateway (embedded engine, the shipped policy, the no-op backend: the decisions are
what matters) serves an allowed, a denied and a held request; the kept inputs are
masked as OPA's decision log is (no code, no secret-looking claims); then candidate
policy directories, edited copies of policies/, are replayed through the real CLI.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from gateway import cli
from gateway.app import create_app
from gateway.appkeys import SERVICES
from gateway.policy.inputs import decision_inputs_path, read_kept
from gateway.policy.replay import opa_decision_log
from gateway.settings.model import Settings
from tests.gateway.conftest import REPO, auth, make_settings

SECRET_CODE = "print('SECRET-IN-THE-CODE-1234')"
SECRET_CLAIM = "claim-secret-value-5678"


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return make_settings(tmp_path, EXECGATE_BACKENDS_DEFAULT="noop")


@pytest.fixture
async def client(aiohttp_client: Any, settings: Settings) -> TestClient:
    return await aiohttp_client(create_app(settings))


def _config(tmp_path: Path, settings: Settings) -> Path:
    path = tmp_path / "execgate.toml"
    path.write_text(
        f'[state]\npath = "{settings.state.path}"\n[policy]\npath = "{settings.policy.path}"\n'
    )
    return path


async def _run_cli(capsys: pytest.CaptureFixture[str], config: str, *argv: str) -> tuple[int, str]:
    # The CLI runs its own event loop: give it a thread of its own.
    code = await asyncio.to_thread(cli.main, ["--config", config, *argv])
    return code, capsys.readouterr().out


def _candidate(tmp_path: Path, name: str, edit: Callable[[Path], None]) -> Path:
    target = tmp_path / name
    shutil.copytree(REPO / "policies", target)
    edit(target)
    return target


def _replace(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, (path, old)
    path.write_text(text.replace(old, new))


async def _serve_three(client: TestClient, token: Callable[..., str], settings: Settings) -> None:
    tok = token(scopes="exec:python", api_key=SECRET_CLAIM)
    runs = [
        ({"language": "python", "code": SECRET_CODE}, 200),
        (
            {
                "language": "python",
                "code": "print(1)",
                "network": {"egress": ["api.example.com:443"]},
            },
            403,
        ),
        ({"language": "python", "code": "import ctypes"}, 202),
    ]
    for body, status in runs:
        resp = await client.post("/v1/executions", json=body, headers=auth(tok))
        assert resp.status == status, await resp.text()
    inputs = client.app[SERVICES].decision_inputs
    assert inputs is not None
    await inputs.flush()
    assert inputs.written == 3 and inputs.dropped == 0


async def test_kept_inputs_are_masked_like_the_opa_decision_log(
    client: TestClient, token: Callable[..., str], settings: Settings
) -> None:
    await _serve_three(client, token, settings)
    path = decision_inputs_path(settings)
    kept = list(read_kept(path))
    assert [k.decided["allow"] for k in kept] == [True, False, False]
    assert kept[2].decided["require_approval"] is True
    for k in kept:
        assert "code" not in k.input["execution"]
        assert k.input["execution"]["code_sha256"]
        assert "api_key" not in k.input["subject"]["claims"]
        assert k.execution_id and k.execution_id.startswith("exe_")
    assert path.stat().st_mode & 0o777 == 0o600
    # Nowhere in the file, not even in a free page or the WAL.
    raw = b"".join(p.read_bytes() for p in path.parent.glob(path.name + "*"))
    assert SECRET_CODE.encode() not in raw and SECRET_CLAIM.encode() not in raw
    # The same decision ids as the audit log's policy.decided records.
    with sqlite3.connect(path) as db:
        ids = {r[0] for r in db.execute("SELECT decision_id FROM decision_inputs")}
    assert len(ids) == 3


async def test_replay_reports_what_a_candidate_changes_and_gates_on_new_allows(
    client: TestClient,
    token: Callable[..., str],
    settings: Settings,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    await _serve_three(client, token, settings)
    config = str(_config(tmp_path, settings))

    same = _candidate(tmp_path, "same", lambda d: None)
    code, out = await _run_cli(capsys, config, "policy", "replay", "--policy", str(same), "--json")
    report = json.loads(out)
    assert code == 0 and report["evaluated"] == 3 and report["unchanged"] == 3, report

    # Egress without the scope: the denied request would now be allowed.
    def open_egress(d: Path) -> None:
        _replace(d / "egress.rego", 'not v.scopes["net:egress"]', 'v.scopes["never-held"]')

    loose = _candidate(tmp_path, "loose", open_egress)
    code, out = await _run_cli(capsys, config, "policy", "replay", "--policy", str(loose), "--json")
    report = json.loads(out)
    assert code == 1 and report["failed"], report
    assert report["counts"]["newly_allowed"] == 1
    (example,) = report["examples"]["newly_allowed"]
    assert (example["before"], example["after"]) == ("deny", "allow")

    # Native code no longer needs a person: an approval dropped, not a failure.
    def no_approval(d: Path) -> None:
        data = json.loads((d / "tenants" / "data.json").read_text())
        data["default"]["approval"]["features"] = []
        (d / "tenants" / "data.json").write_text(json.dumps(data))

    eased = _candidate(tmp_path, "eased", no_approval)
    code, out = await _run_cli(capsys, config, "policy", "replay", "--policy", str(eased))
    assert code == 0, out
    assert "approval_dropped" in out and "result: ok" in out

    # Python denied for everyone: two allows/holds become denials; text report names them.
    def no_python(d: Path) -> None:
        data = json.loads((d / "tenants" / "data.json").read_text())
        data["default"]["languages"] = ["bash"]
        (d / "tenants" / "data.json").write_text(json.dumps(data))

    strict = _candidate(tmp_path, "strict", no_python)
    code, out = await _run_cli(
        capsys, config, "policy", "replay", "--policy", str(strict), "--json"
    )
    report = json.loads(out)
    assert code == 0 and report["counts"]["newly_denied"] == 2, report
    reasons = [r for ex in report["examples"]["newly_denied"] for r in ex["detail"]]
    assert any("language python is not allowed" in r for r in reasons), reasons

    # --tenant narrows to one tenant's decisions.
    code, out = await _run_cli(
        capsys, config, "policy", "replay", "--policy", str(strict), "--tenant", "nobody", "--json"
    )
    assert code == 0 and json.loads(out)["evaluated"] == 0

    # A candidate that does not compile is a usage error, not a pass.
    broken = _candidate(
        tmp_path, "broken", lambda d: (d / "oops.rego").write_text("package execgate\nx := {")
    )
    code, _ = await _run_cli(capsys, config, "policy", "replay", "--policy", str(broken))
    assert code == 2


async def test_eval_prints_the_decision_with_its_reasons(
    client: TestClient,
    token: Callable[..., str],
    settings: Settings,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    await _serve_three(client, token, settings)
    config = str(_config(tmp_path, settings))
    kept = list(read_kept(decision_inputs_path(settings)))

    code, out = await _run_cli(
        capsys, config, "policy", "eval", "--execution", kept[1].execution_id or ""
    )
    assert code == 0
    assert out.startswith("decision: deny")
    assert "needs scope net:egress" in out

    held = tmp_path / "held.json"
    held.write_text(json.dumps({"input": kept[2].input}))
    code, out = await _run_cli(capsys, config, "policy", "eval", str(held))
    assert code == 0 and out.startswith("decision: hold") and "approval required" in out

    code, out = await _run_cli(capsys, config, "policy", "eval", str(held), "--json")
    assert code == 0 and json.loads(out)["require_approval"] is True

    code, _ = await _run_cli(capsys, config, "policy", "eval", "--execution", "exe_absent")
    assert code == 2


def test_opa_decision_log_entries_are_read(tmp_path: Path) -> None:
    entry = {
        "msg": "Decision Log",
        "decision_id": "4ca636c1-55e4-417a-b1d8-4aceb67960d1",
        "path": "execgate/decision",
        "input": {"tenant": {"id": "acme"}, "execution": {"language": "python"}},
        "result": {"allow": False, "deny": ["no"], "require_approval": False},
    }
    log = tmp_path / "opa.log"
    log.write_text(
        "not json\n"
        + json.dumps({"msg": "Received request.", "path": "/v1/data"})
        + "\n"
        + json.dumps(entry)
        + "\n"
    )
    (kept,) = list(opa_decision_log(log))
    assert kept.decision_id == entry["decision_id"] and kept.tenant == "acme"
    assert kept.decided["deny"] == ["no"] and kept.engine == "opa"
    assert not list(opa_decision_log(log, tenant="other"))
