"""Log lines carry the request and execution they belong to, as JSON or text, and no
token ever reaches one."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Iterator

import pytest

from gateway.context import ExecContext
from gateway.pipeline import Pipeline
from gateway.services import Services
from gateway.telemetry import logs
from tests.gateway.test_pipeline import SECRET_TOKEN, context, svc  # noqa: F401

log = logging.getLogger("execgate.test")


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    """The handler `logs.configure` installs, writing into a buffer."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(logs.ContextFilter())
    handler.setFormatter(logs.JsonFormatter())
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        yield stream
    finally:
        log.removeHandler(handler)


def lines(stream: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


async def test_each_task_logs_its_own_ids(captured: io.StringIO) -> None:
    async def work(n: int) -> None:
        logs.bind(f"req_{n}", f"exe_{n}")
        await asyncio.sleep(0)
        log.info("working on %d", n)

    await asyncio.gather(*(work(n) for n in range(5)))
    entries = lines(captured)
    assert len(entries) == 5
    for entry in entries:
        n = entry["msg"].rsplit(" ", 1)[1]
        assert (entry["request_id"], entry["execution_id"]) == (f"req_{n}", f"exe_{n}")
        assert entry["level"] == "INFO" and entry["ts"].endswith("Z")


async def test_the_pipeline_binds_the_request(
    svc: Services,  # noqa: F811
    captured: io.StringIO,
) -> None:
    async def stage(ctx: ExecContext, _: Services) -> None:
        log.warning("inside a stage")

    ctx = context({"language": "python", "code": "1"})
    await Pipeline(svc, stages=(stage,)).run(ctx)
    [entry] = lines(captured)
    assert entry["request_id"] == ctx.request_id
    assert entry["execution_id"] == ctx.execution_id


def test_tokens_never_reach_a_line(captured: io.StringIO) -> None:
    jws = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ4In0.c2lnbmF0dXJl"
    log.error("upstream said: Authorization: Bearer %s", SECRET_TOKEN)
    log.error("a JWT in an error: %s", jws)
    try:
        raise ValueError(f"bad token {jws}")
    except ValueError:
        log.exception("failed")
    text = captured.getvalue()
    assert SECRET_TOKEN not in text and "eyJzdWIiOiJ4In0" not in text
    assert text.count("[redacted]") >= 3


def test_text_format_names_the_ids() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(logs.ContextFilter())
    handler.setFormatter(logs.TextFormatter())
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "hello", None, None)
    record.request_id, record.execution_id = "req_1", "exe_1"
    handler.handle(record)
    assert "[req_1 exe_1]: hello" in stream.getvalue()
