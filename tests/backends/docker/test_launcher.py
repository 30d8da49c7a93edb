"""The launcher's own start-up (backends/docker/launcher.py), run on the host's
interpreter: what it imports, how its command runs it, and its JSON helpers
against the json module's."""

from __future__ import annotations

import ast
import contextlib
import fcntl
import hashlib
import json
import os
import pathlib
import subprocess
import sys

import pytest

from backends.docker import launcher
from backends.docker.config import LAUNCHER_SOURCE, launcher_command
from tests.components import missing_component

ROOT = pathlib.Path(__file__).resolve().parents[3]
PYTHON = "/usr/bin/python3"  # the sandbox image's interpreter is Debian's too
# Modules whose import cost every container start paid for little use (the launcher
# header says why); a request without input files needs none of them.
NOT_AT_START = {
    "json",
    "re",
    "enum",
    "signal",
    "contextlib",
    "hashlib",
    "selectors",
    "ctypes",
    "struct",
    "socket",
}


def run_launcher(argv: list[str], stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [PYTHON, "-I", "-S", "-X", "importtime", *argv],
        input=stdin, capture_output=True, timeout=60, env={},
    )  # fmt: skip


def imported(stderr: bytes) -> set[str]:
    names = set()
    for line in stderr.decode().splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip())
    return names


@pytest.fixture(scope="module")
def command() -> list[str]:
    return launcher_command(LAUNCHER_SOURCE.read_text())


def test_the_compiled_launcher_starts_without_the_costly_modules(command: list[str]) -> None:
    # No request (the host went away): it announces itself and exits 0.
    proc = run_launcher(command)
    assert proc.returncode == 0, proc.stderr[-500:]
    assert proc.stdout == b"R\x00\x00\x00\x00"
    loaded = imported(proc.stderr)
    assert "os" in loaded  # the trace is there
    assert not loaded & NOT_AT_START


def test_an_interpreter_with_other_bytecode_compiles_the_source(command: list[str]) -> None:
    # Another magic number (another Python): the code is not even decoded (it is
    # not valid here, and would stop the launcher if it were).
    stub, _magic, _code, source = command[1:]
    other = ["-c", stub, "00000000", "not base64 !", source]
    proc = run_launcher(other)
    assert proc.returncode == 0, proc.stderr[-500:]
    assert proc.stdout == b"R\x00\x00\x00\x00"


def test_a_bad_request_header_is_refused_not_run(command: list[str]) -> None:
    # Trailing bytes after the JSON value: the launcher stops before anything runs.
    body = b'{"nonce": "n"} x'
    proc = run_launcher(command, len(body).to_bytes(4, "big") + body)
    assert proc.returncode != 0
    assert b"extra data" in proc.stderr


HEADERS = [
    {"a": 1, "b": [1, 2.5, -3e-2, True, False, None], "c": {"d": "e"}},
    {"unicode": 'é \u2028 \U0001f600 \\ " \n \t \x00', "nested": [[[]], {}]},
    [],
    "plain",
    12345678901234567890,
]


@pytest.mark.parametrize("value", HEADERS)
def test_json_loads_reads_what_the_host_writes(value: object) -> None:
    for text in (
        json.dumps(value),
        json.dumps(value, ensure_ascii=False),
        json.dumps(value, indent=2),
    ):
        assert launcher.json_loads(text) == value


@pytest.mark.parametrize("text", ["", "{", '{"a": 1} {}', '{"a": NaN}', "Infinity", "[1,]", "'a'"])
def test_json_loads_refuses_what_is_not_one_json_value(text: str) -> None:
    with pytest.raises(ValueError):
        launcher.json_loads(text)


REPORTS = [
    {"nonce": "abc", "wait_status": 0, "backstop": False, "disk_full": True, "cpu_ms": 12},
    {"nonce": "n", "setup_error": "input file 'a\"\\\n\x01\u2028\U0001f600\udc80' is odd"},
    {"nonce": "n", "wait_status": None, "max_rss_kb": 2**40},
]


