"""Proof that the probes can fail: weakened sandboxes must be reported escaped.

Each backend is weakened where that is feasible (tests/gateway/escape/weakened.py):
nsjail gets the host network namespace, no seccomp filter, capabilities kept, the
canary and a credential canary bound in, a /tmp shared by every sandbox, loose
limits and a collector that follows links (and, for the neighbours, the host pid
namespace); docker the same network, no seccomp, root with capabilities and the
canaries bound in; gVisor the same but its network (runsc is registered with
--network=none, so its loopback is never the host's). Every category has
techniques proven able to go red, and the host-side observers (the canaries, the
residue check) are shown to find what they watch for."""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import pytest

from backends.docker.backend import DockerBackend
from backends.docker.gvisor import GvisorBackend
from backends.docker.settings import DockerSettings, GvisorSettings
from backends.nsjail.backend import NsjailBackend
from backends.nsjail.settings import NsjailSettings
from gateway.escape.catalog.index import techniques
from gateway.escape.host import HostCanaries
from gateway.escape.report import row
from gateway.escape.residue import leftovers
from gateway.escape.runner import SuiteResult, run_suite
from gateway.escape.technique import CATEGORIES, Outcome
from tests.backends.conftest import NO_CAPTURE, start_docker_backend
from tests.gateway.escape.weakened import WeakEngine, WeakNsjail, weaken
from tests.waiting import until

pytestmark = pytest.mark.integration

# What the host itself observed (HostCanaries counts what arrives at its servers).
HOST_SEEN = ["network.tcp_ipv4", "network.tcp_ipv6", "network.udp_ipv4", "network.udp_ipv6",
             "neighbours.abstract_socket"]  # fmt: skip
# (Not network.dns: its canary needs 127.0.0.1:53 free, which a concurrent run may hold.)
NETWORK = [*HOST_SEEN, "network.interfaces", "network.raw", "network.packet"]
COMMON = ["host_files.absolute", "posture.seccomp", "posture.uid_map", "posture.capabilities",
          "privilege.unshare", "secrets.credential_files"]  # fmt: skip
# One or more of every category, on the weakened nsjail.
NSJAIL = [*NETWORK, "host_files.absolute", "host_files.proc_root", "posture.seccomp",
          "posture.capabilities", "posture.namespaces", "privilege.unshare", "privilege.mount",
          "privilege.bpf", "kernel.kmsg", "kernel.masked_proc", "secrets.credential_files",
          "resources.thread_bomb", "resources.memory_bomb", "resources.disk_bomb",
          "resources.shm_bomb", "output.symlink", "residue.next_execution",
          "residue.concurrent"]  # fmt: skip


async def assert_escaped(
    backend: object, ids: list[str], canary_dir: Path, credentials: tuple[str, ...] = ()
) -> SuiteResult:
    chosen = [t for t in techniques() if t.id in ids]
    assert len(chosen) == len(set(ids))
    result = await run_suite(
        backend,  # type: ignore[arg-type]
        chosen,
        credential_files=credentials,
        canary_dir=canary_dir,
    )
    outcomes = {f.technique.id: f.verdict.outcome for f in result.findings}
    assert outcomes == dict.fromkeys(ids, Outcome.ESCAPED), "\n".join(
        row(f) for f in result.findings
    )
    assert not result.sound
    for f in result.findings:
        if f.technique.id in HOST_SEEN:
            assert f.verdict.detail.startswith("host: "), row(f)
    return result


@pytest.fixture
async def weak_nsjail(
    escape_nsjail_settings: NsjailSettings, canary_dir: Path, request: pytest.FixtureRequest
) -> object:
    settings = escape_nsjail_settings.model_copy(update={"warm_pool_size": 0})
    backend = WeakNsjail(settings, canary_dir, host_pid=getattr(request, "param", False))
    await backend.start()
    yield backend
    await backend.close()


async def test_weakened_nsjail_goes_red_in_every_category(
    weak_nsjail: WeakNsjail, canary_dir: Path
) -> None:
    result = await assert_escaped(weak_nsjail, NSJAIL, canary_dir, weak_nsjail.credentials)
    assert {f.technique.category for f in result.findings} == set(CATEGORIES)
    by_id = {f.technique.id: f.verdict.detail for f in result.findings}
    # The `ended` judge's positive finding: the bombs' own counts past the limits.
    assert "256 MiB allocated at a 48 MiB limit" in by_id["resources.memory_bomb"]
    assert "host content in link" in by_id["output.symlink"]


