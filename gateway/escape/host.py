"""The host side of the suite: canaries a sandbox must not reach, and the
snapshots that show whether it did.

Everything listens on 127.0.0.1 and ::1 only, and counts what arrives: a TCP
connection, a datagram or a DNS query from a sandbox is an escape even when the
probe itself could not tell.
"""

from __future__ import annotations

import asyncio
import ctypes
import hashlib
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path
from typing import Any

# Host files whose values must be the same before and after every probe.
WATCHED_SETTINGS = (
    "/proc/sys/kernel/core_pattern", "/proc/sys/kernel/modprobe", "/proc/sys/kernel/hostname",
    "/proc/sys/kernel/sysrq", "/proc/sys/vm/drop_caches", "/sys/kernel/uevent_helper",
    "/sys/kernel/mm/transparent_hugepage/enabled",
)  # fmt: skip
RUNTIME_SOCKETS = (
    "/var/run/docker.sock", "/run/containerd/containerd.sock", "/run/execgate/gateway.sock",
)  # fmt: skip
CREDENTIAL_GLOBS = ("/root/.ssh/*", "/root/.docker/config.json", "/etc/ssh/ssh_host_*_key")
# Where credentials usually are, tried whether or not this host has them (so the
# attempt is made, and recorded, on every host).
CREDENTIAL_GUESSES = (
    "/root/.ssh/id_rsa", "/root/.ssh/id_ed25519", "/root/.docker/config.json",
    "/root/.aws/credentials", "/root/.kube/config", "/etc/ssh/ssh_host_ed25519_key",
)  # fmt: skip
IPC_CREAT = 0o1000


class _Counter(asyncio.DatagramProtocol):
    def __init__(self, hits: list[str], name: str) -> None:
        self.hits, self.name = hits, name

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.hits.append(f"{self.name} datagram from {addr[0]}")


