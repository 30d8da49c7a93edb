"""analyse: the code -> imports, calls and features the policy can reason about."""

from __future__ import annotations

import asyncio

from gateway.analysis import analyse as analyse_code
from gateway.context import ExecContext
from gateway.services import Services

# Parsing small programs inline is cheaper than a thread hop; big ones go to a thread
# so one large submission cannot stall every other request on the event loop.
INLINE_LIMIT_BYTES = 2 * 1024


async def analyse(ctx: ExecContext, svc: Services) -> None:
    assert ctx.request is not None
    language, code = ctx.request.language, ctx.request.code
    if len(code) <= INLINE_LIMIT_BYTES:
        ctx.analysis = analyse_code(language, code)
    else:
        ctx.analysis = await asyncio.to_thread(analyse_code, language, code)
