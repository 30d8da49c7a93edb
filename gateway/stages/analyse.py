"""analyse: the code and its input files -> imports, calls and features the policy
can reason about."""

from __future__ import annotations

import asyncio

from gateway.analysis import analyse_request
from gateway.context import ExecContext
from gateway.services import Services

# Parsing small programs inline is cheaper than a thread hop; big ones go to a thread
# so one large submission cannot stall every other request on the event loop.
INLINE_LIMIT_BYTES = 2 * 1024


async def analyse(ctx: ExecContext, svc: Services) -> None:
    assert ctx.request is not None
    language, code = ctx.request.language, ctx.request.code
    files = [(f.path, f.content()) for f in ctx.request.files]
    size = len(code) + sum(len(content) for _, content in files)
    if size <= INLINE_LIMIT_BYTES:
        ctx.analysis = analyse_request(language, code, files)
    else:
        ctx.analysis = await asyncio.to_thread(analyse_request, language, code, files)
