"""The bytes between the gateway and a container's launcher, both ways (pure code).

To the launcher (its stdin, through the engine's attach stream): a length-prefixed
JSON header, then the code, each input file and the program's stdin, with every
size announced in the header, so no byte of user data is ever parsed as control.

From the launcher: the engine multiplexes the container's stdout and stderr (8-byte
headers: stream, size); the launcher's stdout carries frames (see
backends/docker/launcher.py), its stderr only diagnostics. Everything that comes out
of a container is untrusted: under gVisor the program can even write into the
launcher's descriptors. So the parser caps every frame and the total, validates
every file path, and believes an exit report only if it carries the nonce of this
execution, which travelled in the request header and lives only in the launcher's
memory (not dumpable: no ptrace, no /proc/1/mem); the launcher writes it after
every other process in the container is dead, as its last word. Anything that
claims to be a report without the nonce is a protocol error.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from typing import Any

from backends.base import OutputFile, OutputSink
from backends.workspace import WorkspaceError, checked_relative

MUX_HEADER = 8
FRAME_HEADER = 5
STDOUT, STDERR = 1, 2
DIAGNOSTICS_BYTES = 8192
# Beyond the largest output file: its path and the frame header.
FRAME_SLACK = 70_000


class ProtocolError(Exception):
    """The container's stream broke the protocol (a launcher bug, or a hostile program)."""


def request_header(request: dict[str, Any]) -> bytes:
    body = json.dumps(request, separators=(",", ":")).encode()
    return struct.pack(">I", len(body)) + body


class Demux:
    """The engine's multiplexed attach stream -> (stream, bytes) pieces."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._stream = 0
        self._left = 0

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        self._buf += data
        out: list[tuple[int, bytes]] = []
        while self._buf:
            if self._left == 0:
                if len(self._buf) < MUX_HEADER:
                    break
                self._stream = self._buf[0]
                self._left = struct.unpack(">I", self._buf[4:8])[0]
                del self._buf[:MUX_HEADER]
                continue
            piece = bytes(self._buf[: self._left])
            del self._buf[: len(piece)]
            self._left -= len(piece)
            out.append((self._stream, piece))
        return out


@dataclass(frozen=True, slots=True)
class Caps:
    output_bytes: int  # stdout + stderr together
    max_files: int
    max_file_bytes: int
    max_total_bytes: int


@dataclass(slots=True)
class Received:
    """What a launcher sent back, within the caps."""

    stdout: bytearray = field(default_factory=bytearray)
    stderr: bytearray = field(default_factory=bytearray)
    truncated_stdout: bool = False
    truncated_stderr: bool = False
    output_limit_hit: bool = False
    files: list[OutputFile] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    report: dict[str, Any] | None = None  # the launcher's exit report (nonce checked)
    ready: bool = False
    diagnostics: bytearray = field(default_factory=bytearray)


class FrameReader:
    """Launcher frames -> `Received`, enforcing every cap; ProtocolError on abuse."""

    def __init__(self, caps: Caps, nonce: str = "") -> None:
        self.caps = caps
        self.nonce = nonce  # set with the caps when the request is sent
        self.got = Received()
        self._demux = Demux()
        self._buf = bytearray()
        self._file_bytes = 0
        self.cut = False  # the stream ended inside a frame
        self._paths: set[str] = set()
        # Live output: what is kept of each piece, as it arrives (set per request).
        self.on_output: OutputSink | None = None

    def feed(self, data: bytes) -> None:
        for stream, piece in self._demux.feed(data):
            if stream == STDERR:
                room = DIAGNOSTICS_BYTES - len(self.got.diagnostics)
                self.got.diagnostics += piece[: max(room, 0)]
            elif stream == STDOUT:
                self._buf += piece
                self._frames()
            else:
                raise ProtocolError(f"unexpected engine stream {stream}")

    def _frames(self) -> None:
        while len(self._buf) >= FRAME_HEADER:
            kind = bytes(self._buf[:1])
            size = struct.unpack(">I", self._buf[1:5])[0]
            if size > max(self.caps.max_file_bytes, 1 << 16) + FRAME_SLACK:
                raise ProtocolError(f"frame of {size} bytes")
            if len(self._buf) < FRAME_HEADER + size:
                return
            payload = bytes(self._buf[FRAME_HEADER : FRAME_HEADER + size])
            del self._buf[: FRAME_HEADER + size]
            self._frame(kind, payload)

    def _frame(self, kind: bytes, payload: bytes) -> None:
        got = self.got
        if got.report is not None:
            # Something after the exit report: it was not the launcher's last word.
            got.report = None
            raise ProtocolError("frames after the exit report")
        if kind == b"R":
            if got.ready or payload:
                raise ProtocolError("a second ready frame")
            got.ready = True
        elif not got.ready:
            raise ProtocolError("output before the ready frame")
        elif kind in (b"O", b"E"):
            self._output(kind == b"O", payload)
        elif kind == b"F":
            self._file(payload)
        elif kind == b"S":
            if len(got.skipped) < 100:
                got.skipped.append(payload[:300].decode("utf-8", errors="replace"))
        elif kind == b"X":
            try:
                report = json.loads(payload, object_pairs_hook=_one_of_each_key)
            except (ValueError, RecursionError) as exc:
                raise ProtocolError(f"exit report is not JSON: {exc}") from None
            if not isinstance(report, dict):
                raise ProtocolError("exit report is not an object")
            if not self.nonce or report.pop("nonce", None) != self.nonce:
                raise ProtocolError("an exit report without this execution's nonce")
            got.report = report
        else:
            raise ProtocolError(f"unknown frame type {kind!r}")

    def _output(self, is_stdout: bool, payload: bytes) -> None:
        got = self.got
        room = self.caps.output_bytes - len(got.stdout) - len(got.stderr)
        buf = got.stdout if is_stdout else got.stderr
        if len(payload) > room:
            payload = payload[: max(room, 0)]
            got.output_limit_hit = True
            if is_stdout:
                got.truncated_stdout = True
            else:
                got.truncated_stderr = True
        buf += payload
        if payload and self.on_output is not None:
            self.on_output("stdout" if is_stdout else "stderr", payload)

    def _file(self, payload: bytes) -> None:
        caps, got = self.caps, self.got
        if len(payload) < 2:
            raise ProtocolError("short file frame")
        name_len = struct.unpack(">H", payload[:2])[0]
        try:
            path = payload[2 : 2 + name_len].decode("utf-8")
            checked_relative(path)
        except (UnicodeDecodeError, WorkspaceError) as exc:
            raise ProtocolError(f"bad output file path: {exc}") from None
        content = payload[2 + name_len :]
        if path in self._paths:
            raise ProtocolError(f"output file {path!r} sent twice")
        if (
            len(got.files) >= caps.max_files
            or len(content) > caps.max_file_bytes
            or self._file_bytes + len(content) > caps.max_total_bytes
        ):
            raise ProtocolError("output files over their caps")
        self._paths.add(path)
        self._file_bytes += len(content)
        got.files.append(OutputFile(path=path, size=len(content), content=content))

    def finish(self) -> Received:
        """At the end of the stream (or of the report): was a frame cut short?"""
        if self._buf and self.got.report is None:
            self.cut = True
        return self.got


def _one_of_each_key(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """The exit report is untrusted (it comes out of the sandbox): a key given twice
    is refused, never read two ways."""
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError("duplicate object key")
    return dict(pairs)
