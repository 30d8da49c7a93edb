"""Soak: many `print(1)` executions through a real gateway on each docker backend.

Many one after the other and many at concurrency 8 on each: 600 and 300 on docker
with runc, 100 and 100 on docker-gvisor, whose sandboxes cost ~0.55 s of this 2-core
host's CPU each. Every one answered 200 with status ok (no 5xx: a sandbox that failed
to start was replaced), an `execution.finished` audit record for each, and afterwards
nothing of this gateway left in the engine or on the host but the containers waiting
in its pool: no container, no network namespace (hence no veth: both ends live in
namespaces that went with it), no cgroup. Each test prints the start failures it saw
(the engine's refusals the retry hid from the caller).

The sizes keep CI within its half hour on the slowest VM seen, where 1,000 + 500 (runc)
and 300 + 500 (gVisor) took 11 of its 34 minutes. Every check counts what is left, so
a sandbox leaked per execution, or per hundred, shows at any of these sizes; the
pool's code is the same on both runtimes, so runc's longer runs are the ones that look
for rare races; and the rare event a long run meets, the engine refusing a start, has
tests of its own (test_retry.py).

Marked `soak`: CI runs them (`make test` under CI=true); elsewhere set
EXECGATE_SOAK=1 (they take minutes). EXECGATE_SOAK_SCALE scales every size: 0.1 for a
trial run, 2 or more for a longer soak. The shared engine may run other gateways'
sandboxes: every check looks only at this gateway instance's labels, descriptors and
containers.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from backends import backend_class
from backends.capture.host import TracerHub
from backends.docker.backend import DockerBackend
from gateway.bench.run import Gateway, bench_settings
from tests.backends.conftest import assert_docker_host_clean, start_docker_backend

SOAK = os.environ.get("CI") == "true" or os.environ.get("EXECGATE_SOAK") == "1"
pytestmark = [
    pytest.mark.soak,
    pytest.mark.integration,
    pytest.mark.skipif(not SOAK, reason="soak: runs under CI=true, or with EXECGATE_SOAK=1"),
]

SCALE = float(os.environ.get("EXECGATE_SOAK_SCALE", "1"))
# How long a whole soak may take before it counts as hung (not a performance bar).
HUNG_S = 45 * 60
CGROUP_ROOT = Path("/sys/fs/cgroup")


def backend_env(name: str) -> dict[str, str]:
    """This backend's own EXECGATE_BACKENDS_* overrides from the environment (e.g. a
    test-only runtime name), and none that would enable another backend."""
    prefix = "EXECGATE_BACKENDS_" + name.upper().replace("-", "_") + "_"
    found = {k: v for k, v in os.environ.items() if k.startswith(prefix)}
    if name == "docker":
        found = {k: v for k, v in found.items() if not k.startswith(prefix + "GVISOR_")}
    return found


def netns_descriptors() -> int:
    """Network namespaces this process (the gateway's) holds open: the egress
    boundaries of its sandboxes (a gVisor sandbox's sinkhole keeps its veth's far end)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("net:[")
        except OSError:
            continue
    return count


def orphan_cgroups(engine_ids: set[str]) -> set[str]:
    """Container cgroups (cgroup v1 `docker/<id>` or v2 `docker-<id>.scope`/`docker/<id>`)
    whose container the engine no longer has."""
    found = set()
    for path in list(CGROUP_ROOT.glob("*/docker/*")) + list(CGROUP_ROOT.glob("docker/*")):
        name = path.name.removeprefix("docker-").removesuffix(".scope")
        if path.is_dir() and len(name) == 64 and name not in engine_ids:
            found.add(name)
    return found


def engine_ids() -> set[str]:
    done = subprocess.run(
        ["docker", "ps", "-aq", "--no-trunc"], capture_output=True, text=True, check=True
    )
    return set(done.stdout.split())


def host_links() -> str:
    return subprocess.run(
        ["ip", "-o", "link", "show"], capture_output=True, text=True, check=True
    ).stdout


def finished_records(audit_path: Path) -> dict[str, dict[str, Any]]:
    found = {}
    for line in audit_path.read_text().splitlines():
        record = json.loads(line)
        if record.get("type") == "execution.finished":
            found[record["execution_id"]] = record
    return found


async def soak(tmp_path: Path, name: str, runs: int, concurrency: int, tracers: TracerHub) -> None:
    await (await start_docker_backend(probe_backend(name, tracers))).close()  # or skip
    runs = max(1, int(runs * SCALE))
    # The sandboxes are under test, not the policy's latency: at concurrency 8 on a
    # small, shared host a decision can miss its 200 ms deadline (503 policy_unavailable).
    env = {"EXECGATE_POLICY_TIMEOUT_MS": "10000", **backend_env(name)}
    settings = bench_settings(tmp_path, name, **env)
    orphans_before = await asyncio.to_thread(lambda: orphan_cgroups(engine_ids()))
    netns_idle = netns_descriptors()
    # The run's host tracer (docker on runc records through it): attached once for
    # the whole suite, not ~14 s per soak.
    async with Gateway(settings, tracers=tracers) as gw:
        backend: DockerBackend = gw.services.backends[name]
        await backend.wait_settled()
        # What each waiting sandbox holds (a gVisor one its sinkhole's namespace; a
        # runc one none): the pool is sized from demand, so it may end larger.
        waiting = len(backend.ready_sandboxes)
        assert waiting > 0
        per_sandbox, odd = divmod(netns_descriptors() - netns_idle, waiting)
        assert odd == 0, (netns_descriptors(), netns_idle, waiting)
        answers: list[tuple[int, dict[str, Any]]] = []
        slots = asyncio.Semaphore(concurrency)

        async def one() -> None:
            async with slots:
                assert gw.session is not None
                body = {"language": "python", "code": "print(1)"}
                async with gw.session.post(gw.url, json=body) as response:
                    answers.append((response.status, await response.json()))

        started = time.monotonic()
        async with asyncio.timeout(HUNG_S):
            await asyncio.gather(*(one() for _ in range(runs)))
        elapsed = time.monotonic() - started
        failures = dict(backend.start_failures.counts)
        print(
            f"\nsoak {name}: {runs} runs at concurrency {concurrency} in {elapsed:.0f} s;"
            f" start failures seen (retried): {sum(failures.values())} {failures}"
        )
        bad = [(status, body) for status, body in answers if status != 200]
        assert bad == [], bad[:5]
        assert all(body["status"] == "ok" and body["stdout"] == "1\n" for _, body in answers)
        await backend.wait_settled()
        await assert_docker_host_clean(backend)  # this instance's containers: the pool's
        assert netns_descriptors() == netns_idle + per_sandbox * len(backend.ready_sandboxes)
    records = finished_records(Path(settings.audit.path))
    assert {body["execution_id"] for _, body in answers} <= set(records)
    assert all(records[body["execution_id"]]["status"] == "ok" for _, body in answers)
    # After close: none of this gateway's sandboxes, namespaces, links or cgroups.
    assert netns_descriptors() == netns_idle
    assert "execgate1" not in host_links() and "execgate2" not in host_links()
    orphans = await asyncio.to_thread(lambda: orphan_cgroups(engine_ids()))
    assert orphans - orphans_before == set()


def probe_backend(name: str, tracers: TracerHub) -> DockerBackend:
    """The backend the gateway will start, with the same overrides (to skip, or fail
    in CI, with the reason when it cannot start), on the run's host tracer."""
    prefix = "EXECGATE_BACKENDS_" + name.upper().replace("-", "_") + "_"
    overrides = {k.removeprefix(prefix).lower(): v for k, v in backend_env(name).items()}
    cls = backend_class(name)
    return cls(cls.Settings(**overrides), tracers=tracers)  # type: ignore[call-arg, return-value]


@pytest.mark.parametrize(("name", "runs"), [("docker", 600), ("docker-gvisor", 100)])
async def test_many_in_a_row(tmp_path: Path, name: str, runs: int, tracer_hub: TracerHub) -> None:
    await soak(tmp_path, name, runs=runs, concurrency=1, tracers=tracer_hub)


@pytest.mark.parametrize(("name", "runs"), [("docker", 300), ("docker-gvisor", 100)])
async def test_many_at_concurrency_eight(
    tmp_path: Path, name: str, runs: int, tracer_hub: TracerHub
) -> None:
    await soak(tmp_path, name, runs=runs, concurrency=8, tracers=tracer_hub)
