"""Hand-over of code through the FIFO on the code file's path, with real interpreters.

Each order in which the interpreter and the gateway can meet is driven for real:
the interpreter blocked opening the FIFO before the hand-over, arriving only
after the rename, and code larger than any pipe the kernel will size for us.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from backends.handover import (
    Staged,
    hand_over_nothing,
    is_fifo,
    place_fifo,
    python_source,
    stage,
)
from tests.components import missing_component

PY = [sys.executable, "-I"]


def write(path: Path, data: bytes) -> None:
    path.write_bytes(data)


def wait_blocked_on_fifo(proc: subprocess.Popen[bytes]) -> None:
    for _ in range(5000):
        if Path(f"/proc/{proc.pid}/wchan").read_text() == "wait_for_partner":
            return
        time.sleep(0.001)
    raise AssertionError("the interpreter never reached the FIFO")


async def hand_over(staged: Staged) -> None:
    rest = staged.deliver()
    if rest is not None:
        await rest


def start(path: Path, argv: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen([*argv, str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@pytest.mark.parametrize(
    ("argv", "filename", "code", "stdout"),
    [
        (PY, "main.py", b"import sys\nprint(sys.argv[0], __name__)\n", "{path} __main__\n"),
        (["/bin/bash"], "main.sh", b'echo "$0"; wc -c < "$0"\n', "{path}\n24\n"),
        (["/usr/bin/node"], "main.js", b"console.log(process.argv[1], __filename)\n",
         "{path} {path}\n"),
    ],
)  # fmt: skip
async def test_an_interpreter_waiting_on_the_fifo_runs_the_code_as_its_file(
    tmp_path: Path, argv: list[str], filename: str, code: bytes, stdout: str
) -> None:
    if not os.path.exists(argv[0]):
        missing_component(f"{argv[0]} is not installed")
    path = tmp_path / filename
    place_fifo(path)
    proc = start(path, argv)
    wait_blocked_on_fifo(proc)
    await hand_over(stage(path, code, code, write))
    out, err = proc.communicate(timeout=30)
    assert (proc.returncode, err) == (0, b"")
    assert out.decode() == stdout.format(path=path)
    assert path.read_bytes() == code and not is_fifo(path)  # what `cat $0` reads
    assert list(tmp_path.iterdir()) == [path]  # nothing staged is left


async def test_tracebacks_show_the_source_of_the_renamed_file(tmp_path: Path) -> None:
    path = tmp_path / "main.py"
    place_fifo(path)
    proc = start(path, PY)
    wait_blocked_on_fifo(proc)
    code = b"def f():\n    return 1 / 0\nf()\n"
    await hand_over(stage(path, code, code, write))
    _, err = proc.communicate(timeout=30)
    cold = await asyncio.to_thread(subprocess.run, [*PY, str(path)], capture_output=True)
    assert proc.returncode == cold.returncode == 1
    assert err == cold.stderr and b"return 1 / 0" in err


async def test_an_interpreter_arriving_after_the_rename_reads_the_file(tmp_path: Path) -> None:
    path = tmp_path / "main.py"
    place_fifo(path)
    code = b"print('late')\n"
    staged = stage(path, code, code, write)
    assert staged.deliver() is None  # the pipe holds it; nobody reads it
    proc = start(path, PY)  # only now: it opens the regular file
    out, _ = proc.communicate(timeout=30)
    assert (proc.returncode, out) == (0, b"late\n")


async def test_code_larger_than_the_biggest_pipe_is_fed_as_it_is_read(tmp_path: Path) -> None:
    path = tmp_path / "main.py"
    place_fifo(path)
    proc = start(path, PY)
    wait_blocked_on_fifo(proc)
    # 3 MiB: past pipe-max-size (1 MiB) unless the gateway may exceed it.
    code = b"x = 0\n" + b"x += 1\n" * (3 * 1024 * 1024 // 7) + b"print(x)\n"
    rest = stage(path, code, code, write).deliver()
    if rest is not None:
        await asyncio.wait_for(rest, 60)
    out, err = proc.communicate(timeout=60)
    assert (proc.returncode, err) == (0, b"")
    assert out == f"{3 * 1024 * 1024 // 7}\n".encode()


async def test_an_unread_rest_is_closed_when_abandoned(tmp_path: Path) -> None:
    path = tmp_path / "main.py"
    place_fifo(path)
    code = b"#" * (4 * 1024 * 1024)
    staged = stage(path, code, code, write)
    rest = staged.deliver()
    assert rest is not None  # nobody reads: the pipe is full
    task = asyncio.ensure_future(rest)
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert staged.fd == -1


def test_staging_refuses_anything_but_the_fifo(tmp_path: Path) -> None:
    path = tmp_path / "main.py"
    path.write_bytes(b"print('planted')\n")
    with pytest.raises(OSError):
        stage(path, b"print(1)\n", b"print(1)\n", write)
    assert path.read_bytes() == b"print('planted')\n"
    assert list(tmp_path.iterdir()) == [path]


@pytest.mark.parametrize(
    "code",
    [
        "# -*- coding: latin-1 -*-\nprint(len('é'), repr('é'))\n".encode(),
        "#!/usr/bin/env python3\n# vim: set fileencoding=cp1252 :\nprint(ascii('€'))\n".encode(),
        b"# coding: utf-8\nprint('ok')\n",
        "\ufeffprint('bom')\n".encode(),
        b"# coding: no-such-codec\nprint(1)\n",
        b"# coding: ascii\nprint('\xc3\xa9')\n",
    ],
    ids=["latin-1", "cp1252-line-2", "utf-8", "bom", "unknown", "undecodable"],
)
async def test_python_declaring_a_source_encoding_compiles_as_it_would_cold(
    tmp_path: Path, code: bytes
) -> None:
    cold_path = tmp_path / "cold" / "main.py"
    cold_path.parent.mkdir()
    cold_path.write_bytes(code)
    cold = await asyncio.to_thread(subprocess.run, [*PY, str(cold_path)], capture_output=True)
    path = tmp_path / "main.py"
    place_fifo(path)
    proc = start(path, PY)
    wait_blocked_on_fifo(proc)
    await hand_over(stage(path, code, python_source(code), write))
    out, err = proc.communicate(timeout=30)
    assert (proc.returncode, out) == (cold.returncode, cold.stdout)
    if cold.returncode == 0:
        assert err == cold.stderr == b""
    else:  # refused either way; the message may name the problem differently
        assert b"SyntaxError" in err and b"SyntaxError" in cold.stderr


def test_python_source_changes_only_a_non_utf8_declaration() -> None:
    plain = b"print(1)\n"
    assert python_source(plain) is plain
    latin = "# coding: latin-1\nprint('é')\n".encode()
    assert python_source(latin) == "# coding: utf-8\nprint('Ã©')\n".encode()


async def test_an_interpreter_never_handed_code_is_let_go_with_an_empty_program(
    tmp_path: Path,
) -> None:
    waiting = tmp_path / "waiting.py"
    place_fifo(waiting)
    proc = start(waiting, PY)
    wait_blocked_on_fifo(proc)
    hand_over_nothing(waiting, write)
    assert proc.wait(timeout=30) == 0
    late = tmp_path / "late.py"
    place_fifo(late)
    hand_over_nothing(late, write)  # before the interpreter got there
    assert start(late, PY).wait(timeout=30) == 0
    hand_over_nothing(late, write)  # once handed over: nothing to do
    assert sorted(p.name for p in tmp_path.iterdir()) == ["late.py", "waiting.py"]
