"""`execgate audit tail` filters by tenant, type, execution id and time, combined."""

from __future__ import annotations

import json
from pathlib import Path

from gateway.audit.log import AuditLog
from gateway.settings.model import Settings
from tests.gateway.test_cli import cli_env, run_cli


async def test_tail_filters_combine(settings: Settings) -> None:
    log = AuditLog(Path(settings.audit.path))
    await log.start()
    first = await log.append("execution.started", execution_id="exe_1", tenant="acme")
    await log.append("execution.started", execution_id="exe_2", tenant="globex")
    await log.append("execution.finished", execution_id="exe_1", tenant="acme")
    await log.append("execution.started", execution_id="exe_3", tenant="acme")
    await log.close()

    async def tail(*args: str) -> list[tuple[str, str]]:
        code, out, err = await run_cli("audit", "tail", *args, env=cli_env(settings))
        assert code == 0, err
        return [(r["type"], r["execution_id"]) for r in map(json.loads, out.splitlines())]

    assert await tail("--tenant", "globex") == [("execution.started", "exe_2")]
    assert await tail("--execution-id", "exe_1") == [
        ("execution.started", "exe_1"),
        ("execution.finished", "exe_1"),
    ]
    assert await tail("--tenant", "acme", "--type", "execution.started") == [
        ("execution.started", "exe_1"),
        ("execution.started", "exe_3"),
    ]
    # Everything at or after the first record's timestamp; nothing from the future.
    assert len(await tail("--since", first["ts"])) == 4
    assert await tail("--since", "2999-01-01T00:00:00Z") == []
