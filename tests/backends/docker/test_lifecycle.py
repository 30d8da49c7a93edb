"""The docker backend's life: pool, hardening as the engine sees it, crash safety,
an engine that goes away and comes back. Each test starts its own backend."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from backends.base import BackendError, ExecSpec, Limits, Status
from backends.capture.host import TracerHub
from backends.docker.backend import DockerBackend
from backends.docker.config import Shape
from backends.docker.image import RECIPE, default_image
from backends.docker.settings import DockerSettings
from tests.backends.conformance import lines, run
from tests.backends.conftest import NO_CAPTURE, assert_docker_host_clean, start_docker_backend

pytestmark = pytest.mark.integration

DOCKER_SOCKET = "/var/run/docker.sock"


@contextlib.asynccontextmanager
async def started(**settings: object) -> AsyncIterator[DockerBackend]:
    backend = await start_docker_backend(
        DockerBackend(DockerSettings(capture=NO_CAPTURE, **settings))
    )  # type: ignore[arg-type]
    try:
        yield backend
    finally:
        await backend.close()


# --- the pool ------------------------------------------------------------------------


async def test_containers_are_started_ahead_and_used_once() -> None:
    async with started(pool_size=2) as backend:
        await backend.wait_settled()
        ready = backend.ready_sandboxes
        assert len(ready) == 2
        result = await backend.run(ExecSpec("exe_pool", "python", "print('warm')", Limits()))
        assert result.stdout == b"warm\n"
        assert backend.pool.hits == 1
        await backend.wait_settled()
        after = backend.ready_sandboxes
        # One waiting container was used (and removed); a fresh one took its place.
        assert len(after) == 2 and len(after & ready) == 1
        await assert_docker_host_clean(backend)


async def test_no_state_passes_between_executions_through_the_pool() -> None:
    first = (
        "mkdir -p /workspace/d && echo left > /workspace/d/f && echo left > /tmp/f\n"
        "echo left > /dev/shm/f\n"
        "nohup sleep 60 >/dev/null 2>&1 &\n"
        "export LEFT=1; ulimit -S -n 20\n"
        "cat /proc/self/cgroup | grep -o 'docker/[0-9a-f]*' | head -1\n"
    )
    second = (
        "ls -A /workspace /tmp /dev/shm\n"
        "ls /proc | grep -cE '^[0-9]+$'\n"
        "echo LEFT=${LEFT:-unset} $(ulimit -S -n)\n"
        "cat /proc/self/cgroup | grep -o 'docker/[0-9a-f]*' | head -1\n"
    )
    async with started(pool_size=1) as backend:
        await backend.wait_settled()
        # bash becomes demand (a shape asked for once gets no share of the pool), so
        # the second run is served by a container the pool made after the first.
        await run(backend, "bash", "true")
        a = await run(backend, "bash", first)
        await backend.wait_settled()
        b = await run(backend, "bash", second)
        assert backend.pool.hits >= 1
        assert a.status == b.status == Status.OK, (a.stderr, b.stderr)
        listing, procs, env, b_cgroup = b.stdout.decode().split("\n", 1)[1].rsplit("\n", 4)[:4]
        assert b.stdout.decode().startswith("/dev/shm:\n\n/tmp:\n\n/workspace:\n")
        # PID 1 (the launcher), bash, ls and grep at most: no sleep from the first run.
        assert int(procs) <= 4
        assert env == "LEFT=unset 256"
        a_cgroup = lines(a)[-1]
        assert a_cgroup and b_cgroup and a_cgroup != b_cgroup
        assert a_cgroup.split("/")[1] not in {c for c in await backend.own_containers()}
        del listing
        await assert_docker_host_clean(backend)


async def test_stale_waiting_containers_are_not_used() -> None:
    async with started(pool_size=1, pool_max_age_s=1) as backend:
        await backend.wait_settled()
        stale = backend.ready_sandboxes
        await asyncio.sleep(1.1)
        result = await run(backend, "bash", "echo fresh")
        assert result.stdout == b"fresh\n"
        await backend.wait_settled()
        assert not (backend.ready_sandboxes & stale)
        await assert_docker_host_clean(backend)


async def test_pool_follows_the_requested_shape() -> None:
    async with started(pool_size=1) as backend:
        unusual = Limits(memory_mb=96, pids=20, disk_mb=3)
        for _ in range(3):
            result = await backend.run(ExecSpec("exe_shape", "bash", "echo x", unusual))
            assert result.status == Status.OK
        assert backend.pool.shape == Shape.of(backend.clamp(unusual), "bash")
        await backend.wait_settled()
        hits = backend.pool.hits
        await backend.run(ExecSpec("exe_shape", "bash", "echo x", unusual))
        assert backend.pool.hits == hits + 1
        await assert_docker_host_clean(backend)


async def test_without_a_pool_containers_are_made_on_demand() -> None:
    async with started(pool_size=0) as backend:
        results = await asyncio.gather(
            run(backend, "python", "print(2)"),
            run(backend, "bash", "sleep 5", timeout_s=0.5),
            run(backend, "javascript", "console.log(3)"),
        )
        assert [r.status for r in results] == [Status.OK, Status.TIMEOUT, Status.OK]
        assert backend.ready_sandboxes == frozenset()
        await assert_docker_host_clean(backend)


async def test_close_kills_running_executions() -> None:
    backend = await start_docker_backend(
        DockerBackend(DockerSettings(pool_size=1, capture=NO_CAPTURE))
    )
    task = asyncio.ensure_future(run(backend, "bash", "sleep 30", timeout_s=30))
    # Running, not still being made (making one may take a while on a busy host).
    for _ in range(600):
        if backend.running_sandboxes:
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)
    await backend.close()
    result = await task
    assert result.status == Status.KILLED
    assert any(e.kind == "shutdown" for e in result.events)
    await backend.start()
    try:
        assert await backend.own_containers() == backend.ready_sandboxes
    finally:
        await backend.close()


# --- what the engine is asked for ------------------------------------------------------


async def test_containers_are_hardened_as_the_engine_sees_them() -> None:
    async with started(pool_size=1) as backend:
        await backend.wait_settled()
        (name,) = backend.ready_sandboxes
        api = await backend.engine.api()
        found = await asyncio.to_thread(api.inspect_container, name)
        config, host = found["Config"], found["HostConfig"]
        assert config["User"] == "150000:150000"
        plain = ["PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/workspace", "LANG=C.UTF-8"]
        (ahead,) = [v for v in config["Env"] if v.startswith("EXECGATE_AHEAD=")]
        assert sorted(set(config["Env"]) - {ahead}) == sorted(plain)
        # The launcher's own: the interpreter to start ahead, with the program's
        # environment (the configured one and the proxy's address), nothing else.
        program = json.loads(ahead.split("=", 1)[1])
        assert program.pop("argv") == ["/usr/bin/python3", "-I"]
        assert program.pop("filename") == "main.py"
        proxy = {k for k in program.pop("env") if k.lower().endswith("_proxy")}
        assert proxy == {"HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy",
                         "https_proxy", "all_proxy"}  # fmt: skip
        assert program == {}
        # "Disabled" for the engine (no libnetwork sandbox, no prestart hook): the
        # container still gets a namespace of its own, which the gateway furnishes.
        assert config.get("NetworkDisabled") is True
        assert config["Labels"]["execgate.instance"] == backend.instance.id
        assert host["NetworkMode"] == "none"
        assert host["ReadonlyRootfs"] is True
        assert host["CapDrop"] == ["ALL"] and not host["CapAdd"]
        no_new_privileges, seccomp = host["SecurityOpt"]
        assert no_new_privileges == "no-new-privileges"
        assert '"defaultAction":"SCMP_ACT_ERRNO"' in seccomp
        assert host["Privileged"] is False
        assert host["Memory"] == host["MemorySwap"] > 0
        assert host["NanoCpus"] == 1_000_000_000
        assert host["PidsLimit"] == 65
        # No host path but the generated /etc files (from /dev/shm, read-only), whose
        # resolv.conf names the gateway's recording resolver.
        assert not host.get("Binds")
        mounts = {m["Destination"]: m for m in found["Mounts"]}
        assert set(mounts) == {"/etc/hosts", "/etc/hostname", "/etc/resolv.conf"}
        assert all(m["Type"] == "bind" and not m["RW"] for m in mounts.values())
        sources = {Path(m["Source"]).parent for m in mounts.values()}
        assert [s.parent for s in sources] == [Path("/dev/shm")]
        resolv = Path(mounts["/etc/resolv.conf"]["Source"]).read_text()
        assert resolv.startswith("nameserver 127.0.0.53\n")
        assert set(host["Tmpfs"]) == {"/workspace", "/tmp", "/code"}
        assert "/sys/fs/cgroup" in host["MaskedPaths"]
        assert host["LogConfig"]["Type"] == "none"
        assert {u["Name"] for u in host["Ulimits"]} == {"core", "nofile", "fsize", "cpu"}


async def test_default_image_is_the_recipes() -> None:
    digest = hashlib.sha256(RECIPE.read_bytes()).hexdigest()[:12]
    assert default_image() == f"execgate-sandbox:{digest}"
    async with started(pool_size=0) as backend:
        assert backend.image == default_image()


async def test_start_refuses_a_missing_image() -> None:
    backend = DockerBackend(
        DockerSettings(image="execgate-sandbox:no-such-tag", pool_size=0, capture=NO_CAPTURE)
    )
    try:
        with pytest.raises(BackendError, match="make images"):
            await backend.start()
    finally:
        await backend.close()


# --- crash safety ----------------------------------------------------------------------

OWNER = """
import asyncio, json, sys
from backends.base import ExecSpec, Limits
from backends.docker.backend import DockerBackend
from backends.docker.settings import DockerSettings

