"""The Docker engine, as the few async calls the backends need.

The `docker` SDK (docker-py) is synchronous; every call runs on this engine's own
thread pool (not the event loop's shared default one, which other backends and
the gateway use), and every failure of the engine or of the connection to it
becomes a BackendError: a sandbox that cannot be made or checked is the gateway's
503, never a result. aiodocker would avoid the threads, but docker-py is the
maintained reference client, already on most hosts that run Docker, and a call
costs ~1-5 ms here either way; the one long-lived, byte-heavy path (the attach
stream) leaves the SDK and runs on asyncio directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import docker
import docker.errors
import requests.exceptions

from backends.base import BackendError

T = TypeVar("T")
ENGINE_ERRORS = (docker.errors.DockerException, requests.exceptions.RequestException, OSError)


class EngineUnreachable(BackendError):
    """No connection to the engine at all: a fresh sandbox would fare no better."""

    retryable = False


class Engine:
    def __init__(self, base_url: str, threads: int, timeout_s: float) -> None:
        self.base_url = base_url
        self.timeout_s = timeout_s
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="docker")
        self._threads = threads
        self._api: docker.APIClient | None = None

    async def _call(self, what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, lambda: fn(*args, **kwargs))
        except ENGINE_ERRORS as exc:
            unreachable = isinstance(exc, requests.exceptions.ConnectionError | ConnectionError)
            error = EngineUnreachable if unreachable else BackendError
            raise error(f"docker engine ({what}): {_brief(exc)}") from exc

    def _client(self) -> docker.APIClient:
        if self._api is None:
            # version="auto" asks the engine, so any engine >= API 1.41 works.
            self._api = docker.APIClient(
                base_url=self.base_url,
                version="auto",
                timeout=int(self.timeout_s),
                max_pool_size=self._threads,
            )
        return self._api

    async def api(self) -> docker.APIClient:
        # Creating the client already talks to the engine (version negotiation).
        if self._api is None:
            await self._call("connect", self._client)
        assert self._api is not None
        return self._api

    async def ping(self) -> None:
        api = await self.api()
        await self._call("ping", api.ping)

    async def info(self) -> dict[str, Any]:
        api = await self.api()
        return await self._call("info", api.info)

    async def image_id(self, image: str) -> str:
        api = await self.api()
        try:
            found = await self._call("inspect image", api.inspect_image, image)
        except BackendError as exc:
            if isinstance(exc.__cause__, docker.errors.ImageNotFound):
                raise BackendError(
                    f"image {image} not found in the docker engine: run `make images` "
                    "(or set the backend's `image`)"
                ) from None
            raise
        return str(found["Id"])

    async def create(self, body: dict[str, Any], name: str) -> str:
        api = await self.api()
        found = await self._call("create", api.create_container_from_config, body, name)
        return str(found["Id"])

    async def attach(self, container: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """The container's stdin, stdout and stderr (multiplexed) as asyncio streams."""
        api = await self.api()
        params = {"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1}
        raw = await self._call("attach", api.attach_socket, container, params)
        # Our own descriptor for the hijacked connection, so the SDK's response
        # object can be closed (or collected) without closing it under asyncio.
        sock = raw._sock.dup()
        raw.close()
        try:
            return await asyncio.open_connection(sock=sock, limit=1 << 20)
        except OSError as exc:
            sock.close()
            raise BackendError(f"docker engine (attach): {exc}") from exc

    async def start(self, container: str) -> None:
        api = await self.api()
        await self._call("start", api.start, container)

    async def kill(self, container: str) -> None:
        """SIGKILL to PID 1 (so to everything in it); quiet if it already stopped."""
        api = await self.api()
        try:
            await self._call("kill", api.kill, container)
        except BackendError as exc:
            if not _gone_or_stopped(exc.__cause__):
                raise

    async def wait(self, container: str, timeout_s: float) -> int:
        api = await self.api()
        found = await self._call("wait", api.wait, container, timeout=timeout_s)
        return int(found["StatusCode"])

    async def state(self, container: str) -> dict[str, Any]:
        api = await self.api()
        found = await self._call("inspect", api.inspect_container, container)
        state: dict[str, Any] = found["State"]
        state["Runtime"] = found["HostConfig"].get("Runtime")
        return state

    async def remove(self, container: str) -> None:
        """Remove (killing it if need be); quiet if it is already gone."""
        api = await self.api()
        try:
            await self._call("remove", api.remove_container, container, v=True, force=True)
        except BackendError as exc:
            cause = exc.__cause__
            if not isinstance(cause, docker.errors.NotFound) and "already in progress" not in str(
                cause
            ):
                raise

    async def containers(self, label: str) -> list[dict[str, Any]]:
        """Every container (running or not) carrying `label` ("key" or "key=value")."""
        api = await self.api()
        return await self._call("list", api.containers, all=True, filters={"label": label})

    async def close(self) -> None:
        if self._api is not None:
            with contextlib.suppress(Exception):
                self._api.close()
        self._executor.shutdown(wait=False, cancel_futures=True)


def _gone_or_stopped(exc: BaseException | None) -> bool:
    if isinstance(exc, docker.errors.NotFound):
        return True
    return isinstance(exc, docker.errors.APIError) and exc.status_code == 409


def _brief(exc: BaseException) -> str:
    if isinstance(exc, requests.exceptions.ConnectionError | socket.timeout):
        return f"unreachable ({type(exc).__name__})"
    text = str(exc)
    # The runtime's own reason is at the end of a long chain of prefixes.
    return text if len(text) <= 600 else text[:250] + " ... " + text[-350:]
