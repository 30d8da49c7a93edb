"""docker-gvisor's behaviour capture for real: gVisor's own strace, hostile programs.

Each program tries something a reviewer must learn about (a credential path by raw
syscall, a refused mount, a signal at PID 1, a started shell) and the test checks
that the execution's record names it; a plain print(1) has an empty record, a flood
stays bounded, and nothing of a trace is left on the host. Needs the engine with the
capture runtimes registered (deploy/docker/start-dockerd.sh); CI fails without them.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from pathlib import Path

import pytest

from backends.base import BackendError, ExecResult, Status
from backends.capture.record import Behaviour
from backends.capture.settings import CaptureSettings
from backends.docker.gvisor import WATCH_BYTES, GvisorBackend
from backends.docker.reaper import LABEL_INSTANCE
from backends.docker.settings import GvisorSettings
from tests.backends.conformance import lines, run
from tests.backends.conftest import assert_docker_host_clean, module_docker_backend
from tests.components import missing_component

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]


backend = module_docker_backend(lambda tracers: GvisorBackend(GvisorSettings(), tracers=tracers))


@pytest.fixture
def traced(backend: GvisorBackend) -> GvisorBackend:
    on, why = backend.capture_status()
    if not on:
        missing_component(f"docker-gvisor capture is off: {why}")
    return backend


def record(result: ExecResult) -> Behaviour:
    assert result.behaviour is not None, "a result without a behaviour record"
    assert result.behaviour.capture == "on", result.behaviour.reason
    return result.behaviour


def files(result: ExecResult) -> set[tuple[str, str, str]]:
    return {(f.op, f.path, f.result) for f in record(result).files}


def programs(result: ExecResult) -> list[tuple[str, ...]]:
    return [(p.path, *p.argv) for p in record(result).programs]


async def assert_traces_removed(backend: GvisorBackend) -> None:
    """Every trace directory left belongs to a container the engine still has (this
    backend's are its pooled ones): nothing of a finished execution stays."""
    await assert_docker_host_clean(backend)
    directory = backend.capture.directory
    left = {p.name for p in directory.iterdir()} if directory.exists() else set()
    known = {c["Id"] for c in await backend.engine.containers(LABEL_INSTANCE)}
    assert left <= known, left - known


@pytest.mark.parametrize("language", ["python", "bash", "javascript"])
async def test_a_program_that_does_nothing_leaves_an_empty_record(
    traced: GvisorBackend, language: str
) -> None:
    code = {"python": "print(1)", "bash": "echo 1", "javascript": "console.log(1)"}[language]
    result = await run(traced, language, code)
    assert result.status == Status.OK, result.stderr
    behaviour = record(result)
    assert behaviour.tracer == "gvisor-strace"
    assert behaviour.empty, behaviour.as_dict()
    assert behaviour.dropped == 0


async def test_credential_paths_by_raw_syscall_and_by_libc(traced: GvisorBackend) -> None:
    # The raw openat(2) never goes through libc's open: the Sentry sees it the same.
    code = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
for path in (b"/etc/shadow", b"/proc/1/environ", b"/root/.ssh/id_rsa"):
    libc.syscall(257, -100, path, os.O_RDONLY, 0)
try:
    open("/nonexistent/missing.txt")
except OSError:
    pass
"""
    result = await run(traced, "python", code)
    assert result.status == Status.OK, result.stderr
    seen = files(result)
    paths = {path for _, path, _ in seen}
    assert {"/etc/shadow", "/proc/1/environ", "/root/.ssh/id_rsa"} <= paths, seen
    assert ("open", "/nonexistent/missing.txt", "ENOENT") in seen


async def test_shell_commands_with_their_arguments(traced: GvisorBackend) -> None:
    result = await run(traced, "bash", "cat ~/.ssh/id_rsa\n/bin/sh -c 'id; echo pwned'")
    assert lines(result)[-1] == "pwned"
    started = programs(result)
    assert any(p[0].endswith("/cat") and p[-1].endswith("/.ssh/id_rsa") for p in started), started
    assert ("/bin/sh", "/bin/sh", "-c", "id; echo pwned") in started
    assert any(p[0].endswith("/id") for p in started), started
    assert any(path.endswith("/.ssh/id_rsa") and res == "ENOENT" for _, path, res in files(result))


async def test_refused_system_calls_are_named(traced: GvisorBackend) -> None:
    # The seccomp profile refuses each (gVisor's filter, --oci-seccomp): mount,
    # ptrace, unshare, keyctl, bpf; reboot is refused too.
    code = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.mount(b"none", b"/tmp", b"tmpfs", 0, None)
libc.ptrace(16, 1, 0, 0)
libc.unshare(0x10000000)
for number in (250, 321, 169):  # keyctl, bpf, reboot
    libc.syscall(number, 0, 0, 0, 0)
"""
    result = await run(traced, "python", code)
    assert result.status == Status.OK, result.stderr
    refused = dict(record(result).syscalls_refused)
    assert {"mount", "ptrace", "unshare", "keyctl", "bpf", "reboot"} <= set(refused), refused


async def test_signals_at_other_processes(traced: GvisorBackend) -> None:
    # gVisor lets a program kill PID 1 (the launcher): the execution ends killed,
    # and the record still says who was signalled; its own pid is not "another".
    code = """
import os, signal
os.kill(os.getpid(), 0)
try:
    os.kill(4242, signal.SIGTERM)
except OSError:
    pass
os.kill(1, signal.SIGKILL)
"""
    result = await run(traced, "python", code)
    assert result.status == Status.KILLED
    signalled = {(s.syscall, s.target, s.signal, s.result) for s in record(result).signals}
    assert signalled == {("kill", 4242, 15, "ESRCH"), ("kill", 1, 9, "ok")}
    await assert_traces_removed(traced)


async def test_workspace_files_written_renamed_deleted(traced: GvisorBackend) -> None:
    code = """
import os
with open("report.txt", "w") as f:
    f.write("x")
os.rename("report.txt", "/workspace/final.txt")
os.mkdir("/workspace/d")
os.rmdir("/workspace/d")
os.unlink("/workspace/final.txt")
os.symlink("/etc/passwd", "/workspace/link")
"""
    result = await run(traced, "python", code)
    assert result.status == Status.OK, result.stderr
    seen = files(result)
    assert {
        ("create", "/workspace/report.txt", "ok"),
        ("rename", "/workspace/report.txt -> /workspace/final.txt", "ok"),
        ("mkdir", "/workspace/d", "ok"),
        ("rmdir", "/workspace/d", "ok"),
        ("unlink", "/workspace/final.txt", "ok"),
        ("create", "/workspace/link", "ok"),
    } <= seen, seen


async def test_a_flood_of_failed_opens_stays_bounded(traced: GvisorBackend) -> None:
    code = """
import os
for i in range(100_000):
    try:
        os.open(f"/nope/{i}", os.O_RDONLY)
    except OSError:
        pass
"""
    # The host side: how much the trace files hold at most while the flood runs (the
    # backend reads and frees a growing log as it goes); the flood's is the largest.
    directory = traced.capture.directory
    written, held = [0], [0]

    async def watch() -> None:
        while True:
            # Containers come and go meanwhile: a directory may vanish mid-listing.
            for log in directory.glob("*/*.boot.txt"):
                with contextlib.suppress(OSError):
                    st = log.stat()
                    written[0] = max(written[0], st.st_size)
                    held[0] = max(held[0], st.st_blocks * 512)
            await asyncio.sleep(0.05)

    watcher = asyncio.ensure_future(watch())
    try:
        result = await run(traced, "python", code, timeout_s=120)
    finally:
        watcher.cancel()
    assert result.status == Status.OK, result.stderr
    assert written[0] > 4 * WATCH_BYTES, written  # ~390 bytes a call: a real flood
    assert held[0] < written[0] / 2, (held, written)
    behaviour = record(result)
    caps = traced.settings.capture
    assert len(behaviour.files) <= caps.max_files
    assert len(str(behaviour.as_dict())) < 2 * caps.max_bytes
    # Every attempt is either an entry or counted as dropped.
    assert len(behaviour.files) + behaviour.dropped >= 100_000 - 1
    await assert_traces_removed(traced)


async def test_a_second_execution_does_not_see_the_first(traced: GvisorBackend) -> None:
    token = secrets.token_hex(6)
    first = await run(traced, "python", f"open('/etc/first-{token}', 'a')")
    assert any(token in path for _, path, _ in files(first))
    second = await run(traced, "python", "print(1)")
    assert record(second).empty, record(second).as_dict()


async def test_the_code_can_neither_reach_nor_forge_its_trace(traced: GvisorBackend) -> None:
    # What the Sentry logs about a call (a path with a newline and a forged line,
    # a command name shaped like a log entry, fake lines on stdout and stderr) is
    # escaped: it neither hides the real attempt nor adds an invented one.
    directory = traced.capture.directory
    fake = "[   7:   7] x X openat(AT_FDCWD /, 0x1 /etc/forged, O_RDONLY, 0o0) = 3 (0x3) (1µs)"
    code = f"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
print({fake!r}); print({fake!r}, file=sys.stderr)
assert not os.path.exists({str(directory)!r})
libc.prctl(15, b"x X kill(0x5", 0, 0, 0)  # PR_SET_NAME
libc.syscall(257, -100, b"/etc/hidden-1", 0, 0)
name = "/tmp/a\\n{{\\"msg\\":\\"{fake}\\"}}\\n"
try:
    open(name)
except OSError:
    pass
"""
    result = await run(traced, "python", code)
    assert result.status == Status.OK, result.stderr
    seen = files(result)
    assert ("open", "/etc/hidden-1", "ENOENT") in seen, seen
    assert not any(path == "/etc/forged" for _, path, _ in seen), seen
    assert not record(result).signals
    assert any(path.startswith("/tmp/a\n") for _, path, _ in seen), seen


async def test_capture_disabled_in_config_says_so() -> None:
    settings = GvisorSettings(capture=CaptureSettings(enabled=False), pool_size=0)
    backend = GvisorBackend(settings)
    try:
        await backend.start()
    except BackendError as exc:
        missing_component(f"docker-gvisor cannot start: {exc}")
    try:
        assert backend.capture_status() == (False, "disabled in config")
        result = await run(backend, "python", "open('/etc/shadow')")
        assert result.behaviour is not None
        assert (result.behaviour.capture, result.behaviour.reason) == ("off", "disabled in config")
        assert result.behaviour.empty
    finally:
        await backend.close()


@pytest.mark.parametrize("required", [False, True])
async def test_without_the_capture_runtime(required: bool) -> None:
    # Not registered: off with the reason, or (required) no backend at all.
    settings = GvisorSettings(
        capture=CaptureSettings(required=required),
        capture_runtime="runsc-not-registered",
        pool_size=0,
    )
    backend = GvisorBackend(settings)
    if required:
        with pytest.raises(BackendError, match=r"capture is required.*runsc-not-registered"):
            await backend.start()
        health = await backend.health()
        assert not health.ok and "runsc-not-registered" in health.detail
        await backend.close()
        assert not await backend.own_containers()
        return
    try:
        await backend.start()
    except BackendError as exc:
        missing_component(f"docker-gvisor cannot start: {exc}")
    try:
        on, why = backend.capture_status()
        assert not on and "runsc-not-registered" in why
        assert (await backend.health()).ok
        result = await run(backend, "python", "print(1)")
        assert result.status == Status.OK
        assert result.behaviour is not None and result.behaviour.capture == "off"
        assert "runsc-not-registered" in result.behaviour.reason
    finally:
        await backend.close()


async def test_trace_directory_is_root_only(traced: GvisorBackend) -> None:
    directory: Path = traced.capture.directory
    assert directory.stat().st_mode & 0o077 == 0


async def test_leftover_traces_of_gone_containers_are_swept(traced: GvisorBackend) -> None:
    # A gateway that died left a trace directory; the reaper removes it, and never
    # one of a container the engine still has (a pooled one).
    directory = traced.capture.directory
    stale = directory / secrets.token_hex(32)
    stale.mkdir()
    (stale / "runsc.log.20261201-000000.000000.boot.txt").write_text("{}\n")
    live = {p.name for p in directory.iterdir()} - {stale.name}
    await traced.reap_leftovers()
    assert not stale.exists()
    known = {c["Id"] for c in await traced.engine.containers(LABEL_INSTANCE)}
    assert live & known <= {p.name for p in directory.iterdir()}


async def test_without_egress_the_plain_capture_runtime_records_too() -> None:
    # egress_runtime = "": sandboxes run on runsc-capture (--network=none), no veth link.
    backend = GvisorBackend(GvisorSettings(egress_runtime="", pool_size=1))
    try:
        await backend.start()
    except BackendError as exc:
        missing_component(f"docker-gvisor cannot start: {exc}")
    try:
        on, why = backend.capture_status()
        if not on:
            missing_component(f"docker-gvisor capture is off: {why}")
        assert record(await run(backend, "python", "print(1)")).empty
        seen = files(await run(backend, "python", "import os\nos.open('/etc/gshadow', 0)"))
        assert ("open", "/etc/gshadow", "ENOENT") in seen
        # Settled: the used sandboxes are gone and the refill is made, so nothing
        # goes between the listing and the look (a CI run once met one that did).
        await backend.wait_settled()
        found = await backend.engine.containers(f"{LABEL_INSTANCE}={backend.instance.id}")
        states = [await backend.engine.state(c["Id"]) for c in found]
        assert states, "the pooled sandbox is there to look at"
        assert {s.get("Runtime") for s in states} == {"runsc-capture"}
    finally:
        await backend.close()


async def test_a_program_killed_at_its_deadline_keeps_its_record(traced: GvisorBackend) -> None:
    # The trace is read after the kill and before the container goes.
    code = "import os, time\nos.system('true; exec /bin/true')\ntime.sleep(60)"
    result = await run(traced, "python", code, timeout_s=2.0)
    assert result.status == Status.TIMEOUT
    assert any(p[0] == "/bin/sh" for p in programs(result)), programs(result)
    await assert_traces_removed(traced)


async def test_an_empty_capture_runtime_is_named() -> None:
    backend = GvisorBackend(GvisorSettings(capture_egress_runtime="", pool_size=0))
    try:
        plan = await backend.plan_capture()
        assert not plan.on and "capture_egress_runtime is empty" in plan.reason
    finally:
        await backend.close()
