"""Programs that tell how they were started, and traces one execution leaves for the
next: shared by every backend whose sandboxes start their interpreter ahead
(tests/backends/nsjail/test_warm.py, tests/backends/docker/test_warm.py)."""

from __future__ import annotations

from backends.base import ExecResult, SandboxBackend, Status
from tests.backends.conformance import run


def seen(result: ExecResult) -> tuple[object, ...]:
    return (result.status, result.exit_code, result.stdout, result.stderr,
            result.truncated_stdout)  # fmt: skip


async def assert_runs_as_cold(
    warm: SandboxBackend,
    cold: SandboxBackend,
    language: str,
    code: str,
    limits: dict[str, float],
) -> None:
    """The program, with its stdin, tells the same on both backends."""
    settle = getattr(warm, "wait_settled", None)
    if settle is not None:
        await settle()
    stdin = b"the program's own stdin\n"
    hot = await run(warm, language, code, stdin=stdin, **limits)
    plain = await run(cold, language, code, stdin=stdin, **limits)
    assert seen(hot) == seen(plain), (hot.stderr, plain.stderr)


PYTHON_SELF = """
import os, sys, __main__
print(sys.argv, sys.orig_argv, __name__, __file__, __main__.__file__, __spec__, __doc__)
print(type(__loader__).__name__, __loader__.name, __loader__.path, __package__, __cached__)
print(sorted(sys.modules))
print(sys.path, sys.flags)
print(sorted(os.listdir('/proc/self/fd')), os.getpid(), os.getppid())
print(sorted(k for k in os.environ), open('/proc/self/cmdline', 'rb').read())
print(len(open(__file__).read()))
print(sorted(os.listdir('/code')), sys.stdin.read())
"""

CASES: list[tuple[str, str, str, dict[str, float]]] = [
    ("python", "self", PYTHON_SELF, {}),
    ("python", "traceback", "def f():\n    return {}['missing']\n\nf()\n", {}),
    # Its own file first of all: in place (a regular file, not the FIFO) by then.
    ("python", "own-file-first", "import os, stat\nprint(stat.S_ISREG(os.stat(__file__).st_mode),"
     " os.listdir('/code'))\n", {}),
    ("python", "syntax", "print('unclosed'\n", {}),
    ("python", "exit-status", "import sys\nsys.exit(7)\n", {}),
    ("python", "exit-message", "raise SystemExit('gone')\n", {}),
    ("python", "interrupt", "raise KeyboardInterrupt\n", {}),
    ("python", "signal", "import os, signal\nos.kill(os.getpid(), signal.SIGTERM)\n", {}),
    ("python", "atexit", "import atexit\natexit.register(print, 'bye')\nprint('hi')\n", {}),
    ("python", "latin-1", "# -*- coding: latin-1 -*-\nprint(len('é'), ascii('é'))\n", {}),
    ("python", "output-cap", "print('x' * 100000)\n", {"output_bytes": 1000}),
    ("bash", "self", 'echo "$0" "$#" "$BASH_SOURCE" $$; cat "$0" | wc -c; read -r l; echo "$l"\n'
     "ls -a /code; ls /proc/self/fd | wc -l\n", {}),
    ("bash", "syntax", "if then fi\n", {}),
    ("bash", "exit", "exit 42\n", {}),
    ("bash", "signal", "kill -KILL $$\n", {}),
    ("javascript", "self",
     "console.log(process.argv, __filename, require.main === module, module.id,"
     " Object.keys(require.cache), process.execArgv, process.pid)\n"
     "console.log(require('fs').readFileSync(__filename, 'utf8').length)\n", {}),
    ("javascript", "own-file-first",
     "const fs = require('fs')\n"
     "console.log(fs.statSync(__filename).isFile(), fs.readdirSync('/code'))\n", {}),
    ("javascript", "throw", "function f() { return null.x }\nf()\n", {}),
    ("javascript", "exit", "process.exitCode = 5\n", {}),
]  # fmt: skip


TRAIL = """
import ctypes, os, subprocess, sys
for d in ('/tmp', '/dev/shm', '/workspace'):
    open(f'{d}/left-by-one', 'w').write('secret-of-one')
    os.mkfifo(f'{d}/fifo-of-one')
os.environ['LEFT_BY_ONE'] = '1'
ctypes.CDLL(None).shmget(0xC0DE, 4096, 0o1666)  # IPC_CREAT: a SysV segment left behind
subprocess.Popen(['sleep', '300'], start_new_session=True)
sys.modules['left_by_one'] = sys
left = sum(len(os.listdir(d)) for d in ('/tmp', '/dev/shm', '/workspace'))
segments = int(ctypes.CDLL(None).shmget(0xC0DE, 0, 0) >= 0)  # gVisor has no /proc/sysvipc
print(f"left: {left} files, {segments} segment")
"""

LOOK = """
import ctypes, os, sys
found = []
for d in ('/tmp', '/dev/shm', '/workspace', '/code'):
    found += [f'{d}/{n}' for n in os.listdir(d) if n != 'main.py']
cmdline = lambda p: open(f'/proc/{p}/cmdline', 'rb').read()
found += [p for p in os.listdir('/proc') if p.isdigit() and p != str(os.getpid())
          and cmdline(p) != cmdline(1)]  # docker: PID 1 is the launcher (and its relay)
found += [k for k in os.environ if 'ONE' in k] + [m for m in sys.modules if 'one' in m]
if ctypes.CDLL(None).shmget(0xC0DE, 0, 0) >= 0:
    found.append('the SysV segment')
print(found, open('/code/main.py').read() == open(__file__).read())
"""


async def assert_no_trail(backend: SandboxBackend) -> None:
    """One execution leaves traces everywhere it can (and is shown to have left
    them); the next three, in sandboxes made before or while it ran, see none."""
    first = await run(backend, "python", TRAIL)
    assert first.status == Status.OK, first.stderr
    assert first.stdout.splitlines()[-1] == b"left: 6 files, 1 segment", first.stdout
    for _ in range(3):
        second = await run(backend, "python", LOOK)
        assert (second.status, second.stdout) == (Status.OK, b"[] True\n"), second.stderr
