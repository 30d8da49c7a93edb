"""The container stream parser: caps, hostile frames, the exit report's place."""

from __future__ import annotations

import json
import struct

import pytest

from backends.docker.protocol import Caps, Demux, FrameReader, ProtocolError, request_header

CAPS = Caps(output_bytes=100, max_files=2, max_file_bytes=50, max_total_bytes=80)


def mux(payload: bytes, stream: int = 1) -> bytes:
    return bytes([stream, 0, 0, 0]) + struct.pack(">I", len(payload)) + payload


def frame(kind: bytes, payload: bytes = b"") -> bytes:
    return kind + struct.pack(">I", len(payload)) + payload


def file_frame(path: str, content: bytes) -> bytes:
    name = path.encode()
    return frame(b"F", struct.pack(">H", len(name)) + name + content)


NONCE = "n0nce"


def report(nonce: str = NONCE, **fields: object) -> bytes:
    return frame(b"X", json.dumps({"nonce": nonce, "wait_status": 0, **fields}).encode())


def reader_with(*frames: bytes) -> FrameReader:
    reader = FrameReader(CAPS, NONCE)
    reader.feed(mux(frame(b"R") + b"".join(frames)))
    return reader


def test_request_header_is_length_prefixed_json() -> None:
    head = request_header({"a": 1})
    assert struct.unpack(">I", head[:4])[0] == len(head) - 4
    assert json.loads(head[4:]) == {"a": 1}


def test_demux_reassembles_pieces_split_anywhere() -> None:
    data = mux(b"hello") + mux(b"oops", 2) + mux(b"world")
    demux = Demux()
    got = [piece for i in range(len(data)) for piece in demux.feed(data[i : i + 1])]
    out = b"".join(p for s, p in got if s == 1)
    err = b"".join(p for s, p in got if s == 2)
    assert (out, err) == (b"helloworld", b"oops")


def test_a_whole_run() -> None:
    reader = reader_with(
        frame(b"O", b"out"), frame(b"E", b"err"), file_frame("d/f.txt", b"42"),
        frame(b"S", b"link: not a regular file"), report(cpu_ms=3),
    )  # fmt: skip
    got = reader.finish()
    assert (bytes(got.stdout), bytes(got.stderr)) == (b"out", b"err")
    assert [(f.path, f.content, f.size) for f in got.files] == [("d/f.txt", b"42", 2)]
    assert got.skipped == ["link: not a regular file"]
    assert got.report == {"wait_status": 0, "cpu_ms": 3}
    assert not got.output_limit_hit and not reader.cut


def test_output_is_capped_across_both_streams() -> None:
    got = reader_with(frame(b"O", b"o" * 60), frame(b"E", b"e" * 60)).finish()
    assert len(got.stdout) + len(got.stderr) == 100
    assert got.output_limit_hit and got.truncated_stderr and not got.truncated_stdout


def test_engine_stderr_is_kept_apart_and_bounded() -> None:
    reader = reader_with()
    reader.feed(mux(b"x" * 10_000, 2))
    assert reader.finish().diagnostics == b"x" * 8192
    assert reader.got.stdout == b""


@pytest.mark.parametrize(
    "bad",
    [
        frame(b"R"),  # a second ready frame
        frame(b"Z", b"?"),  # unknown type
        frame(b"X", b"not json"),
        frame(b"X", b"[1]"),
        file_frame("../etc/passwd", b"x"),
        file_frame("/abs", b"x"),
        file_frame("a//b", b"x"),
        file_frame("big", b"x" * 51),
        file_frame("a", b"x") + file_frame("a", b"y"),  # the same path twice
        file_frame("a", b"x" * 50) + file_frame("b", b"x" * 31),  # over the total
        file_frame("a", b"") + file_frame("b", b"") + file_frame("c", b""),  # too many
        frame(b"F", b"\x00"),
        b"O" + struct.pack(">I", 10**9),  # an absurd length
    ],
)
def test_abuse_is_a_protocol_error(bad: bytes) -> None:
    with pytest.raises(ProtocolError):
        reader_with(bad)


def test_output_before_ready_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError):
        FrameReader(CAPS).feed(mux(frame(b"O", b"early")))


def test_only_a_report_with_the_nonce_counts() -> None:
    for forged in (report(nonce="guess"), report(nonce=""), frame(b"X", b'{"wait_status": 0}')):
        with pytest.raises(ProtocolError, match="nonce"):
            reader_with(forged)
    with pytest.raises(ProtocolError):
        reader_with(report(), frame(b"O", b"after"))
    assert reader_with(report()).finish().report == {"wait_status": 0}


def test_a_stream_cut_inside_a_frame_is_noticed() -> None:
    reader = reader_with(frame(b"O", b"ok"))
    reader.feed(mux(b"O\x00\x00"))
    assert reader.finish().report is None and reader.cut


def test_a_forged_header_swallowing_the_real_report_leaves_no_report() -> None:
    real = report(cpu_ms=999)
    forged = b"O" + struct.pack(">I", len(real))
    reader = reader_with(forged + real)
    assert reader.finish().report is None
