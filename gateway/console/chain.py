"""The audit chain's verification status for the console, kept up to date cheaply.

The first check reads the whole log; later ones read only what was appended since
(`verify_more` resumes from the last proven byte), so the audit pages stay fast on
a long, busy log. A replaced or truncated file is verified again from the start;
a break, once found, is reported until then.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field

from aiohttp import web

from gateway.audit.chain import ChainPoint, VerifyReport, verify_more


def _identity(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_size


@dataclass
class ChainStatus:
    inode: int | None = None
    point: ChainPoint = field(default_factory=ChainPoint)
    report: VerifyReport | None = None
    # One verification at a time: concurrent page loads wait for it and share its answer.
    _task: asyncio.Future[None] | None = None

    async def check(self, path: str, wait_s: float = 1.0) -> tuple[VerifyReport | None, bool]:
        """(the latest report, whether it covers the log as it is now).

        A page waits at most `wait_s`: the first verification of a long log goes on
        in the background and the page says so instead of hanging.
        """
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._advance(path))
        done, _ = await asyncio.wait({self._task}, timeout=wait_s)
        if done:
            self._task.result()  # a failure to read the log surfaces here
        return self.report, bool(done)

    async def _advance(self, path: str) -> None:
        found = await asyncio.to_thread(_identity, path)
        if found is None:
            self.inode, self.point, self.report = None, ChainPoint(), None
            return
        inode, size = found
        if inode != self.inode or size < self.point.offset:
            self.inode, self.point, self.report = inode, ChainPoint(), None
        if self.report is not None and not self.report.ok:
            return
        if self.report is None or size > self.point.offset:
            self.report, self.point = await asyncio.to_thread(verify_more, path, self.point)


CHAIN = web.AppKey("console_chain", ChainStatus)
