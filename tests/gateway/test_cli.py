"""The `execgate` command line, run as a real subprocess."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import jwt
import pytest
from aiohttp.test_utils import TestServer

from gateway.app import create_app
from gateway.audit.log import AuditLog
from gateway.auth.keys import load_or_create_dev_secret
from gateway.settings.model import BUILT_TOOLS_ENV, Settings

EXECGATE = [sys.executable, "-m", "gateway"]


def cli_env(settings: Settings) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("EXECGATE_") or k in BUILT_TOOLS_ENV
    }
    env.update(
        EXECGATE_AUDIT_PATH=settings.audit.path,
        EXECGATE_AUTH_HS256_SECRET_FILE=settings.auth.hs256_secret_file,
        EXECGATE_BACKENDS_DEFAULT="noop",
    )
    return env


async def run_cli(*args: str, env: dict[str, str], stdin: bytes = b"") -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        *EXECGATE,
        *args,
        env=env,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=Path(__file__).resolve().parents[2],
    )
    out, err = await proc.communicate(stdin)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_token_is_signed_with_the_development_key(settings: Settings) -> None:
    code, out, err = await run_cli(
        "token",
        "--tenant",
        "acme",
        "--sub",
        "dev",
        "--scope",
        "exec:python exec:bash",
        "--ttl",
        "30m",
        env=cli_env(settings),
    )
    assert code == 0, err
    secret = load_or_create_dev_secret(Path(settings.auth.hs256_secret_file))
    claims = jwt.decode(out.strip(), secret, algorithms=["HS256"])
    assert (claims["tenant"], claims["sub"]) == ("acme", "dev")
    assert claims["scope"].split() == ["exec:python", "exec:bash"]
    assert 1700 <= claims["exp"] - claims["iat"] <= 1800
    assert oct(Path(settings.auth.hs256_secret_file).stat().st_mode & 0o777) == "0o600"


async def test_audit_verify_detects_tampering(settings: Settings) -> None:
    log = AuditLog(Path(settings.audit.path))
    await log.start()
    for i in range(5):
        await log.append(
            "test.event", request_id=f"r{i}", execution_id=None, tenant="acme", subject="s", n=i
        )
    await log.close()
    env = cli_env(settings)
    code, out, _ = await run_cli("audit", "verify", settings.audit.path, env=env)
    assert code == 0 and "5 records" in out

    lines = Path(settings.audit.path).read_text().splitlines()
    record = json.loads(lines[2])
    record["n"] = 99
    lines[2] = json.dumps(record)
    Path(settings.audit.path).write_text("\n".join(lines) + "\n")
    code, _, err = await run_cli("audit", "verify", settings.audit.path, env=env)
    assert code == 1 and "seq=3" in err


async def test_audit_tail_filters(settings: Settings) -> None:
    log = AuditLog(Path(settings.audit.path))
    await log.start()
    await log.append("a.one", request_id="r", execution_id="exe_1", tenant="acme", subject="s")
    await log.append("b.two", request_id="r", execution_id="exe_2", tenant="acme", subject="s")
    await log.close()
    code, out, err = await run_cli("audit", "tail", "--type", "b.two", env=cli_env(settings))
    assert code == 0, err
    records = [json.loads(line) for line in out.splitlines()]
    assert [r["execution_id"] for r in records] == ["exe_2"]


@pytest.fixture
async def gateway_env(settings: Settings) -> AsyncIterator[dict[str, str]]:
    """A real gateway on loopback, and the environment a CLI needs to talk to it."""
    server = TestServer(create_app(settings), host="127.0.0.1")
    await server.start_server()
    env = {k: v for k, v in cli_env(settings).items() if k != "EXECGATE_BACKENDS_DEFAULT"}
    env["EXECGATE_URL"] = str(server.make_url("/"))
    env["EXECGATE_STATE_PATH"] = settings.state.path
    env["EXECGATE_APPROVALS_SIGNING_KEY_FILE"] = settings.approvals.signing_key_file
    try:
        yield env
    finally:
        await server.close()


@pytest.mark.integration
async def test_exec_prints_output_and_exits_with_the_code_status(
    gateway_env: dict[str, str], tmp_path: Path
) -> None:
    env = gateway_env
    script = tmp_path / "script.sh"
    script.write_text("echo hello; echo oops >&2; exit 3\n")
    code, out, err = await run_cli("exec", "--lang", "bash", str(script), env=env)
    assert (code, out, err) == (3, "hello\n", "oops\n")
    code, out, _ = await run_cli("exec", "--lang", "python", "-", env=env, stdin=b"print(2+2)\n")
    assert (code, out) == (0, "4\n")
    code, _, err = await run_cli(
        "exec", "--lang", "python", "--token", "bad", "-", env=env, stdin=b"print(1)"
    )
    assert code == 125 and "unauthenticated" in err


@pytest.mark.integration
async def test_held_exec_waits_for_an_approval_given_on_the_cli(
    gateway_env: dict[str, str],
) -> None:
    env = gateway_env
    code = b"import ctypes\nprint('native', ctypes.sizeof(ctypes.c_long))\n"
    held = asyncio.ensure_future(run_cli("exec", "--lang", "python", "-", env=env, stdin=code))
    listing = ""
    for _ in range(100):
        rc, listing, err = await run_cli("approvals", "list", "--json", env=env)
        assert rc == 0, err
        if json.loads(listing):
            break
        await asyncio.sleep(0.1)
    (pending,) = json.loads(listing)
    rc, out, err = await run_cli(
        "approvals", "approve", pending["approval_id"], "--reason", "ok", env=env
    )
    assert rc == 0 and "approved" in out, err
    rc, out, err = await asyncio.wait_for(held, 60)
    assert (rc, out) == (0, "native 8\n"), err
    assert "held for approval" in err


@pytest.mark.integration
async def test_exec_prints_output_as_it_arrives(
    gateway_env: dict[str, str], settings: Settings
) -> None:
    code = (
        b"import sys, time\nprint('first', flush=True)\n"
        b"print('warn', file=sys.stderr, flush=True)\ntime.sleep(3)\nprint('second')\n"
    )
    proc = await asyncio.create_subprocess_exec(
        *EXECGATE,
        "exec",
        "--lang",
        "python",
        "-",
        env=gateway_env,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    proc.stdin.write(code)
    proc.stdin.close()
    first = await asyncio.wait_for(proc.stdout.readline(), 60)
    warn = await asyncio.wait_for(proc.stderr.readline(), 60)
    # In hand while the program still runs: its execution has not finished.
    records = [json.loads(x) for x in Path(settings.audit.path).read_text().splitlines()]
    started = {r["execution_id"] for r in records if r["type"] == "execution.started"}
    finished = {r["execution_id"] for r in records if r["type"] == "execution.finished"}
    assert (first, warn) == (b"first\n", b"warn\n") and started - finished
    rest = await asyncio.wait_for(proc.stdout.read(), 60)
    assert await proc.wait() == 0 and rest == b"second\n"
