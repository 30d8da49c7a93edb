"""Egress on docker-gvisor (runsc-egress in a namespace the gateway made, linked to its
sinkhole): the conformance suite on one backend per module."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess

import pytest

from backends.docker.gvisor import GvisorBackend
from backends.docker.sandbox import EGRESS_NETNS_VARIABLE
from backends.docker.settings import GvisorSettings
from backends.egress.veth import LINK
from tests.backends.conftest import assert_docker_host_clean, module_docker_backend
from tests.backends.egress_conformance import (
    ModuleLoopEgressConformance,
    conformance_resolver,
    run_python,
)

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]


backend = module_docker_backend(
    lambda tracers: GvisorBackend(
        GvisorSettings(), egress_resolver=conformance_resolver(), tracers=tracers
    )
)


class TestGvisorEgress(ModuleLoopEgressConformance):
    pass


async def test_nothing_left_in_the_engine(backend: GvisorBackend) -> None:
    await assert_docker_host_clean(backend)


SEEN_FROM_INSIDE = """
import json, os
links = sorted(line.split(":")[0].strip() for line in open("/proc/net/dev").readlines()[2:])
try:
    init = open("/proc/1/environ", "rb").read().decode(errors="replace")
except OSError as exc:
    init = type(exc).__name__
print(json.dumps({"links": links, "env": sorted(os.environ), "init": init}))
"""


def _netns_descriptors() -> int:
    count = 0
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            count += os.readlink(f"/proc/self/fd/{name}").startswith("net:[")
    return count


async def test_the_sandbox_is_in_the_gateways_namespace_and_never_learns_its_name(
    backend: GvisorBackend,
) -> None:
    await backend.wait_settled()
    before = _netns_descriptors()
    for _ in range(3):
        result = await run_python(backend, SEEN_FROM_INSIDE)
        assert result.exit_code == 0, result.stderr
        seen = json.loads(result.stdout)
        # runsc's netstack took the gateway's namespace: loopback and the veth's end.
        assert seen["links"] == sorted(["lo", LINK])
        # The variable that named it went with the spec: in no environment inside.
        assert EGRESS_NETNS_VARIABLE not in seen["env"]
        assert EGRESS_NETNS_VARIABLE not in seen["init"]
    await backend.wait_settled()
    # Per sandbox the gateway holds two namespaces (its own and its sinkhole), only
    # while the sandbox exists: nothing of a finished execution is left.
    assert _netns_descriptors() == before == 2 * len(backend.ready_sandboxes)
    await assert_docker_host_clean(backend)


@pytest.mark.parametrize("target", ["host", "pid-namespace", "file", "none"])  # REFUSED
async def test_the_egress_runtime_refuses_any_other_namespace(
    backend: GvisorBackend, target: str
) -> None:
    """A container on runsc-egress that names the host's network namespace (or
    anything but a network namespace, or nothing) does not start, and the host's
    links and addresses are as they were (runsc's netstack would take them over)."""
    await asyncio.to_thread(_refused, backend.egress_runtime(), backend.image, target)


REFUSED = {
    "host": "the host's network namespace",
    "pid-namespace": "is not a network namespace",
    "file": "is not a network namespace",
    "none": "must name its network namespace",
}


def _refused(runtime: str, image: str, target: str) -> None:
    held = -1
    env: list[str] = []
    if target != "none":
        path = {"host": "/proc/self/ns/net", "pid-namespace": "/proc/self/ns/pid",
                "file": __file__}[target]  # fmt: skip
        held = os.open(path, os.O_RDONLY)
        env = ["-e", f"{EGRESS_NETNS_VARIABLE}=/proc/{os.getpid()}/fd/{held}"]
    addresses = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True).stdout
    name = f"execgate-refused-netns-{os.getpid()}-{target}"
    try:
        done = subprocess.run(
            ["docker", "run", "--name", name, "--runtime", runtime, "--network", "none",
             *env, image, "true"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode != 0
        # The runtime's reason, as the engine reports it.
        assert "runsc-netns: " in done.stderr and REFUSED[target] in done.stderr, done.stderr
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True)
        if held >= 0:
            os.close(held)
    after = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True).stdout
    assert after == addresses