@pytest.mark.parametrize("report", REPORTS)
def test_json_dumps_writes_what_the_host_reads(report: dict[str, object]) -> None:
    text = launcher.json_dumps(report)
    assert text.isascii()
    assert json.loads(text) == report
    assert text == json.dumps(report, separators=(",", ":"))


def test_the_launcher_makes_itself_not_dumpable_without_ctypes() -> None:
    # PR_GET_DUMPABLE (3) after the launcher's own call: 0, so the program (same uid)
    # can neither ptrace PID 1 nor open its /proc entries.
    probe = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('launcher', {str(LAUNCHER_SOURCE)!r})\n"
        "launcher = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(launcher)\n"
        "launcher.not_dumpable()\n"
        "assert 'ctypes' not in sys.modules\n"
        "import ctypes\n"
        "print(ctypes.CDLL(None).prctl(3, 0, 0, 0, 0))\n"
    )
    proc = subprocess.run([PYTHON, "-I", "-c", probe], capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-500:]
    assert proc.stdout == b"0\n"


# The gVisor proxy relay, run on the host in a network namespace of its own (loopback
# only): an echo server stands for the gateway's proxy. Until the relay is serving,
# the harness uses only C modules, so what is loaded then is the relay's doing.
RELAY_HARNESS = r"""
import _socket, _thread, sys
namespace = {"__name__": "launcher"}
exec(compile(open(sys.argv[1]).read(), "launcher.py", "exec"), namespace)

echo = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
echo.bind(("127.0.0.1", 0))
echo.listen(8)
def answer():
    while True:
        fd, _ = echo._accept()
        conn = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM, 0, fd)
        while data := conn.recv(65536):
            conn.sendall(data)
        conn.shutdown(_socket.SHUT_WR)  # the program must see the far end's close
        conn.close()
_thread.start_new_thread(answer, ())
serve, stop = namespace["start_relay"](list(echo.getsockname()))
serve()
loaded = sorted({"socket", "selectors", "enum"} & set(sys.modules))

import json, socket
sent = bytes(range(256)) * 1024
echoed = []
for _ in range(3):  # one after another: each connection gets its own threads
    with socket.create_connection(("127.0.0.1", 3128), timeout=10) as c:
        c.sendall(sent)
        c.shutdown(socket.SHUT_WR)
        got = b""
        while chunk := c.recv(65536):
            got += chunk
        echoed.append(got == sent)
stop()
try:
    socket.create_connection(("127.0.0.1", 3128), timeout=5).close()
    after_stop = "connected"
except OSError as exc:
    after_stop = type(exc).__name__
print(json.dumps({"loaded": loaded, "echoed": echoed, "after_stop": after_stop}))
"""


def test_the_relay_carries_both_directions_without_the_socket_module() -> None:
    if os.geteuid() != 0:
        missing_component("a network namespace of the test's own needs root")
    proc = subprocess.run(
        ["unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$@"', "relay",
         PYTHON, "-I", "-S", "-c", RELAY_HARNESS, str(LAUNCHER_SOURCE)],
        capture_output=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout) == {
        "loaded": [],
        "echoed": [True, True, True],
        "after_stop": "ConnectionRefusedError",
    }


def test_code_from_memory_goes_on_where_a_small_pipe_stopped_it() -> None:
    # A pipe can be one page (a user over pipe-user-pages-soft gets no more): what
    # does not fit waits for room, and the pipe's end comes after the last byte.
    code = bytes(range(256)) * 40  # 10 KiB
    read_end, write_end = os.pipe2(os.O_NONBLOCK)
    try:
        fcntl.fcntl(write_end, launcher.F_SETPIPE_SZ, 4096)
        fifo, left = launcher.feed_code(write_end, memoryview(code))
        assert fifo == write_end and 0 < len(left) < len(code)
        got = os.read(read_end, 1 << 16)
        while fifo >= 0:
            fifo, left = launcher.feed_code(fifo, left)
            got += os.read(read_end, 1 << 16)
        assert got == code and os.read(read_end, 1) == b""  # closed: the end
    finally:
        os.close(read_end)
        with contextlib.suppress(OSError):
            os.close(write_end)


