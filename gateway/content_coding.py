"""Request bodies with a Content-Encoding, decoded by the gateway itself.

The server keeps bodies as they arrived (create_app turns aiohttp's automatic
decompression off): a reverse-proxy route must forward exactly the bytes, and the
length, that it received. The gateway's own endpoints (and intercepted proxy
requests) read the decoded body through here, bounded by the same size limit as a
plain one, so a small gzip bomb is a 413, never a large allocation.
"""

from __future__ import annotations

import asyncio
import zlib

from multidict import CIMultiDictProxy

from gateway import errors
from gateway.errors import GatewayError, invalid_field

_GZIP_MAGIC = b"\x1f\x8b"
# Bodies above this are decoded off the event loop.
_INLINE_BYTES = 64 * 1024


def content_codings(headers: CIMultiDictProxy[str]) -> list[str]:
    """The codings applied, in order (identity dropped)."""
    codings = [
        token.strip().lower()
        for value in headers.getall("Content-Encoding", [])
        for token in value.split(",")
    ]
    return [c for c in codings if c and c != "identity"]


def _too_large(limit: int) -> GatewayError:
    return GatewayError(errors.TOO_LARGE, f"decoded body over {limit} bytes", limit_bytes=limit)


def _inflate(data: bytes, wbits: int, limit: int, members: bool) -> bytes:
    out = bytearray()
    while True:
        decoder = zlib.decompressobj(wbits)
        out += decoder.decompress(data, limit + 1 - len(out))
        if len(out) > limit or decoder.unconsumed_tail:
            raise _too_large(limit)
        if not decoder.eof:
            raise zlib.error("truncated stream")
        data = decoder.unused_data
        if not data:
            return bytes(out)
        # Several gzip members are one body (RFC 1952); anything else after the end
        # would be read differently by different decoders.
        if not (members and data.startswith(_GZIP_MAGIC)):
            raise zlib.error("data after the end of the compressed stream")


def _decode(body: bytes, codings: list[str], limit: int) -> bytes:
    for coding in reversed(codings):
        try:
            if coding in ("gzip", "x-gzip"):
                body = _inflate(body, 16 + zlib.MAX_WBITS, limit, members=True)
            elif coding == "deflate":
                # RFC 9110's "deflate" is the zlib format; raw deflate is common too.
                try:
                    body = _inflate(body, zlib.MAX_WBITS, limit, members=False)
                except zlib.error:
                    body = _inflate(body, -zlib.MAX_WBITS, limit, members=False)
            else:
                raise GatewayError(
                    errors.UNSUPPORTED_MEDIA_TYPE,
                    f"Content-Encoding {coding!r} is not supported (gzip, deflate, identity)",
                    fields=[{"field": "Content-Encoding", "message": "unsupported coding"}],
                )
        except zlib.error as exc:
            raise invalid_field("Content-Encoding", f"body is not valid {coding}: {exc}") from None
    return body


async def decode_body(body: bytes, codings: list[str], limit: int) -> bytes:
    """The body with its codings undone, at most `limit` bytes (else 413)."""
    if not codings:
        return body
    if len(body) <= _INLINE_BYTES:
        return _decode(body, codings, limit)
    return await asyncio.to_thread(_decode, body, codings, limit)