@pytest.mark.parametrize("weak_nsjail", [True], indirect=True, ids=["host-pid"])
async def test_weakened_nsjail_reaches_the_host_canary_process(
    weak_nsjail: WeakNsjail, canary_dir: Path
) -> None:
    result = await assert_escaped(
        weak_nsjail, ["neighbours.ptrace", "neighbours.signal"], canary_dir
    )
    (signal,) = [f for f in result.findings if f.technique.id == "neighbours.signal"]
    # The host saw its canary process killed, whatever the probe said.
    assert signal.verdict.detail.startswith("host: canary process "), row(signal)


async def test_the_residue_check_finds_a_process_left_of_the_sandbox_uid(
    escape_nsjail_settings: NsjailSettings,
) -> None:
    # A process of the sandbox uid outside every sandbox cgroup: what an escaped
    # daemon looks like from the host (a real weakening that leaves one also fails
    # the backend's own clean-up, which is an error, not a finding).
    backend = NsjailBackend(escape_nsjail_settings.model_copy(update={"warm_pool_size": 0}))
    await backend.start()
    uid = escape_nsjail_settings.sandbox_uid
    stray = await asyncio.to_thread(
        subprocess.Popen, ["sleep", "60"], user=uid, group=uid, start_new_session=True
    )
    try:
        found = await leftovers(backend)
        assert any(f"process {stray.pid} (sleep)" in f for f in found), found
        chosen = [t for t in techniques() if t.id == "resources.setsid"]
        (finding,) = (await run_suite(backend, chosen)).findings
        assert finding.verdict.outcome == Outcome.ESCAPED
        left = f"process {stray.pid} (sleep) of the sandbox uid left behind"
        assert left in finding.verdict.detail, finding.verdict.detail
    finally:
        stray.kill()
        stray.wait()
    assert not [f for f in await leftovers(backend) if f"process {stray.pid} " in f]
    await backend.close()


async def test_the_host_canaries_see_what_they_watch(canary_dir: Path) -> None:
    async with HostCanaries(canary_dir=canary_dir) as host:
        assert await host.findings() == []
        (canary_dir / "canary").write_text("overwritten\n")
        (canary_dir / "dropped").write_text("x")
        Path("/tmp", host.token + "-left").write_text("x")
        try:
            os.kill(host.facts["pid"], 19)  # SIGSTOP
            # Delivered when the process next runs: on a busy machine, a moment later.
            await until(lambda: _state(host.facts["pid"]) == "T", what="the canary stopped")
            found = await host.findings()
        finally:
            Path("/tmp", host.token + "-left").unlink()
        assert f"canary {canary_dir / 'canary'} changed" in found
        assert "new files next to the canary: ['dropped']" in found
        assert "a file named after the token appeared in the host's /tmp" in found
        assert any(f.startswith("canary process ") and "state T" in f for f in found), found
        _, writer = await asyncio.open_connection("127.0.0.1", host.facts["tcp4"])
        writer.close()
        await writer.wait_closed()
        await until(lambda: bool(host.hits), what="the canary server saw the connection")
        assert any(f.startswith("TCP connection to ('127.0.0.1'") for f in await host.findings())


@pytest.mark.parametrize(
    "backend_class, settings, ids",
    [
        (DockerBackend, DockerSettings(pool_size=0, capture=NO_CAPTURE),
         [*COMMON, *NETWORK, "posture.namespaces", "kernel.kmsg", "kernel.masked_proc"]),
        (GvisorBackend, GvisorSettings(pool_size=0, capture=NO_CAPTURE), COMMON),
    ],
    ids=["docker", "docker-gvisor"],
)  # fmt: skip
async def test_weakened_docker_backends_go_red(
    backend_class: type[DockerBackend],
    settings: DockerSettings,
    ids: list[str],
    canary_dir: Path,
) -> None:
    backend = weaken(backend_class(settings), canary_dir)
    await start_docker_backend(backend)
    try:
        assert isinstance(backend.engine, WeakEngine)
        backend.engine.weak = True  # after the start-up probe, which insists on seccomp
        await assert_escaped(backend, ids, canary_dir, backend.engine.credentials)
    finally:
        await backend.close()


def _state(pid: int) -> str:
    """A process's state letter, from /proc/PID/stat."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2]
