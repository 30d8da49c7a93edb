"""Fixtures shared by the backend tests: real backends, host-side checks."""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from backends.base import BackendError
from backends.capture.host import TracerHub
from backends.capture.settings import CaptureSettings
from backends.docker.backend import DockerBackend
from backends.nsjail.backend import NsjailBackend
from backends.nsjail.host import NSJAIL_BIN_ENV
from backends.nsjail.settings import NsjailSettings
from tests.components import missing_component


def require_root() -> None:
    if os.geteuid() != 0:
        missing_component("the nsjail backend needs root (mounts, uid maps, cgroups)")


def built_nsjail() -> Path:
    """`make nsjail`'s build, as the Makefile points the suite at it."""
    configured = os.environ.get(NSJAIL_BIN_ENV, "")
    if not configured:
        missing_component(f"${NSJAIL_BIN_ENV} is not set: run the suite with `make test`")
    path = Path(configured)
    if not path.is_file():
        missing_component(f"${NSJAIL_BIN_ENV} names {path}, which is not built (`make nsjail`)")
    if not (path.parent / "BUILDINFO").is_file():
        missing_component(f"${NSJAIL_BIN_ENV} names {path}, which is not `make nsjail`'s build")
    return path


@pytest.fixture
def sandbox_state_dir() -> Iterator[Path]:
    # Not under pytest's tmp_path: its parents are 0700 and the sandbox uid must
    # be able to traverse to its bind-mount sources.
    path = Path(tempfile.mkdtemp(prefix="execgate-nsjail-test-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


# Behaviour capture off, for backends whose tests are not about it: the host tracer
# takes ~11 s of CPU to attach at every backend start.
NO_CAPTURE = CaptureSettings(enabled=False)


@pytest.fixture
def nsjail_settings(sandbox_state_dir: Path) -> NsjailSettings:
    require_root()
    # A uid of this test process's own, so host-side "no process left with the
    # sandbox uid" checks cannot see another run's sandboxes.
    uid = 170000 + os.getpid() % 20000
    # Capture off: the host tracer takes seconds of CPU to attach, and only the
    # behaviour tests need it (they start their own backend with it, once per module).
    return NsjailSettings(
        state_dir=str(sandbox_state_dir), sandbox_uid=uid, sandbox_gid=uid,
        capture=NO_CAPTURE,
    )  # fmt: skip


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def captured_nsjail_backend(tracer_hub: TracerHub) -> AsyncIterator[NsjailBackend]:
    """An nsjail backend with behaviour capture on, shared by a module's tests."""
    require_root()
    state = Path(tempfile.mkdtemp(prefix="execgate-nsjail-capture-", dir="/tmp"))
    # Not nsjail_settings' uid: the module's host-clean checks must not see this
    # backend's waiting sandboxes.
    uid = 190000 + os.getpid() % 9000
    backend = NsjailBackend(
        NsjailSettings(state_dir=str(state), sandbox_uid=uid, sandbox_gid=uid), tracers=tracer_hub
    )
    await backend.start()
    try:
        yield backend
    finally:
        await backend.close()
        shutil.rmtree(state, ignore_errors=True)


@pytest.fixture
async def nsjail_backend(nsjail_settings: NsjailSettings) -> AsyncIterator[NsjailBackend]:
    backend = NsjailBackend(nsjail_settings)
    await backend.start()
    try:
        yield backend
    finally:
        await backend.close()


def processes_with_uid(uid: int) -> list[tuple[int, str]]:
    """(pid, name) of every host process whose real or effective uid is `uid`."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/status", encoding="utf-8") as f:
                status = f.read()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        uids = {int(u) for u in fields.get("Uid", "").split()}
        if uid in uids:
            found.append((int(entry.name), fields.get("Name", "").strip()))
    return found


def ids_of_processes_named(prefix: str) -> list[tuple[list[int], list[int]]]:
    """(uids, gids) of host processes whose command line starts with `prefix`."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            cmdline = Path(entry.path, "cmdline").read_bytes()
            status = Path(entry.path, "status").read_text()
        except OSError:
            continue
        if cmdline.startswith(prefix.encode()):
            fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
            uids = [int(x) for x in fields["Uid"].split()]
            gids = [int(x) for x in fields["Gid"].split()]
            found.append((uids, gids))
    return found


def sandbox_of(pid: int) -> str:
    """The name of the cgroup (so: the sandbox) a host process is in, or ""."""
    try:
        text = Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return ""
    for line in text.splitlines():
        _, controllers, path = line.split(":", 2)
        if "pids" in controllers.split(",") or controllers == "":
            return path.rsplit("/", 1)[-1]
    return ""


async def assert_nsjail_host_clean(backend: NsjailBackend) -> None:
    """Nothing of any finished execution of `backend` is left on the host: only
    the sandboxes made ahead for the next requests (and waiting) exist."""
    await backend.wait_settled()
    ready = backend.ready_sandboxes
    uid = backend.settings.sandbox_uid

    def strays_now() -> list[tuple[int, str]]:
        return [(pid, n) for pid, n in processes_with_uid(uid) if sandbox_of(pid) not in ready]

    # A killed sandbox's processes leave its cgroup before they are gone: give the
    # kernel a bounded moment to finish them (a bound that only fails a real stray).
    for _ in range(100):
        if not (strays := strays_now()):
            break
        await asyncio.sleep(0.1)
    assert strays == [], (
        "sandbox processes outlived their execution",
        [(p, sandbox_of(p)) for p, _ in strays],
        ready,
    )
    prefix = backend.instance_prefix
    assert backend.cgroups is not None
    assert {n for n in backend.cgroups.children() if n.startswith(prefix)} == ready
    assert {n for n in backend.workspaces.names() if n.startswith(prefix)} == ready
    assert mounts_under(backend.workspaces.runs_dir) == ready, "a workspace is still mounted"


async def start_docker_backend(backend: DockerBackend) -> DockerBackend:
    """Start a docker or docker-gvisor backend, or say which component is missing."""
    try:
        await backend.start()
    except BackendError as exc:
        missing_component(f"{backend.name} backend cannot start: {exc}")
    return backend


def module_docker_backend(make: Callable[[TracerHub], DockerBackend]) -> Any:
    """A module-scoped `backend` fixture: `make(tracers)` started once for the module
    (on the module's loop), closed after its last test. Each docker and gVisor test
    module says only which backend it wants:
    `backend = module_docker_backend(lambda tracers: ...(tracers=tracers))`."""

    @pytest_asyncio.fixture(scope="module", loop_scope="module")
    async def backend(tracer_hub: TracerHub) -> AsyncIterator[DockerBackend]:
        started = await start_docker_backend(make(tracer_hub))
        try:
            yield started
        finally:
            await started.close()

    return backend


async def assert_docker_host_clean(backend: DockerBackend) -> None:
    """Nothing of any finished execution is left in the engine: the containers of
    this backend instance are exactly those waiting in its pool."""
    await backend.wait_settled()
    assert await backend.own_containers() == backend.ready_sandboxes


def mounts_under(directory: Path) -> set[str]:
    """Names of the mount points directly under `directory`."""
    prefix = str(directory) + "/"
    points = (line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines())
    return {point[len(prefix) :] for point in points if point.startswith(prefix)}


@pytest.fixture
def host_canaries() -> Iterator[list[Path]]:
    """Files only the gateway's side has: one under /root, one under /tmp."""
    token = secrets.token_hex(8)
    made = []
    for directory in (Path("/root"), Path("/tmp")):
        if os.access(directory, os.W_OK):
            path = directory / f".execgate-canary-{token}"
            path.write_text(f"CANARY-{token}-{directory.name}")
            made.append(path)
    yield made
    for path in made:
        path.unlink(missing_ok=True)


async def until(condition: Callable[[], object], what: str) -> None:
    """Wait for a condition (bounded only so that a hung test fails)."""
    for _ in range(600):
        if condition():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")
