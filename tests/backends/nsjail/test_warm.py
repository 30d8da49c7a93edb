"""Zero cold start on nsjail, for real: interpreters started ahead run code as cold ones.

Each program runs twice, on a backend whose sandboxes start their interpreter
ahead (the default) and on one that starts it at launch, and everything the
program can tell about how it was started must agree: `__main__`, its file name
in tracebacks, `sys.argv`, open descriptors, loaded modules, exit status and
signals, stdin, output caps. Then hostile: what one execution leaves anywhere it
can write is looked for by the next, in a sandbox made while the first ran.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from backends.base import ExecResult, Status
from backends.capture.host import idle_child
from backends.nsjail.backend import NsjailBackend
from backends.nsjail.settings import NsjailSettings
from tests.backends.conformance import run
from tests.backends.conftest import assert_nsjail_host_clean

pytestmark = pytest.mark.integration


@contextlib.asynccontextmanager
async def backend_with(settings: NsjailSettings, **update: object) -> AsyncIterator[NsjailBackend]:
    backend = NsjailBackend(settings.model_copy(update=update))
    await backend.start()
    try:
        yield backend
    finally:
        await backend.close()


@pytest_asyncio.fixture
async def pair(
    nsjail_settings: NsjailSettings,
) -> AsyncIterator[tuple[NsjailBackend, NsjailBackend]]:
    async with (
        backend_with(nsjail_settings, warm_pool_size=1) as warm,
        backend_with(nsjail_settings, warm_pool_size=1, start_interpreter_ahead=False) as cold,
    ):
        yield warm, cold


def seen(result: ExecResult) -> tuple[object, ...]:
    return (result.status, result.exit_code, result.stdout, result.stderr,
            result.truncated_stdout)  # fmt: skip


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
    ("javascript", "throw", "function f() { return null.x }\nf()\n", {}),
    ("javascript", "exit", "process.exitCode = 5\n", {}),
]  # fmt: skip


@pytest.mark.parametrize(
    ("language", "code", "limits"),
    [(lang, code, limits) for lang, _, code, limits in CASES],
    ids=[f"{lang}-{name}" for lang, name, _, _ in CASES],
)
async def test_code_runs_as_it_would_have_cold(
    pair: tuple[NsjailBackend, NsjailBackend], language: str, code: str, limits: dict[str, float]
) -> None:
    warm, cold = pair
    await warm.wait_settled()
    stdin = b"the program's own stdin\n"
    hot = await run(warm, language, code, stdin=stdin, **limits)
    plain = await run(cold, language, code, stdin=stdin, **limits)
    assert seen(hot) == seen(plain), (hot.stderr, plain.stderr)


async def test_a_pooled_sandbox_waits_in_its_interpreter(nsjail_settings: NsjailSettings) -> None:
    async with backend_with(nsjail_settings, warm_pool_size=1) as backend:
        await backend.wait_settled()
        (sandbox,) = backend.waiting()
        assert sandbox.proc is not None
        init = await asyncio.to_thread(idle_child, sandbox.proc.pid, 10.0)
        # Started and blocked opening the code file's FIFO: its start-up is done.
        assert os.path.basename(os.readlink(f"/proc/{init}/exe")).startswith("python3")
        with open(f"/proc/{init}/wchan") as wchan:
            assert wchan.read() == "wait_for_partner"
        with open(f"/proc/{init}/cmdline", "rb") as cmdline:
            assert cmdline.read().split(b"\0")[-2] == b"/code/main.py"
        result = await run(backend, "python", "print(1)")
        assert (result.status, result.stdout) == (Status.OK, b"1\n")


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
print(f"left: {left} files, {len(open('/proc/sysvipc/shm').read().splitlines()) - 1} segment")
"""

LOOK = """
import os, sys
found = []
for d in ('/tmp', '/dev/shm', '/workspace', '/code'):
    found += [f'{d}/{n}' for n in os.listdir(d) if n != 'main.py']
found += [p for p in os.listdir('/proc') if p.isdigit() and p != str(os.getpid())]
found += [k for k in os.environ if 'ONE' in k] + [m for m in sys.modules if 'one' in m]
found += [l for l in open('/proc/sysvipc/shm').read().splitlines()[1:]]
print(found, open('/code/main.py').read() == open(__file__).read())
"""


async def test_nothing_of_one_execution_is_visible_to_the_next(
    nsjail_settings: NsjailSettings,
) -> None:
    async with backend_with(nsjail_settings, warm_pool_size=2) as backend:
        await backend.wait_settled()
        first = await run(backend, "python", TRAIL)
        assert first.status == Status.OK, first.stderr
        # It did leave all of it where it ran (what the next ones look for).
        assert first.stdout.splitlines()[-1] == b"left: 6 files, 1 segment", first.stdout
        # The next ones were made before or while the first ran; neither sees it.
        for _ in range(3):
            second = await run(backend, "python", LOOK)
            assert (second.status, second.stdout) == (Status.OK, b"[] True\n"), second.stderr
        await assert_nsjail_host_clean(backend)


async def test_the_pool_follows_the_languages_asked_for(nsjail_settings: NsjailSettings) -> None:
    async with backend_with(nsjail_settings, warm_pool_size=2) as backend:
        await backend.wait_settled()
        assert backend.ready_languages() == {"python": 2}
        for _ in range(3):
            assert (await run(backend, "bash", "echo hi")).stdout == b"hi\n"
        await backend.wait_settled()
        assert backend.ready_languages() == {"bash": 2}
        for _ in range(3):
            assert (await run(backend, "javascript", "console.log(1)")).stdout == b"1\n"
        await backend.wait_settled()
        assert backend.ready_languages() == {"bash": 1, "javascript": 1}
        await assert_nsjail_host_clean(backend)
