"""One sandbox's egress: its boundary served on the event loop, its record.

Made ahead with the sandbox (the namespace is furnished off the request's
path), armed with the request's egress list and credentials at launch,
finished after the run: the record is taken and everything is closed.
"""

from __future__ import annotations

import asyncio

from backends.base import Credential, NetworkAttempt, SandboxEvent
from backends.egress.addresses import NameResolver
from backends.egress.boundary import BoundaryFds
from backends.egress.proxy import EgressProxy
from backends.egress.record import NetworkRecord
from backends.egress.recorder import BoundaryRecorder
from backends.egress.resolver import Resolver


class EgressSession:
    def __init__(self, fds: BoundaryFds, resolver: NameResolver | None = None) -> None:
        self.fds = fds
        self.record = NetworkRecord()
        self.proxy = EgressProxy(self.record, resolver)
        self.recorder = BoundaryRecorder(fds.tun, self.record)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._resolver: asyncio.BaseTransport | None = None
        self._stopped = False
        self._closing: asyncio.Future[None] | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._loop = loop
        loop.add_reader(self.fds.tun, self.recorder.drain)
        self._server = await asyncio.start_server(self.proxy.handle, sock=self.fds.proxy)
        self._resolver, _ = await loop.create_datagram_endpoint(
            lambda: Resolver(self.record), sock=self.fds.resolver
        )

    def arm(
        self,
        egress: tuple[str, ...],
        credentials: tuple[Credential, ...],
        internal_allow: tuple[str, ...] = (),
    ) -> None:
        self.proxy.arm(egress, credentials, internal_allow)

    async def finish(self) -> tuple[tuple[NetworkAttempt, ...], tuple[SandboxEvent, ...]]:
        """Stop serving and hand over the record (and a note if it overflowed). The
        namespace's descriptors stay open until `stop()` or `closed()`: closing them
        makes the kernel wait for RCU grace periods, whose IPIs reach every CPU,
        the one finishing this request included."""
        if not self._stopped:
            self.recorder.drain()  # what the last moments of the run sent
        await self._stop_serving()
        events: tuple[SandboxEvent, ...] = ()
        if self.record.dropped:
            detail = f"{self.record.dropped} further network attempts not recorded"
            events = (SandboxEvent("network_record_full", detail),)
        return tuple(self.record.entries), events

    async def stop(self) -> None:
        """Stop serving and close the namespace's descriptors (idempotent)."""
        await self._stop_serving()
        self._close()

    async def _stop_serving(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        if self._loop is not None:
            self._loop.remove_reader(self.fds.tun)
        if self._server is not None:
            self._server.close()
        self.proxy.close_all()
        if self._resolver is not None:
            self._resolver.close()
        await asyncio.sleep(0)  # let the transports' close callbacks run

    def _close(self) -> None:
        # Closing the last TUN descriptor unregisters the device: ~20 ms of the
        # kernel waiting for RCU. On a worker thread, and nobody's request waits for
        # it; the backend tracks `closed()` so its close and settling still do.
        if self._closing is None:
            self._closing = asyncio.get_running_loop().run_in_executor(None, self.fds.close)

    async def closed(self) -> None:
        """Stop serving, close the namespace's descriptors, and wait until they are
        closed."""
        await self.stop()
        assert self._closing is not None
        await self._closing

    def close_unstarted(self) -> None:
        """For a session whose sandbox failed before it was started (blocking ok)."""
        if self._loop is None:
            self._stopped = True
            self.fds.close()
