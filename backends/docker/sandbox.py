"""One container's life: make (ahead of the request), launch, wind down, dispose.

make:    create (for one shape, labelled), attach, start; its launcher, PID 1,
         says it is ready and waits for the request on stdin.
launch:  send the request (header, code, files, stdin), read the framed output
         under the output cap and our deadline; on either, or on abuse of the
         protocol, kill the container (SIGKILL to PID 1 ends everything in it).
finish:  once the stream has ended (the launcher collected the files after
         everything else in the container died, then exited), ask the engine
         how it ended (exit code, OOMKilled) and decide the status.
dispose: remove the container (forcefully), whatever happened.

With a network boundary (runc), make also furnishes the container's network
namespace (/proc/PID1/ns/net) with the gateway's egress proxy, resolver and
recorder (backends/egress/), and launch tells the program about the proxy. With
gVisor (whose netstack sees no host socket) make first makes a namespace linked
to a sinkhole the gateway serves (backends/egress/veth.py), and the container's
runtime puts the sandbox in it (EGRESS_NETNS_VARIABLE, read and removed by
deploy/docker/runsc-netns).

A container is launched at most once and removed afterwards; `docker exec` is
never used. Names and labels make every container traceable to its gateway.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import os
import secrets
import signal
import time
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass

from backends.attempts import close_fd, exited, open_pidfd, raise_start_error
from backends.base import BackendError, ExecResult, ExecSpec, SandboxStartError, pass_gate
from backends.cgroups import remove_container_leftovers
from backends.docker.config import (
    Shape,
    ahead_program,
    container_request,
    launch_request,
    reads_unbuffered,
)
from backends.docker.engine import Engine
from backends.docker.protocol import Caps, FrameReader, ProtocolError, request_header
from backends.docker.reaper import Instance
from backends.docker.settings import DockerSettings
from backends.docker.status import Observed, decide, program_end
from backends.egress.addresses import NameResolver
from backends.egress.boundary import BoundaryError, BoundaryFds, open_boundary
from backends.egress.session import EgressSession
from backends.egress.veth import RELAY_TARGET, open_veth_boundary
from backends.handover import python_source

log = logging.getLogger(__name__)

READ_CHUNK = 1 << 16
# The container's variable that names its network namespace for the runtime
# (runsc-egress), which takes it out of the spec before the sandbox starts.
EGRESS_NETNS_VARIABLE = "EXECGATE_NETNS"
# After the kill, how long the stream and the engine may take to report the end.
SETTLE_TIMEOUT_S = 15.0


@dataclass(slots=True)
class Container:
    id: str
    name: str
    shape: Shape
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    frames: FrameReader
    created: float = dataclasses.field(default_factory=time.monotonic)
    stop: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    egress: EgressSession | None = None
    # Readable once the container's first process has exited:
    # a container made ahead that died while it waited is noticed before it is used.
    pidfds: tuple[int, ...] = ()
    # The host pid of its first process (the launcher), as the engine reported it.
    pid: int = 0

    @property
    def alive(self) -> bool:
        """Still waiting for its request (its launcher has not gone away)."""
        return not self.reader.at_eof() and not self.writer.is_closing()


@dataclass(frozen=True, slots=True)
class Outcome:
    deadline_hit: bool
    stopped: bool
    protocol_error: str
    duration_ms: int


class ContainerFactory:
    def __init__(
        self,
        settings: DockerSettings,
        engine: Engine,
        instance: Instance,
        backend_name: str,
        image: str,
        launcher: Sequence[str],
        seccomp_json: str,
        boundary: bool = False,
        egress_runtime: str = "",
        resolver: NameResolver | None = None,
        etc_dir: str = "",
    ) -> None:
        self.settings = settings
        self.resolver = resolver
        self.etc_dir = etc_dir
        self.engine = engine
        self.instance = instance
        self.backend_name = backend_name
        self.image = image
        self.launcher = launcher
        self.seccomp_json = seccomp_json
        self.boundary = boundary
        # Non-empty: the boundary is a namespace the gateway makes (veth.py), which
        # this runtime puts the sandbox in.
        self.egress_runtime = egress_runtime
        self._counter = itertools.count(1)
        # Names of containers this factory made and has not removed yet (the reaper
        # leaves them alone), including those being created right now.
        self.tracked: set[str] = set()

    # --- make -------------------------------------------------------------------

    async def make(self, shape: Shape, execution_id: str = "") -> Container:
        """A started container whose launcher waits for its request; raises
        SandboxStartError (with the stage that failed) and leaves nothing behind."""
        name = f"{self.instance.name_prefix}-{next(self._counter)}"
        labels = self.instance.labels(self.backend_name, execution_id)
        ahead = None
        if shape.language:
            relay = list(RELAY_TARGET) if self.boundary and self.egress_runtime else None
            ahead = ahead_program(self.settings, shape.language, self.boundary, relay)
        body = container_request(
            self.settings, self.image, shape, labels, self.launcher, self.seccomp_json,
            self.etc_dir, ahead,
        )  # fmt: skip
        egress: EgressSession | None = None
        joined = self.boundary and bool(self.egress_runtime)
        if joined:
            egress = await self._furnish(0, veth=True)
            # The runtime opens the namespace through this process's descriptor, at
            # the container's start (before this descriptor can close). The network
            # stays "none" to the engine: no libnetwork hook, its own /etc files.
            body["Env"].append(
                f"{EGRESS_NETNS_VARIABLE}=/proc/{os.getpid()}/fd/{egress.fds.sandbox}"
            )
            body["HostConfig"]["Runtime"] = self.egress_runtime
        self.tracked.add(name)
        try:
            cid = await self.engine.create(body, name)
        except BaseException as exc:
            self.tracked.discard(name)  # never created, or the reaper will find it
            if egress is not None:
                await asyncio.shield(egress.stop())
            raise_start_error("create", exc)
        stage = "start"
        container: Container | None = None
        try:
            reader, writer = await self.engine.attach(cid)
            container = Container(cid, name, shape, reader, writer, FrameReader(_no_caps()))
            container.egress = egress
            await self.engine.start(cid)
            stage = "ready"
            async with asyncio.timeout(self.settings.start_timeout_s):
                await self._until_ready(container)
            pid = int((await self.engine.state(cid)).get("Pid") or 0)
            if not pid:
                raise BackendError("the sandbox container has no process")
            container.pid = pid
            # None when the engine's pids are not ours to see (the gateway in a
            # container of its own): the stream's end is the remaining sign.
            if (pidfd := open_pidfd(pid)) >= 0:
                container.pidfds += (pidfd,)
            if self.boundary and not joined:
                stage = "boundary"
                container.egress = await self._furnish(pid)
            elif joined:
                stage = "boundary"
                assert egress is not None and egress.fds.sandbox is not None
                in_namespace(pid, egress.fds.sandbox)
        except BaseException as exc:
            for fd in container.pidfds if container is not None else ():
                close_fd(fd)
            await asyncio.shield(self._remove(cid, name, failed_start=True))
            if egress is not None:
                await asyncio.shield(egress.stop())
            if isinstance(exc, TimeoutError):
                raise SandboxStartError(
                    stage, "the sandbox container did not become ready"
                ) from exc
            raise_start_error(stage, exc)
        return container

    async def _furnish(self, pid: int, veth: bool = False) -> EgressSession:
        """An egress session on container PID's namespace, or (veth) on a new one."""
        try:
            fds: BoundaryFds
            if veth:
                fds = await asyncio.to_thread(open_veth_boundary)
            else:
                fds = await asyncio.to_thread(open_boundary, f"/proc/{pid}/ns/net")
        except BoundaryError as exc:
            raise SandboxStartError("boundary", str(exc)) from exc
        session = EgressSession(fds, self.resolver)
        try:
            await session.start()
        except BaseException:
            await asyncio.shield(session.stop())
            raise
        return session

    def dead(self, container: Container) -> str:
        """Why a container made ahead can no longer take a request ("": it can)."""
        if not container.alive:
            return f"{container.name}: its launcher's stream has ended"
        if any(exited(fd) for fd in container.pidfds):
            return f"{container.name}: its container has exited"
        return ""

    async def _until_ready(self, container: Container) -> None:
        frames = container.frames
        while not frames.got.ready:
            chunk = await container.reader.read(READ_CHUNK)
            if not chunk:
                detail = frames.got.diagnostics.decode(errors="replace").strip()[-500:]
                raise BackendError(f"the sandbox launcher did not start: {detail or 'no output'}")
            try:
                frames.feed(chunk)
            except ProtocolError as exc:
                raise BackendError(f"the sandbox launcher misbehaved: {exc}") from exc

    # --- launch -----------------------------------------------------------------

    async def execute(
        self, container: Container, spec: ExecSpec, ready: Awaitable[object] | None = None
    ) -> Outcome:
        """Hand the request over and follow it to its end. The hand-over waits for
        the spec's gate (the gateway's durable record of the start) and for `ready`
        (a subclass's own preparation): both overlap the request's framing."""
        s = self.settings
        try:
            code = spec.code.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise BackendError(f"code is not valid UTF-8: {exc}") from None
        container.frames.nonce = secrets.token_hex(16)
        container.frames.on_output = spec.on_output
        container.frames.caps = Caps(
            output_bytes=spec.limits.output_bytes,
            max_files=s.max_output_files,
            max_file_bytes=s.max_output_file_bytes,
            max_total_bytes=s.max_output_total_bytes,
        )
        # What an interpreter started ahead reads through its pipe, where it differs
        # from the code file (backends/handover.py).
        payload = b""
        if container.shape.language == "python" and (source := python_source(code)) != code:
            payload = source
        proxy = container.egress is not None
        fresh = bool(container.shape.language) and (
            reads_unbuffered(s, spec.language) and len(code) > s.ahead_unbuffered_max_bytes
        )
        header = launch_request(
            s, spec, code, container.frames.nonce, proxy=proxy, pipe_bytes=len(payload),
            fresh=fresh,
        )  # fmt: skip
        if container.egress is not None:
            container.egress.arm(spec.egress, spec.credentials, spec.internal_allow)
            if self.egress_runtime and not container.shape.language:
                header["proxy_relay"] = list(RELAY_TARGET)
        parts = [request_header(header), code, payload]
        parts += [f.content for f in spec.files] + [spec.stdin]
        await pass_gate(spec)
        if ready is not None:
            await ready
        started = time.monotonic()
        hit = asyncio.Event()
        protocol_error: list[str] = []
        feed = asyncio.ensure_future(_feed(container.writer, parts))
        pump = asyncio.ensure_future(_pump(container, hit, protocol_error))
        watched = {
            pump,
            asyncio.ensure_future(hit.wait()),
            asyncio.ensure_future(container.stop.wait()),
        }
        deadline_hit = False
        try:
            try:
                async with asyncio.timeout(spec.limits.timeout_s):
                    await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
            except TimeoutError:
                deadline_hit = True
            if not pump.done():
                await self.engine.kill(container.id)
            async with asyncio.timeout(SETTLE_TIMEOUT_S):
                await pump
        except TimeoutError as exc:
            raise BackendError("the sandbox container did not stop after the kill") from exc
        finally:
            for task in (*watched, feed):
                if not task.done():
                    task.cancel()
            container.writer.close()
        return Outcome(
            deadline_hit=deadline_hit and not container.frames.got.output_limit_hit,
            stopped=container.stop.is_set(),
            protocol_error=protocol_error[0] if protocol_error else "",
            duration_ms=int((time.monotonic() - started) * 1000),
        )

    # --- finish -----------------------------------------------------------------

    async def finish(self, container: Container, spec: ExecSpec, outcome: Outcome) -> ExecResult:
        got = container.frames.finish()
        report = got.report
        if report is not None and "setup_error" in report:
            raise BackendError(
                f"cannot prepare the sandbox for this request: {report['setup_error']}"
            )
        # The engine's word when there is no report, or when the program was SIGKILLed
        # (the OOM killer's signal). Otherwise the report is the whole story and the
        # container, whose every process but the exiting launcher is dead, is not
        # waited for.
        exit_code: int | None = None
        oom_killed = False
        if report is None or program_end(report)[1] == signal.SIGKILL:
            exit_code = await self.engine.wait(container.id, SETTLE_TIMEOUT_S)
            if exit_code != 0:
                oom_killed = bool((await self.engine.state(container.id)).get("OOMKilled"))
        protocol_error = outcome.protocol_error
        ended_by_us = outcome.deadline_hit or outcome.stopped or got.output_limit_hit
        if report is None and not (ended_by_us or protocol_error) and (exit_code or 0) < 128:
            # With runc only a launcher bug gets here; under gVisor the program can
            # garble the stream itself. Either way it ended this execution, not the
            # backend: a result, with the launcher's diagnostics in the log.
            protocol_error = (
                "the stream ended inside a frame"
                if container.frames.cut
                else f"no exit report from the launcher (exit {exit_code})"
            )
            detail = got.diagnostics.decode(errors="replace").strip()[-500:]
            log.warning("docker: %s: %s (%s)", container.name, protocol_error, detail)
        verdict = decide(
            Observed(
                exit_code=exit_code,
                oom_killed=oom_killed,
                report=got.report,
                output_limit_hit=got.output_limit_hit,
                deadline_hit=outcome.deadline_hit,
                stopped=outcome.stopped,
                protocol_error=protocol_error,
                skipped_files=tuple(got.skipped),
            ),
            spec.limits,
        )
        return ExecResult(
            status=verdict.status,
            exit_code=verdict.exit_code,
            stdout=bytes(got.stdout),
            stderr=bytes(got.stderr),
            truncated_stdout=got.truncated_stdout,
            truncated_stderr=got.truncated_stderr,
            duration_ms=outcome.duration_ms,
            usage=verdict.usage,
            files=tuple(got.files) if verdict.report_trusted else (),
            events=verdict.events,
        )

    # --- dispose ----------------------------------------------------------------

    async def release(self, container: Container) -> None:
        """Let go of what the gateway holds for a container (its stream, its pidfds,
        its egress session): at once, while its removal by the engine may wait its
        turn (idempotent; never raises)."""
        container.writer.close()
        for fd in container.pidfds:
            close_fd(fd)
        container.pidfds = ()
        if container.egress is not None:
            await container.egress.stop()

    async def dispose(self, container: Container) -> None:
        """Remove a container in whatever state it is (never raises)."""
        await self.release(container)
        await self._remove(container.id, container.name)

    async def _remove(self, cid: str, name: str, failed_start: bool = False) -> None:
        try:
            await self.engine.remove(cid)
        except BackendError as exc:
            # Untracked from now on: the reaper finds it by its labels and retries.
            log.error("docker: cannot remove sandbox container %s: %s", name, exc)
            return
        finally:
            self.tracked.discard(name)
        if failed_start:
            # A runtime that failed part-way (runsc: "cannot create sandbox") can
            # leave the container's empty cgroups behind; nobody else would remove them.
            removed = await asyncio.to_thread(remove_container_leftovers, cid)
            if removed:
                log.info("docker: removed %d cgroups left by %s", len(removed), name)


