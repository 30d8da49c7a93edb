"""Server-Sent Events: the streaming answer of `POST /v1/executions` (with
`Accept: text/event-stream`), `GET /v1/executions/{id}/events` and MCP's streamed
`tools/call`.

Each event is `event: <name>` and one `data:` line of JSON. A client that goes away
ends the writing, never the execution: `send` then answers False and the caller
carries on without it.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

EVENT_STREAM = "text/event-stream"


def wants_events(request: web.Request) -> bool:
    """The client listed text/event-stream in Accept (and did not refuse it)."""
    for part in request.headers.getall("Accept", []):
        for media in part.split(","):
            kind, _, params = media.strip().partition(";")
            if kind.strip().lower() == EVENT_STREAM and "q=0" not in params.replace(" ", ""):
                return True
    return False


async def open_stream(request: web.Request, **headers: str) -> web.StreamResponse:
    resp = web.StreamResponse(
        status=200,
        headers={
            "Content-Type": EVENT_STREAM,
            "Cache-Control": "no-cache",
            # Proxies must pass each event on as it comes.
            "X-Accel-Buffering": "no",
            **headers,
        },
    )
    await resp.prepare(request)
    return resp


async def send(resp: web.StreamResponse, event: str, data: Any) -> bool:
    # json.dumps escapes newlines inside strings, so the data is one line.
    payload = f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"
    try:
        await resp.write(payload.encode("utf-8"))
    except (ConnectionResetError, RuntimeError):
        return False
    return True