async def main():
    backend = DockerBackend(DockerSettings(pool_size=1, capture={"enabled": False}))
    await backend.start()
    task = asyncio.ensure_future(backend.run(
        ExecSpec("exe_crash", "bash", "sleep 60", Limits(timeout_s=3))))
    while not backend._live:
        await asyncio.sleep(0.01)
    print(json.dumps({"instance": backend.instance.id}), flush=True)
    await task

asyncio.run(main())
"""


async def test_a_gateway_killed_mid_execution_leaves_nothing_after_restart() -> None:
    probe = DockerBackend(DockerSettings(pool_size=0, capture=NO_CAPTURE))
    await start_docker_backend(probe)
    await probe.close()
    owner = await asyncio.create_subprocess_exec(
        sys.executable, "-c", OWNER, stdout=subprocess.PIPE, cwd=Path(__file__).parents[3]
    )
    try:
        assert owner.stdout is not None
        line = await asyncio.wait_for(owner.stdout.readline(), 60)
        instance = json.loads(line)["instance"]
    finally:
        owner.send_signal(signal.SIGKILL)
        await owner.wait()
    label = f"execgate.instance={instance}"
    assert await probe.engine.containers(label)  # the running execution, maybe a waiting one
    # Without its gateway nothing keeps running: a waiting container reads EOF and
    # exits; the running one stops at its launcher's own deadline (3 s + 2 s).
    for _ in range(150):
        left = await probe.engine.containers(label)
        if all(c["State"] != "running" for c in left):
            break
        await asyncio.sleep(0.1)
    assert [c["State"] for c in left if c["State"] == "running"] == []
    async with started(pool_size=0) as successor:
        assert await successor.engine.containers(label) == []


# --- the engine goes away and comes back -----------------------------------------------


class SocketProxy:
    """A stand-in for the engine's socket that can vanish: forwards to the real one."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.server: asyncio.AbstractServer | None = None
        self.writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        self.server = await asyncio.start_unix_server(self._serve, self.path)

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()
        for writer in list(self.writers):
            writer.close()
        await self.server.wait_closed()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_unix_connection(DOCKER_SOCKET)
        self.writers |= {writer, up_writer}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError, OSError):
                while chunk := await src.read(1 << 16):
                    dst.write(chunk)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self.writers -= {writer, up_writer}


