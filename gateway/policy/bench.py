"""Policy measurements for `execgate bench`: a real OPA next to the embedded engine.

`local_opa` starts OPA (with the bundle server) over the shipped policy on
loopback ports for the length of the benchmark; the binary is the one the
Makefile builds ($EXECGATE_OPA_BIN, `make opa`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from gateway.policy.opa_build import find_opa_binary
from gateway.policy.opa_local import REPO, LocalOpa

# Decisions per engine measurement: the floor, enough for a stable p99.
DECISIONS = 5000
POLICIES = REPO / "policies"


@asynccontextmanager
async def local_opa(log_dir: Path) -> AsyncIterator[LocalOpa]:
    opa = LocalOpa(find_opa_binary(), POLICIES, log_dir)
    await asyncio.to_thread(opa.start)
    try:
        yield opa
    finally:
        await asyncio.to_thread(opa.stop)