def test_a_reader_gone_ends_the_feed_from_memory() -> None:
    read_end, write_end = os.pipe2(os.O_NONBLOCK)
    os.close(read_end)
    assert launcher.write_some(write_end, memoryview(b"print(1)\n")) is None  # EPIPE
    assert launcher.feed_code(write_end, memoryview(b"print(1)\n")) == (-1, -1)
    with pytest.raises(OSError):
        os.fstat(write_end)  # closed by the feed


def test_input_digests_are_those_of_hashlib() -> None:
    assert launcher.sha256(b"abc").digest() == hashlib.sha256(b"abc").digest()


# Imports inside functions, which would run during a request (its latency; under gVisor,
# file lookups in the execution's syscall trace): only where the C modules are missing,
# and the gVisor proxy relay, bound before the program starts.
LATE_IMPORTS_ALLOWED = {"json_loads": {"json"}, "json_dumps": {"json"},
                        "not_dumpable": {"ctypes"},
                        "start_relay": {"_thread", "_socket"}}  # fmt: skip


def test_nothing_is_imported_once_a_request_has_come() -> None:
    tree = ast.parse(LAUNCHER_SOURCE.read_text())
    late: dict[str, set[str]] = {}
    for function in ast.walk(tree):
        if not isinstance(function, ast.FunctionDef):
            continue
        for node in ast.walk(function):
            if isinstance(node, ast.Import):
                late.setdefault(function.name, set()).update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                late.setdefault(function.name, set()).add(node.module or "")
    assert late == LATE_IMPORTS_ALLOWED


REHEARSAL = r"""
import json, os, sys
sys.path.insert(0, sys.argv[1])
from backends.docker import launcher
launcher.CODE_DIR, launcher.WORKSPACE = sys.argv[2], sys.argv[3]
wake_r, wake_w = os.pipe()
launcher.rehearse(wake_r)
print(json.dumps({"ok": True}))
"""


def snapshot(root: pathlib.Path) -> dict[str, tuple[int, bytes]]:
    found = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        content = path.read_bytes() if path.is_file() and not path.is_symlink() else b""
        found[str(path.relative_to(root))] = (st.st_mode, content)
    return found


