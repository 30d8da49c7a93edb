"""A sandbox that is no sandbox is never sound: it runs nothing, its interpreter
exits before the probe, it refuses every run, or its probes all find nothing to
try. Through the runner, the command line (real subprocess) and the self-test."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient

from gateway.appkeys import SERVICES
from gateway.escape.catalog.index import techniques
from gateway.escape.runner import run_suite
from gateway.escape.technique import Outcome
from gateway.settings.model import Settings
from tests.backends.conftest import require_root
from tests.gateway.conftest import auth
from tests.gateway.escape.broken import BROKEN, Broken, SaysNotApplicable, SeesNothing
from tests.gateway.test_cli import cli_env

ADMIN = "admin:escape-test"
REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("broken", BROKEN, ids=lambda c: c.name)
async def test_no_broken_backend_is_contained_or_sound(broken: type[Broken]) -> None:
    require_root()  # the host canaries (a file under /root, SysV IPC of the host)
    backend = broken()
    result = await run_suite(backend)
    everything = len(techniques())
    assert backend.runs >= everything  # every technique was tried, none skipped
    assert result.count(Outcome.ERROR) == everything, result.problems
    assert result.count(Outcome.CONTAINED) == result.count(Outcome.NOT_APPLICABLE) == 0
    assert not result.sound
    assert result.problems == [f"errors: {', '.join(t.id for t in techniques())}"]


async def test_attempts_missing_from_their_records_are_not_sound() -> None:
    # Contained is not enough where capture is on: what the sandbox stopped must
    # also be in the record of the execution that tried it.
    require_root()
    chosen = [t for t in techniques() if t.category in ("host_files", "posture", "kernel")]
    result = await run_suite(SeesNothing(), chosen)
    assert result.count(Outcome.CONTAINED) == len(chosen)
    expected = [t.id for t in chosen if t.expected]
    assert expected and len(expected) < len(chosen)  # posture tries nothing recordable
    assert result.problems == [f"not in their behaviour record: {', '.join(expected)}"]
    assert not result.sound
    # Where capture is off nothing can be asked of the record.
    blind = SeesNothing()
    blind.recorded_kinds = frozenset  # type: ignore[method-assign]
    assert (await run_suite(blind, chosen)).sound


async def test_not_applicable_past_the_ceiling_is_not_sound() -> None:
    require_root()
    chosen = techniques()[:6]
    result = await run_suite(SaysNotApplicable(), chosen)
    # The probes' own reason, and no backend gets a ceiling it did not declare.
    assert {f.verdict.detail for f in result.findings} == {"nothing here"}
    assert result.count(Outcome.NOT_APPLICABLE) == 6 and result.max_not_applicable == 0
    assert result.problems == ["6 not applicable, more than the 0 allowed"]
    at_ceiling = await run_suite(SaysNotApplicable(), chosen, max_not_applicable=6)
    assert at_ceiling.sound, at_ceiling.problems
    assert not (await run_suite(SaysNotApplicable(), chosen, max_not_applicable=5)).sound


def registered(backend: type[Broken]) -> list[str]:
    """`execgate` with one test backend added to its registry (a real subprocess)."""
    entry = (f"{backend.__module__}:{backend.__name__}", "")
    return [sys.executable, "-c",
            "import sys; from backends import REGISTRY; "
            f"REGISTRY[{backend.name!r}] = {entry!r}; "
            "from gateway.cli import main; sys.exit(main())"]  # fmt: skip


async def run(argv: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    import asyncio

    proc = await asyncio.create_subprocess_exec(
        *argv, env=env, cwd=REPO, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


@pytest.mark.parametrize("broken", [*BROKEN, SaysNotApplicable], ids=lambda c: c.name)
async def test_the_command_fails_a_broken_backend(broken: type[Broken], settings: Settings) -> None:
    argv = [*registered(broken), "escape-test", "--backend", broken.name, "--json"]
    code, out, err = await run(argv, cli_env(settings))
    assert code == 1, err
    report = json.loads(out)
    assert report["sound"] is False and report["problems"], report["counts"]
    assert report["counts"]["contained"] == report["counts"]["escaped"] == 0
    # The table's summary line says why, on the terminal too.
    code, out, err = await run(argv[:-1], cli_env(settings))
    assert code == 1
    assert "NOT SOUND" in out.splitlines()[-1] and "NOT SOUND" in err


def nsjail_config(tmp_path: Path, state_dir: Path, runtimes: str) -> Path:
    uid = 150000 + os.getpid() % 9000
    path = tmp_path / "execgate.toml"
    path.write_text(
        f'[backends.nsjail]\nstate_dir = "{state_dir}"\nsandbox_uid = {uid}\n'
        f"sandbox_gid = {uid}\nwarm_pool_size = 0\nruntimes = {runtimes}\n"
    )
    return path


@pytest.mark.integration
@pytest.mark.parametrize(
    "runtimes",
    [
        # Every runtime runs nothing.
        '{ python = { argv = ["/bin/true"], filename = "main.py" }, '
        'bash = { argv = ["/bin/true"], filename = "main.sh" } }',
        # Python (and bash) start, then exit before the program: -c ignores the file.
        '{ python = { argv = ["/usr/bin/python3", "-I", "-c", "print(1)"], filename = "main.py" }, '
        'bash = { argv = ["/bin/bash", "-c", "echo hi"], filename = "main.sh" } }',
    ],
    ids=["bin-true", "exits-early"],
)
async def test_a_real_nsjail_that_runs_no_probe_is_not_sound(
    runtimes: str, settings: Settings, tmp_path: Path, escape_state_dir: Path
) -> None:
    config = nsjail_config(tmp_path, escape_state_dir, runtimes)
    argv = [sys.executable, "-m", "gateway", "--config", str(config)]
    code, out, err = await run([*argv, "escape-test", "--backend", "nsjail", "--json"],
                               cli_env(settings))  # fmt: skip
    assert code == 1, err[-2000:]
    report = json.loads(out)
    assert report["counts"] == {"contained": 0, "escaped": 0, "not_applicable": 0,
                                "error": len(techniques())}, report["problems"]  # fmt: skip
    assert not report["sound"]


@pytest.mark.integration
@pytest.mark.parametrize("broken", [*BROKEN, SaysNotApplicable], ids=lambda c: c.name)
async def test_the_self_test_takes_a_broken_backend_out_of_service(
    broken: type[Broken], client: TestClient, token: Callable[..., str]
) -> None:
    svc = client.server.app[SERVICES]
    svc.backends[broken.name] = broken()
    try:
        resp = await client.post(
            f"/v1/admin/escape-test?backend={broken.name}", headers=auth(token(scopes=ADMIN))
        )
        body = await resp.json()
        assert resp.status == 200, body
        (result,) = body["results"]
        assert result["sound"] is False and result["counts"]["contained"] == 0
        held = svc.out_of_service[broken.name]
        assert held.startswith("escape self-test: ") and result["problems"][0] in held
        records = [
            json.loads(line) for line in Path(svc.settings.audit.path).read_text().splitlines()
        ]
        (audited,) = [r for r in records if r["type"] == "sandbox.selftest"]
        assert audited["backend"] == broken.name and audited["sound"] is False
        assert audited["out_of_service"] is True and audited["problems"] == result["problems"]
        ready = await client.get("/readyz")
        assert ready.status == 503
        assert (
            "out of service" in (await ready.json())["checks"][f"backend:{broken.name}"]["detail"]
        )
    finally:
        del svc.backends[broken.name]