def in_namespace(pid: int, netns_fd: int) -> None:
    """Check that the runtime put the sandbox (the engine's pid for a runsc container
    is its Sentry's process) in the network namespace behind `netns_fd`: a gateway
    that does not see the engine's pids as they are (another pid namespace) would
    otherwise have named some other process's descriptor."""
    try:
        seen, made = os.stat(f"/proc/{pid}/ns/net"), os.fstat(netns_fd)
    except OSError as exc:
        raise BackendError(f"cannot see the sandbox's network namespace: {exc}") from exc
    if (seen.st_dev, seen.st_ino) != (made.st_dev, made.st_ino):
        raise BackendError(
            "the sandbox is not in the network namespace the gateway made for it"
            " (the gateway must run in the engine's pid namespace)"
        )


def _no_caps() -> Caps:
    return Caps(output_bytes=0, max_files=0, max_file_bytes=0, max_total_bytes=0)


async def _feed(writer: asyncio.StreamWriter, parts: list[bytes]) -> None:
    # The program may end without reading its stdin: the container goes, the pipe breaks.
    with contextlib.suppress(ConnectionError, OSError):
        for part in parts:
            writer.write(part)
            await writer.drain()


async def _pump(container: Container, hit: asyncio.Event, protocol_error: list[str]) -> None:
    """Read the stream to its end (the container's), parsing while it makes sense."""
    frames = container.frames
    with contextlib.suppress(ConnectionError, OSError):
        while chunk := await container.reader.read(READ_CHUNK):
            if protocol_error:
                continue  # drained, not parsed: the container is being killed
            try:
                frames.feed(chunk)
            except ProtocolError as exc:
                protocol_error.append(str(exc))
                hit.set()
            if frames.got.output_limit_hit:
                hit.set()
            if frames.got.report is not None:
                return  # the launcher's last word: nothing of the program is left
