"""The policy engines as fixtures: embedded OPA Wasm, rego-cpp and a real OPA server."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from gateway.policy.base import PolicyEngine
from gateway.policy.embedded import EmbeddedEngine
from gateway.policy.opa import OpaEngine
from gateway.policy.wasm import WasmEngine
from tests.policies.opa_server import POLICIES, OpaServer, find_opa

# Generous: a shared 2-core machine; tests about deadlines set their own.
TIMEOUT_MS = 10_000


@pytest.fixture(scope="session")
def opa_bin() -> str:
    return find_opa()


@pytest.fixture(scope="session")
def opa_server(opa_bin: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpaServer]:
    """OPA serving the shipped policies/, shared by the whole session."""
    server = OpaServer(opa_bin, POLICIES, tmp_path_factory.mktemp("opa-shipped")).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def files_opa(opa_bin: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpaServer]:
    """OPA started the way its docs start it, `opa run --server policies/`: no bundle."""
    server = OpaServer(opa_bin, POLICIES, tmp_path_factory.mktemp("opa-files"), files=True).start()
    yield server
    server.stop()


@pytest.fixture
def own_opa(opa_bin: str, tmp_path: Path) -> Iterator[Callable[[Path], OpaServer]]:
    """Start an OPA of the test's own over a policy directory; stopped afterwards."""
    servers: list[OpaServer] = []

    def start(policy_dir: Path, *, files: bool = False) -> OpaServer:
        """`files=True`: `opa run --server --watch DIR`, as OPA's docs start it (no bundle)."""
        server = OpaServer(opa_bin, policy_dir, tmp_path / f"opa-{len(servers)}", files=files)
        servers.append(server)
        return server.start()

    yield start
    for server in servers:
        server.stop()


def embedded_engine(name: str, path: Path, timeout_ms: int = TIMEOUT_MS) -> PolicyEngine:
    """policy.engine "embedded" (OPA Wasm) or "rego-cpp", over `path`."""
    if name == "embedded":
        return WasmEngine(path, timeout_ms=timeout_ms, opa_bin=find_opa())
    return EmbeddedEngine(path, timeout_ms=timeout_ms)


@pytest.fixture(params=["embedded", "rego-cpp", "opa"])
async def engine(request: pytest.FixtureRequest) -> AsyncIterator[PolicyEngine]:
    """Each test using it runs once per engine, over the shipped policy."""
    if request.param != "opa":
        built: PolicyEngine = embedded_engine(request.param, POLICIES)
    else:
        server = request.getfixturevalue("opa_server")
        built = OpaEngine(server.url, timeout_ms=TIMEOUT_MS)
    await built.start()
    yield built
    await built.close()


def write_policy(directory: Path, source: str, name: str = "policy.rego") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).write_text(source, encoding="utf-8")
    return directory