async def test_an_engine_that_goes_away_fails_closed_and_recovers() -> None:
    with tempfile.TemporaryDirectory(prefix="execgate-engine-") as tmp:
        proxy = SocketProxy(f"{tmp}/docker.sock")
        await proxy.start()
        async with started(pool_size=1, docker_host=f"unix://{proxy.path}",
                           engine_timeout_s=5) as backend:  # fmt: skip
            assert (await run(backend, "bash", "echo up")).stdout == b"up\n"
            await backend.wait_settled()
            await proxy.stop()
            health = await backend.health()
            assert not health.ok and "docker engine" in health.detail
            with pytest.raises(BackendError, match="docker engine"):
                await run(backend, "bash", "echo down")
            await proxy.start()
            assert (await backend.health()).ok
            assert (await run(backend, "bash", "echo again")).stdout == b"again\n"
            # What could not be removed while the engine was away goes now.
            await backend.wait_settled()
            await backend.reap_leftovers()
            await assert_docker_host_clean(backend)


# --- behind the gateway ------------------------------------------------------------------


async def test_the_gateway_runs_code_in_docker_and_reports_it_ready(
    tmp_path: Path, tracer_hub: TracerHub
) -> None:
    from gateway.bench.run import Gateway, bench_settings

    probe = await start_docker_backend(
        DockerBackend(DockerSettings(pool_size=0, capture=NO_CAPTURE))
    )  # or skip
    await probe.close()
    env = {"EXECGATE_BACKENDS_DOCKER_POOL_SIZE": "1"}
    async with Gateway(bench_settings(tmp_path, "docker", **env), tracer_hub) as gw:
        body = await gw.execute()
        assert (body["status"], body["stdout"], body["backend"]) == ("ok", "1\n", "docker")
        assert gw.session is not None
        async with gw.session.get(gw.url.replace("/v1/executions", "/readyz")) as response:
            ready = await response.json()
        assert response.status == 200, ready
        check = ready["checks"]["backend:docker"]
        assert check["ok"] and "engine reachable" in check["detail"]