class HostCanaries:
    """Set up with `async with`; `facts` go to the probes, `findings()` after each."""

    def __init__(
        self, credential_files: tuple[str, ...] = (), canary_dir: Path | None = None
    ) -> None:
        self.token = secrets.token_hex(8)
        self.hits: list[str] = []
        self.facts: dict[str, Any] = {"token": self.token}
        self._credential_files = credential_files
        self._closers: list[Any] = []
        # Given: a directory the caller made (tests bind it into weakened sandboxes).
        self._given_dir = canary_dir
        self._dir = Path()
        self._files: dict[Path, tuple[bytes, int]] = {}
        self._settings: dict[str, str] = {}
        self._process: subprocess.Popen[bytes] | None = None
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._sysv: tuple[int, int] = (-1, -1)

    async def __aenter__(self) -> HostCanaries:
        await asyncio.to_thread(self._files_and_ipc)
        await self._servers()
        self._settings = await asyncio.to_thread(self._read_settings)
        return self

    async def __aexit__(self, *exc: object) -> None:
        for close in reversed(self._closers):
            close()
        await asyncio.to_thread(self._cleanup)

    # --- set-up -------------------------------------------------------------------

    def _files_and_ipc(self) -> None:
        # World-readable on purpose: only the sandbox's isolation keeps them out.
        self._dir = self._given_dir or Path(tempfile.mkdtemp(prefix="execgate-escape-", dir="/tmp"))
        self._dir.chmod(0o755)
        paths = [self._dir / "canary"]
        if os.access("/root", os.W_OK):
            paths.append(Path(f"/root/.execgate-escape-{self.token}"))
        for path in paths:
            path.write_text(f"CANARY-{self.token}\n")
            path.chmod(0o644)
            self._files[path] = (path.read_bytes(), path.stat().st_mtime_ns)
        self.facts["canaries"] = [str(p) for p in paths]
        self.facts["canary_dir"] = str(self._dir)
        self.facts["shadow_sha256"] = _sha256("/etc/shadow")
        self.facts["shadow_head"] = (_read("/etc/shadow") or b"").split(b"\n")[0].decode()
        self.facts["ns"] = {n: os.readlink(f"/proc/self/ns/{n}")
                            for n in ("net", "mnt", "pid", "ipc", "uts", "user")}  # fmt: skip
        creds = {str(p): _sha256(str(p)) for g in CREDENTIAL_GLOBS for p in Path("/").glob(g[1:])}
        creds.update({f: _sha256(f) for f in self._credential_files if os.path.isfile(f)})
        self.facts["credentials"] = {k: v for k, v in creds.items() if v}
        self.facts["credential_guesses"] = list(CREDENTIAL_GUESSES)
        self.facts["sockets"] = [s for s in RUNTIME_SOCKETS if os.path.exists(s)]
        # A process of the gateway's uid to ptrace, read and kill.
        self._process = subprocess.Popen(["sleep", "3600"])
        self.facts["pid"] = self._process.pid
        key = int.from_bytes(secrets.token_bytes(3), "big") + 0x4000_0000
        shm = self._libc.shmget(key, 4096, IPC_CREAT | 0o666)
        msg = self._libc.msgget(key, IPC_CREAT | 0o666)
        self._sysv = (shm, msg)
        self.facts["sysv_key"] = key
        self.facts["posix_shm"] = f"execgate-escape-{self.token}"
        Path("/dev/shm", self.facts["posix_shm"]).write_text(self.token)

    async def _servers(self) -> None:
        loop = asyncio.get_running_loop()

        async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.hits.append(f"TCP connection to {writer.get_extra_info('sockname')[:2]}")
            writer.close()

        for key, host in (("tcp4", "127.0.0.1"), ("tcp6", "::1")):
            server = await asyncio.start_server(on_connect, host, 0)
            self._closers.append(server.close)
            self.facts[key] = server.sockets[0].getsockname()[1]
        for key, family, host in (("udp4", socket.AF_INET, "127.0.0.1"),
                                  ("udp6", socket.AF_INET6, "::1")):  # fmt: skip
            transport, _ = await loop.create_datagram_endpoint(
                lambda k=key: _Counter(self.hits, k), local_addr=(host, 0), family=family
            )
            self._closers.append(transport.close)
            self.facts[key] = transport.get_extra_info("sockname")[1]
        try:
            transport, _ = await loop.create_datagram_endpoint(
                lambda: _Counter(self.hits, "dns"), local_addr=("127.0.0.1", 53)
            )
            self._closers.append(transport.close)
            self.facts["dns"] = True
        except OSError:
            self.facts["dns"] = False
        self.facts["abstract"] = f"execgate-escape-{self.token}"
        abstract = await asyncio.start_unix_server(on_connect, "\0" + self.facts["abstract"])
        self._closers.append(abstract.close)

    def _read_settings(self) -> dict[str, str]:
        return {p: (_read(p) or b"").decode(errors="replace") for p in WATCHED_SETTINGS}

    # --- checks -------------------------------------------------------------------

    async def findings(self) -> list[str]:
        """What changed on the host since set-up (and resets the hit counters)."""
        found = await asyncio.to_thread(self._check)
        found += self.hits
        self.hits.clear()  # in place: the datagram counters hold this list
        return found

    def _check(self) -> list[str]:
        found = []
        for path, (content, mtime) in self._files.items():
            try:
                if path.read_bytes() != content or path.stat().st_mtime_ns != mtime:
                    found.append(f"canary {path} changed")
            except OSError:
                found.append(f"canary {path} gone")
        extra = {p.name for p in self._dir.iterdir()} - {"canary"}
        if extra:
            found.append(f"new files next to the canary: {sorted(extra)}")
        if any(path.startswith("/tmp/") for path in map(str, Path("/tmp").glob(f"{self.token}*"))):
            found.append("a file named after the token appeared in the host's /tmp")
        now = self._read_settings()
        found += [f"host setting {p} changed" for p in now if now[p] != self._settings[p]]
        process = self._process
        assert process is not None
        state = _process_state(process.pid)
        if process.poll() is not None or state in ("T", "t", "Z", ""):
            found.append(f"canary process {process.pid} touched (state {state or 'gone'})")
            process.kill()
            process.wait()
            self._process = subprocess.Popen(["sleep", "3600"])
            self.facts["pid"] = self._process.pid
        return found

    def _cleanup(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.wait()
        for path in self._files:
            path.unlink(missing_ok=True)
        if self._given_dir is None:
            shutil.rmtree(self._dir, ignore_errors=True)
        Path("/dev/shm", self.facts.get("posix_shm", "-")).unlink(missing_ok=True)
        shm, msg = self._sysv
        if shm >= 0:
            self._libc.shmctl(shm, 0, None)  # IPC_RMID
        if msg >= 0:
            self._libc.msgctl(msg, 0, None)


def _read(path: str) -> bytes | None:
    try:
        return Path(path).read_bytes()
    except OSError:
        return None


def _sha256(path: str) -> str:
    data = _read(path)
    return hashlib.sha256(data).hexdigest() if data is not None else ""


def _process_state(pid: int) -> str:
    text = (_read(f"/proc/{pid}/stat") or b"").decode()
    return text.rsplit(")", 1)[-1].split()[0] if ")" in text else ""
