"""The console's chain status: incremental, honest about breaks, patient with a half
written last line, and starting over when the file is replaced."""

from __future__ import annotations

import os
from pathlib import Path

from gateway.audit.log import AuditLog
from gateway.console.chain import ChainStatus


async def write(path: Path, n: int) -> None:
    log = AuditLog(path, flush_interval_ms=1)
    await log.start()
    for i in range(n):
        await log.append("execution.finished", tenant="acme", execution_id=f"exe_{i}")
    await log.close()


async def test_appended_records_are_verified_and_a_break_stays_reported(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    status = ChainStatus()
    assert await status.check(str(path), wait_s=60) == (None, True)
    await write(path, 3)
    # A page does not wait for a long verification: it is told one is under way.
    slow = ChainStatus()
    assert await slow.check(str(path), wait_s=0) == (None, False)
    later, current = await slow.check(str(path), wait_s=60)
    assert current and later is not None and later.ok
    report, _ = await status.check(str(path), wait_s=60)
    assert report is not None and report.ok
    first = report.records
    await write(path, 2)  # the writer reopens and continues the chain
    report, _ = await status.check(str(path), wait_s=60)
    assert report is not None and report.ok and report.records == first + 2
    assert status.point.offset == path.stat().st_size

    # Half a line at the end is a write in progress, not a break.
    with path.open("ab") as f:
        f.write(b'{"seq":')
    report, _ = await status.check(str(path), wait_s=60)
    assert report is not None and report.ok and report.records == first + 2

    # An edited record in the middle, in a new file: found, and stays found.
    lines = path.read_bytes().splitlines(keepends=True)[:-1]
    lines[1] = lines[1].replace(b"exe_1", b"exe_X")
    edited = tmp_path / "edited.jsonl"
    edited.write_bytes(b"".join(lines))
    os.replace(edited, path)
    report, _ = await status.check(str(path), wait_s=60)
    assert report is not None and not report.ok
    assert report.first_bad_seq == 2 and "hash mismatch" in report.reason
    await write(path, 1)
    again, _ = await status.check(str(path), wait_s=60)
    assert again is not None and not again.ok and again.first_bad_seq == 2
