"""The audit writer: chain, durability, group commit, failures, restart."""

from __future__ import annotations

import asyncio
import json
import os
import re
import stat
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.audit.chain import GENESIS_HASH, canonical_json, verify_file
from gateway.audit.log import AuditCorrupt, AuditLog, AuditUnavailable
from tests.components import missing_component

TS = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z")


class FsyncCounter:
    """Real fsync, counted; remembers the highest seq on disk at each fsync."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.calls = 0
        self.synced_seq = 0

    def __call__(self, fd: int) -> None:
        os.fsync(fd)
        self.calls += 1
        lines = self.path.read_bytes().splitlines()
        self.synced_seq = json.loads(lines[-1])["seq"] if lines else 0


def lines_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_bytes().splitlines()]


async def test_first_record_fields_and_file_modes(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "audit.jsonl"
    audit = AuditLog(path)
    await audit.start()
    record = await audit.append(
        "request.received", request_id="req_1", tenant="acme", method="POST", size=12
    )
    await audit.close()

    assert record["seq"] == 1
    assert record["prev_hash"] == GENESIS_HASH
    assert TS.fullmatch(record["ts"])
    assert record["execution_id"] is None and record["subject"] is None
    assert record["request_id"] == "req_1" and record["method"] == "POST"
    assert re.fullmatch(r"[0-9a-f]{64}", record["hash"])
    assert path.read_bytes() == canonical_json(record) + b"\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "a").stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "a" / "b").stat().st_mode) == 0o700


async def test_chain_continues_across_restart(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    first = AuditLog(path)
    await first.start()
    for i in range(3):
        await first.append("test.event", n=i)
    last = await first.append("test.event", n=3)
    await first.close()

    second = AuditLog(path)
    await second.start()
    assert second.last_seq == 4 and second.last_hash == last["hash"]
    resumed = await second.append("test.event", n=4)
    await second.close()

    assert resumed["seq"] == 5 and resumed["prev_hash"] == last["hash"]
    report = verify_file(path)
    assert report.ok and report.records == 5, report


async def test_concurrent_appends_share_fsyncs(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    counter = FsyncCounter(path)
    audit = AuditLog(path, fsync=counter)
    await audit.start()

    async def one(i: int) -> dict:
        record = await audit.append("test.event", n=i, tenant=f"t{i % 7}")
        # Acknowledged only once an fsync covered it.
        assert record["seq"] <= counter.synced_seq
        return record

    records = await asyncio.gather(*(one(i) for i in range(500)))
    await audit.close()

    assert sorted(r["seq"] for r in records) == list(range(1, 501))
    assert [r["seq"] for r in lines_of(path)] == list(range(1, 501))
    report = verify_file(path)
    assert report.ok and report.records == 500, report
    assert counter.calls <= 10, f"{counter.calls} fsyncs for 500 concurrent appends"
    assert audit.fsyncs == counter.calls


async def test_waves_of_appends_while_fsync_runs(tmp_path: Path) -> None:
    """Appends arriving during an fsync are batched into the next one."""
    path = tmp_path / "audit.jsonl"
    counter = FsyncCounter(path)
    audit = AuditLog(path, flush_interval_ms=0, fsync=counter)
    await audit.start()

    async def producer(p: int) -> None:
        for i in range(25):
            record = await audit.append("test.event", producer=p, n=i)
            assert record["seq"] <= counter.synced_seq

    await asyncio.gather(*(producer(p) for p in range(20)))
    await audit.close()
    assert verify_file(path).records == 500
    # Each producer waits for its own record, so a batch holds up to 20 of them.
    assert counter.calls < 500 / 2, counter.calls


async def test_a_queued_record_goes_with_the_next_one_submitted(tmp_path: Path) -> None:
    """`queue` starts no fsync of its own: the record waits for the next one that
    does (a request's decision before its start), and they share one, in order."""
    path = tmp_path / "audit.jsonl"
    counter = FsyncCounter(path)
    audit = AuditLog(path, flush_interval_ms=0, fsync=counter)
    await audit.start()
    queued = audit.queue("policy.decided", request_id="req_1")
    for _ in range(20):
        await asyncio.sleep(0)  # the writer has every chance to take it alone
    started = await audit.submit("execution.started", request_id="req_1")
    decided = await queued
    assert (decided["seq"], started["seq"]) == (1, 2)
    assert counter.calls == 1 and counter.synced_seq == 2
    # kick: what is queued goes now, without a record of its own.
    finished = audit.queue("execution.finished", request_id="req_1")
    audit.kick()
    assert (await finished)["seq"] == 3 and counter.calls == 2
    await audit.close()
    assert verify_file(path).records == 3


async def test_a_queued_record_alone_is_not_left_behind(tmp_path: Path) -> None:
    """Nothing else comes (the request ended another way): the queued record goes
    on its own shortly, and a closing log writes it too."""
    path = tmp_path / "audit.jsonl"
    audit = AuditLog(path, flush_interval_ms=0)
    await audit.start()
    async with asyncio.timeout(30):
        assert (await audit.queue("policy.decided"))["seq"] == 1
    last = audit.queue("policy.decided")
    await audit.close()
    assert (await last)["seq"] == 2
    assert verify_file(path).records == 2


async def test_one_requests_records_do_not_make_the_log_busy(tmp_path: Path) -> None:
    """The flush interval holds the next batch back only after a batch of several
    requests: a request's own records batched together (`queue`) are not a crowd."""
    path = tmp_path / "audit.jsonl"
    audit = AuditLog(path, flush_interval_ms=600_000)
    await audit.start()
    audit.queue("policy.decided", request_id="req_1")
    await audit.submit("execution.started", request_id="req_1")
    async with asyncio.timeout(30):  # not ten minutes
        await audit.submit("execution.finished", request_id="req_1")
    await audit.close()


async def test_append_waits_for_fsync(tmp_path: Path) -> None:
    entered, release = threading.Event(), threading.Event()

    def gated_fsync(fd: int) -> None:
        entered.set()
        release.wait()
        os.fsync(fd)

    audit = AuditLog(tmp_path / "audit.jsonl", fsync=gated_fsync)
    await audit.start()
    task = asyncio.create_task(audit.append("test.event"))
    try:
        assert await asyncio.to_thread(entered.wait, 30)
        for _ in range(20):
            await asyncio.sleep(0)
        assert not task.done(), "append returned before its fsync finished"
    finally:
        release.set()
    assert (await task)["seq"] == 1
    await audit.close()


async def test_fsync_failure_makes_log_unavailable(tmp_path: Path) -> None:
    def failing_fsync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    audit = AuditLog(tmp_path / "audit.jsonl", fsync=failing_fsync)
    await audit.start()
    assert audit.healthy
    with pytest.raises(AuditUnavailable, match="Input/output error"):
        await audit.append("test.event")
    assert not audit.healthy
    # Permanent: the kernel may have dropped the data, so nothing more is written.
    with pytest.raises(AuditUnavailable):
        await audit.append("test.event")
    assert "permanent" in (audit.problem or "")
    await audit.close()


@pytest.fixture
def tiny_fs(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        missing_component(f"cannot mount a tmpfs (needs root): {done.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


async def test_disk_full_is_reported_and_recovers(tiny_fs: Path) -> None:
    path = tiny_fs / "audit.jsonl"
    filler = tiny_fs / "filler"
    filler.write_bytes(b"x" * 40 * 1024)
    audit = AuditLog(path, retry_interval_s=0.01)
    await audit.start()
    acknowledged = 0
    with pytest.raises(AuditUnavailable, match="No space left"):
        for i in range(1000):
            await audit.append("test.event", n=i, padding="p" * 700)
            acknowledged += 1
    assert acknowledged > 0
    assert not audit.healthy and "No space left" in (audit.problem or "")
    with pytest.raises(AuditUnavailable):
        await audit.append("test.event", n="refused too")
    # The failed batches were cut off: the file still ends in a whole record.
    report = verify_file(path)
    assert report.ok and report.records == acknowledged, report

    # Space comes back; nobody appends (a gateway refusing work would not): the
    # writer's own retry records the loss and makes the log healthy again.
    filler.unlink()
    for _ in range(3000):
        if audit.healthy:
            break
        await asyncio.sleep(0.01)
    assert audit.healthy
    record = await audit.append("test.event", n="after")
    await audit.close()

    records = lines_of(path)
    note = records[acknowledged]
    assert note["type"] == "audit.write_failed" and note["seq"] == acknowledged + 1
    assert note["lost_records"] == 2 and "No space left" in note["error"]
    assert note["since"] <= note["ts"]
    assert record["seq"] == acknowledged + 2
    assert verify_file(path).records == acknowledged + 2


async def test_torn_final_line_is_cut_and_recorded(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    audit = AuditLog(path)
    await audit.start()
    for i in range(3):
        await audit.append("test.event", n=i)
    await audit.close()
    torn = b'{"execution_id":null,"hash":"ab'
    with path.open("ab") as f:
        f.write(torn)
    assert not verify_file(path).ok

    audit = AuditLog(path)
    await audit.start()
    after = await audit.append("test.event", n=3)
    await audit.close()

    records = lines_of(path)
    recovered = records[3]
    assert recovered["type"] == "audit.recovered" and recovered["seq"] == 4
    assert recovered["truncated_bytes"] == len(torn)
    assert recovered["truncated_preview"] == "eyJleGVjdXRpb25faWQiOm51bGwsImhhc2giOiJhYg=="
    assert after["seq"] == 5
    assert verify_file(path).ok


@pytest.mark.parametrize(
    "last_line",
    [b"this is not json\n", b'{"seq": 3}\n'],
    ids=["garbage", "not-a-record"],
)
async def test_corrupt_last_record_refuses_start(tmp_path: Path, last_line: bytes) -> None:
    path = tmp_path / "audit.jsonl"
    audit = AuditLog(path)
    await audit.start()
    await audit.append("test.event")
    await audit.close()
    with path.open("ab") as f:
        f.write(last_line)
    with pytest.raises(AuditCorrupt, match="audit verify"):
        await AuditLog(path).start()


async def test_edited_last_record_refuses_start(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    audit = AuditLog(path)
    await audit.start()
    await audit.append("test.event", tenant="acme")
    await audit.close()
    path.write_bytes(path.read_bytes().replace(b'"acme"', b'"evil"'))
    with pytest.raises(AuditCorrupt, match="hash mismatch"):
        await AuditLog(path).start()


async def test_second_writer_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    first = AuditLog(path)
    await first.start()
    with pytest.raises(AuditUnavailable, match="in use"):
        await AuditLog(path).start()
    await first.close()


async def test_field_values_checked_before_anything_is_written(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    audit = AuditLog(path)
    await audit.start()
    with pytest.raises(ValueError, match="may not be named"):
        await audit.append("test.event", hash="x")
    with pytest.raises(TypeError, match="object"):
        await audit.append("test.event", thing=object())
    with pytest.raises(ValueError, match="not valid JSON"):
        await audit.append("test.event", cpu=float("nan"))
    record = await audit.append(
        "test.event", blob=b"\x00\xff", tags={"b", "a"}, pair=(1, 2), text="caf\u00e9 \udcff"
    )
    await audit.close()
    assert record["seq"] == 1
    assert record["blob"] == "AP8="
    assert record["tags"] == ["a", "b"] and record["pair"] == [1, 2]
    assert record["text"] == "caf\u00e9 \\udcff"
    assert lines_of(path) == [record]
    assert verify_file(path).ok


async def test_close_flushes_queue_and_refuses_more(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    audit = AuditLog(path)
    await audit.start()
    tasks = [asyncio.create_task(audit.append("test.event", n=i)) for i in range(50)]
    await asyncio.sleep(0)  # let them queue
    await audit.close()
    assert all(t.done() and not t.cancelled() for t in tasks)
    assert verify_file(path).records == 50
    assert not audit.healthy
    with pytest.raises(AuditUnavailable, match="not open"):
        await audit.append("test.event")


async def test_cancelled_append_is_still_written(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    audit = AuditLog(path)
    await audit.start()
    task = asyncio.create_task(audit.append("test.event", n="cancelled"))
    await asyncio.sleep(0)
    task.cancel()
    await audit.append("test.event", n="after")
    await audit.close()
    assert [r["n"] for r in lines_of(path)] == ["cancelled", "after"]
    assert verify_file(path).ok


async def test_submit_now_wait_later(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    counter = FsyncCounter(path)
    audit = AuditLog(path, fsync=counter)
    await audit.start()
    futures = [audit.submit("test.event", n=i) for i in range(3)]
    with pytest.raises(TypeError):
        audit.submit("test.event", bad=object())  # refused at once, nothing queued
    records = await asyncio.gather(*futures)
    await audit.close()
    assert [r["seq"] for r in records] == [1, 2, 3]
    assert counter.calls == 1 and counter.synced_seq == 3
