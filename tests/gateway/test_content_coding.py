"""Request bodies the gateway decodes itself: every coding it takes, bounded."""

from __future__ import annotations

import gzip
import zlib

import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from gateway.content_coding import content_codings, decode_body
from gateway.errors import GatewayError

LIMIT = 1000


def _codings(*values: str) -> list[str]:
    return content_codings(CIMultiDictProxy(CIMultiDict(("Content-Encoding", v) for v in values)))


def _raw_deflate(data: bytes) -> bytes:
    packer = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    return packer.compress(data) + packer.flush()


def test_codings_in_order_without_identity() -> None:
    assert _codings() == []
    assert _codings("identity") == []
    assert _codings("gzip, identity", "Deflate") == ["gzip", "deflate"]


@pytest.mark.parametrize(
    ("body", "codings"),
    [
        (gzip.compress(b"hello"), ["gzip"]),
        (gzip.compress(b"hel") + gzip.compress(b"lo"), ["x-gzip"]),  # two members
        (zlib.compress(b"hello"), ["deflate"]),
        (_raw_deflate(b"hello"), ["deflate"]),
        (gzip.compress(zlib.compress(b"hello")), ["deflate", "gzip"]),
        (b"hello", []),
    ],
)
async def test_decoded(body: bytes, codings: list[str]) -> None:
    assert await decode_body(body, codings, LIMIT) == b"hello"


async def test_a_bomb_is_413_at_any_layer_and_size() -> None:
    for body, codings in [
        (gzip.compress(b"\0" * (LIMIT + 1)), ["gzip"]),
        (gzip.compress(b"\0" * 10_000_000), ["gzip"]),
        (gzip.compress(gzip.compress(b"\0" * 10_000_000)), ["gzip", "gzip"]),
        (gzip.compress(b"\0" * 600) * 2, ["gzip"]),  # members add up
    ]:
        with pytest.raises(GatewayError) as exc:
            await decode_body(body, codings, LIMIT)
        assert exc.value.status == 413 and exc.value.code == "too_large"
    assert len(await decode_body(gzip.compress(b"\0" * LIMIT), ["gzip"], LIMIT)) == LIMIT


@pytest.mark.parametrize(
    "body",
    [
        b"not gzip",
        gzip.compress(b"hello")[:-3],  # truncated
        gzip.compress(b"hello") + b"trailing",  # read differently by different decoders
    ],
)
async def test_malformed_is_400(body: bytes) -> None:
    with pytest.raises(GatewayError) as exc:
        await decode_body(body, ["gzip"], LIMIT)
    assert exc.value.status == 400 and "Content-Encoding" in exc.value.message


async def test_unknown_coding_is_415() -> None:
    for coding in ("br", "zstd", "compress", "gzip2"):
        with pytest.raises(GatewayError) as exc:
            await decode_body(b"x", [coding], LIMIT)
        assert exc.value.status == 415
