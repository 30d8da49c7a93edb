"""Live output: what a running execution prints, for whoever follows it.

The dispatch stage opens one `LiveOutput` per execution and hands its `feed` to the
backend, which calls it with each piece of stdout or stderr it keeps (so the output
cap bounds what is held here as it bounds the result). Pieces are decoded as UTF-8
incrementally, per stream, so a character split across two reads is never split
across two events (bytes that are not UTF-8 become U+FFFD, as in the result).
Followers (`POST /v1/executions` with `Accept: text/event-stream`,
`GET /v1/executions/{id}/events`, MCP progress) read from the start at their own
pace; a follower that goes away costs the execution nothing.

A backend may call `feed` from a thread of its own (the Docker SDK's readers): it
is handed to the loop then.
"""

from __future__ import annotations

import asyncio
import codecs
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

STREAMS = ("stdout", "stderr")


@dataclass(frozen=True, slots=True)
class Chunk:
    stream: str  # "stdout" | "stderr"
    text: str


class LiveOutput:
    def __init__(self, execution_id: str) -> None:
        self.execution_id = execution_id
        self.chunks: list[Chunk] = []
        self.closed = False
        self._loop = asyncio.get_running_loop()
        self._thread = threading.get_ident()
        self._changed = asyncio.Event()
        self._decoders = {
            s: codecs.getincrementaldecoder("utf-8")(errors="replace") for s in STREAMS
        }

    def feed(self, stream: str, data: bytes) -> None:
        if threading.get_ident() != self._thread:
            self._loop.call_soon_threadsafe(self._feed, stream, data)
        else:
            self._feed(stream, data)

    def _feed(self, stream: str, data: bytes) -> None:
        if self.closed or stream not in self._decoders:
            return
        text = self._decoders[stream].decode(data)
        if text:
            self._append(Chunk(stream, text))

    def _append(self, chunk: Chunk) -> None:
        self.chunks.append(chunk)
        self._changed.set()

    def close(self) -> None:
        """The program is done: what its decoders still hold ends its streams."""
        if threading.get_ident() != self._thread:
            self._loop.call_soon_threadsafe(self.close)
            return
        if self.closed:
            return
        for stream, decoder in self._decoders.items():
            tail = decoder.decode(b"", final=True)
            if tail:
                self._append(Chunk(stream, tail))
        self.closed = True
        self._changed.set()

    async def follow(self) -> AsyncIterator[list[Chunk]]:
        """Every chunk from the first, then as they come, until closed: in batches of
        what is there when the follower looks, so a slow follower (or a program that
        prints a byte at a time) costs one event per look, not one per write."""
        index = 0
        while True:
            if index < len(self.chunks):
                batch = self.chunks[index:]
                index += len(batch)
                yield merged(batch)
                continue
            if self.closed:
                return
            self._changed.clear()
            if index < len(self.chunks) or self.closed:
                continue
            await self._changed.wait()


def merged(chunks: list[Chunk]) -> list[Chunk]:
    """Neighbouring chunks of one stream as one, order kept."""
    out: list[Chunk] = []
    for chunk in chunks:
        if out and out[-1].stream == chunk.stream:
            out[-1] = Chunk(chunk.stream, out[-1].text + chunk.text)
        else:
            out.append(chunk)
    return out


class LiveRegistry:
    """The executions running now, by id; followers find them here."""

    def __init__(self) -> None:
        self.running: dict[str, LiveOutput] = {}
        # Set (and replaced) whenever an execution opens: no state per waiting id,
        # so a follower of an execution that never runs leaves nothing behind.
        self._opened = asyncio.Event()

    def open(self, execution_id: str) -> LiveOutput:
        live = LiveOutput(execution_id)
        self.running[execution_id] = live
        self._opened.set()
        self._opened = asyncio.Event()
        return live

    def close(self, live: LiveOutput) -> None:
        live.close()
        if self.running.get(live.execution_id) is live:
            del self.running[live.execution_id]

    def get(self, execution_id: str) -> LiveOutput | None:
        return self.running.get(execution_id)

    async def wait_open(self, execution_id: str) -> LiveOutput:
        """Wait until the execution starts (a held one, once approved)."""
        while (live := self.running.get(execution_id)) is None:
            await self._opened.wait()
        return live


Event = tuple[str, dict[str, Any]]


class Store(Protocol):
    async def get(self, execution_id: str, wait_s: float = 0.0) -> dict[str, Any] | None: ...


def _held_event(record: dict[str, Any]) -> Event:
    approval = record.get("approval") or {}
    return "held", {
        "status": "pending_approval",
        "approval_id": approval.get("id"),
        "execution_id": record["execution_id"],
        "expires_at": approval.get("expires_at"),
        "reasons": approval.get("reasons", []),
    }


def _final_events(record: dict[str, Any], replay_output: bool) -> list[Event]:
    if record["status"] == "done" and record.get("result") is not None:
        result = record["result"]
        events: list[Event] = []
        if replay_output:
            events += [
                ("output", {"stream": s, "text": result[s]}) for s in STREAMS if result.get(s)
            ]
        return [*events, ("result", result)]
    return [("error", {"error": record.get("error") or {"code": "failed"}})]


async def follow_execution(
    store: Store, registry: LiveRegistry, execution_id: str, wait_s: float
) -> AsyncIterator[Event]:
    """The events of one execution, from now: held (while a person decides), output as
    it is printed, then the result (or the error that ended it). A held execution is
    waited for up to `wait_s`; the stream then ends, and following again resumes."""
    record = await store.get(execution_id)
    if record is None:
        return
    if record["status"] == "pending_approval":
        yield _held_event(record)
        opened = asyncio.ensure_future(registry.wait_open(execution_id))
        ended = asyncio.ensure_future(store.get(execution_id, wait_s=wait_s))
        try:
            done, _ = await asyncio.wait(
                {opened, ended}, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for task in (opened, ended):
                if not task.done():
                    task.cancel()
        if not done:
            return
    live = registry.get(execution_id)
    if live is not None:
        async for batch in live.follow():
            for chunk in batch:
                yield "output", {"stream": chunk.stream, "text": chunk.text}
    # The output has ended; the record is final moments later (bounded by the caller).
    while True:
        record = await store.get(execution_id, wait_s=max(wait_s, 1.0))
        if record is None:
            return
        if record["status"] in ("done", "failed"):
            for event in _final_events(record, replay_output=live is None):
                yield event
            return
        if record["status"] == "pending_approval":
            yield _held_event(record)
            return
