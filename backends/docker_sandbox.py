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

A container is launched at most once and removed afterwards; `docker exec` is
never used. Names and labels make every container traceable to its gateway.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import secrets
import signal
import time
from dataclasses import dataclass

from backends.base import BackendError, ExecResult, ExecSpec
from backends.docker_config import Shape, container_request, launch_request
from backends.docker_engine import Engine
from backends.docker_protocol import Caps, FrameReader, ProtocolError, request_header
from backends.docker_reaper import Instance
from backends.docker_settings import DockerSettings
from backends.docker_status import Observed, decide, program_end

log = logging.getLogger(__name__)

READ_CHUNK = 1 << 16
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
        launcher: str,
        seccomp_json: str,
    ) -> None:
        self.settings = settings
        self.engine = engine
        self.instance = instance
        self.backend_name = backend_name
        self.image = image
        self.launcher = launcher
        self.seccomp_json = seccomp_json
        self._counter = itertools.count(1)
        # Names of containers this factory made and has not removed yet (the reaper
        # leaves them alone), including those being created right now.
        self.tracked: set[str] = set()

    # --- make -------------------------------------------------------------------

    async def make(self, shape: Shape, execution_id: str = "") -> Container:
        name = f"{self.instance.name_prefix}-{next(self._counter)}"
        labels = self.instance.labels(self.backend_name, execution_id)
        body = container_request(
            self.settings, self.image, shape, labels, self.launcher, self.seccomp_json
        )
        self.tracked.add(name)
        try:
            cid = await self.engine.create(body, name)
        except BaseException:
            self.tracked.discard(name)  # never created, or the reaper will find it
            raise
        try:
            reader, writer = await self.engine.attach(cid)
            container = Container(cid, name, shape, reader, writer, FrameReader(_no_caps()))
            await self.engine.start(cid)
            async with asyncio.timeout(self.settings.start_timeout_s):
                await self._until_ready(container)
        except BaseException as exc:
            await asyncio.shield(self._remove(cid, name))
            if isinstance(exc, TimeoutError):
                raise BackendError("the sandbox container did not become ready") from exc
            raise
        return container

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

    async def execute(self, container: Container, spec: ExecSpec) -> Outcome:
        s = self.settings
        try:
            code = spec.code.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise BackendError(f"code is not valid UTF-8: {exc}") from None
        container.frames.nonce = secrets.token_hex(16)
        container.frames.caps = Caps(
            output_bytes=spec.limits.output_bytes,
            max_files=s.max_output_files,
            max_file_bytes=s.max_output_file_bytes,
            max_total_bytes=s.max_output_total_bytes,
        )
        header = launch_request(s, spec, code, container.frames.nonce)
        parts = [request_header(header), code]
        parts += [f.content for f in spec.files] + [spec.stdin]
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

    async def dispose(self, container: Container) -> None:
        """Remove a container in whatever state it is (never raises)."""
        container.writer.close()
        await self._remove(container.id, container.name)

    async def _remove(self, cid: str, name: str) -> None:
        try:
            await self.engine.remove(cid)
        except BackendError as exc:
            # Untracked from now on: the reaper finds it by its labels and retries.
            log.error("docker: cannot remove sandbox container %s: %s", name, exc)
        finally:
            self.tracked.discard(name)


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