def test_the_rehearsal_leaves_nothing_behind_and_says_nothing(tmp_path: pathlib.Path) -> None:
    # What a request would find odd in the workspace (a link, a FIFO, a name that is
    # not UTF-8, a directory) is rehearsed over without a frame; the code directory
    # keeps its files and its mode, and the stand-ins are gone.
    code, workspace = tmp_path / "code", tmp_path / "workspace"
    code.mkdir(mode=0o755)
    os.mkfifo(code / "main.py", 0o644)
    workspace.mkdir()
    (workspace / "sub").mkdir()
    (workspace / "sub" / "data.txt").write_bytes(b"data")
    (workspace / "link").symlink_to("/etc/passwd")
    os.mkfifo(workspace / "fifo")
    (workspace / os.fsdecode(b"\xff-not-utf8")).write_bytes(b"x")
    before = (snapshot(code), snapshot(workspace), os.stat(code).st_mode)
    proc = subprocess.run(
        [sys.executable, "-I", "-c", REHEARSAL, str(ROOT), str(code), str(workspace)],
        capture_output=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout == b'{"ok": true}\n'  # no frame before it
    assert (snapshot(code), snapshot(workspace), os.stat(code).st_mode) == before


def test_a_rehearsal_that_cannot_write_is_only_skipped(tmp_path: pathlib.Path) -> None:
    missing = tmp_path / "absent"
    proc = subprocess.run(
        [sys.executable, "-I", "-c", REHEARSAL, str(ROOT), str(missing), str(missing)],
        capture_output=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout == b'{"ok": true}\n'
    assert not missing.exists()


def test_reaping_imports_nothing() -> None:
    # os.wait4 imports `resource` for the usage it returns, on every call: the
    # launcher has it from its start-up, not at the first reap, during a request.
    script = (
        "import os, sys; sys.path.insert(0, sys.argv[1])\n"
        "from backends.docker import launcher\n"
        "before = set(sys.modules)\n"
        "pid = os.fork()\n"
        "if pid == 0: os._exit(0)\n"
        "usage = launcher.Usage()\n"
        "while launcher.reap(pid, usage) is None: pass\n"
        "print(sorted(set(sys.modules) - before))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-I", "-c", script, str(ROOT)], capture_output=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.decode().strip() == "[]"


# PID 1 of a private pid namespace (as the launcher is in its container) with what a
# program may leave behind: a chain that forks its successor and exits, processes
# forking as fast as they can, a stopped one, one that holds its orphans as a
# subreaper, one in a session of its own, the program's own zombie, and an orphan that
# used CPU and memory (the usage reported is summed from each process's wait4).
KILL_EVERYTHING = r"""
import ctypes, json, os, resource, signal, sys, time
sys.path.insert(0, sys.argv[1])
from backends.docker import launcher

def child(body):
    pid = os.fork()
    if pid == 0:
        try:
            body()
        finally:
            os._exit(0)
    return pid

def refork():
    while True:
        if os.fork() != 0:
            os._exit(0)

def breed():  # forks as fast as it can (bounded: the namespace has no pids limit)
    for _ in range(300):
        child(lambda: time.sleep(3600))
    while True:
        child(lambda: None)
        os.waitpid(-1, os.WNOHANG)

def stopped():
    os.kill(os.getpid(), signal.SIGSTOP)
    time.sleep(3600)

def subreaper():
    ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    for _ in range(3):
        child(lambda: child(lambda: time.sleep(3600)))
    time.sleep(3600)

def session():
    os.setsid()
    child(lambda: time.sleep(3600))
    time.sleep(3600)

program = child(lambda: os._exit(7))
for body in (refork, refork, breed, stopped, subreaper, session):
    child(body)
time.sleep(0.3)
def burn(done):  # CPU and memory of an orphan's, which only PID 1 reaps
    data = b"x" * (64 << 20)
    sum(range(3_000_000))
    os.write(done, b"1")
    time.sleep(3600)

burnt, done = os.pipe()
child(lambda: child(lambda: burn(done)))
os.read(burnt, 1)
usage = launcher.Usage()
status = launcher.kill_everything(usage, program)
left = sorted(int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != 1)
children = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({
    "status": status, "left": left, "cpu_s": usage.cpu_s, "max_rss_kb": usage.max_rss_kb,
    "children_cpu_s": children.ru_utime + children.ru_stime,
    "children_max_rss_kb": children.ru_maxrss,
}))
"""


def test_kill_everything_leaves_only_itself_and_reports_the_program() -> None:
    if os.geteuid() != 0:
        missing_component("a private pid namespace (unshare --pid) needs root")
    proc = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c",
         KILL_EVERYTHING, str(ROOT)],
        capture_output=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = json.loads(proc.stdout.decode().strip().splitlines()[-1])
    assert found["left"] == []  # nothing but PID 1 in the namespace
    assert os.WIFEXITED(found["status"]) and os.WEXITSTATUS(found["status"]) == 7
    # What each reaped process's wait4 said, summed, is what the kernel counts for
    # all of PID 1's children: the orphan that burnt CPU and memory included (each
    # wait4 rounds down to a microsecond, and the forking ones leave hundreds).
    assert found["cpu_s"] == pytest.approx(found["children_cpu_s"], rel=0.01)
    assert found["cpu_s"] > 0.02
    assert found["max_rss_kb"] == found["children_max_rss_kb"] > 64 << 10
