"""`execgate serve` as a real subprocess on a free loopback port (replica tests, load).

Blocking (subprocess, urllib): call `start` and `stop` from a thread in async code.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from gateway.settings.model import BUILT_TOOLS_ENV

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class GatewayProcess:
    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.port = free_port()
        base = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("EXECGATE_") or k in BUILT_TOOLS_ENV
        }
        self.env = {**base, **env, "EXECGATE_SERVER_PORT": str(self.port)}
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 60) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "gateway", "serve", "--host", "127.0.0.1"],
                env=self.env,
                cwd=REPO,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gateway exited: {self.log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(self.url + "/readyz", timeout=1) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"gateway not ready: {self.log.read_text()[-2000:]}")

    def kill(self) -> None:
        """Die without any clean-up (a crashed replica)."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None
