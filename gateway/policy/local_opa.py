"""A local OPA for development, tests and benchmarks: bundle server plus `opa run`.

Starts what deploy/opa/run.sh starts, on loopback ports of its own: the bundle
server over a policy directory and the OPA binary with deploy/opa/config.yaml
(so that file is exercised wherever this runs), then waits for OPA's
`/health?bundles=true`. With `files=True` it starts OPA the way OPA's docs do
instead, `opa run --server --watch DIR`: policies loaded from files, no bundle,
no configuration. Blocking (subprocess and urllib); from async code call
`start` in a thread. Needs a source checkout (it reads deploy/opa/config.yaml).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "deploy" / "opa" / "config.yaml"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LocalOpa:
    """`opa run --server` fed by `gateway.policy.bundle_server` over `policy_dir`."""

    def __init__(
        self,
        opa: str,
        policy_dir: Path,
        log_dir: Path,
        *,
        interval_s: float = 0.2,
        files: bool = False,
    ) -> None:
        self.opa = opa
        self.policy_dir = policy_dir
        self.log_dir = log_dir
        self.interval_s = interval_s
        self.files = files
        self.url = ""
        self._procs: list[subprocess.Popen[bytes]] = []
        self._opa_argv: list[str] = []

    @property
    def log_path(self) -> Path:
        return self.log_dir / "opa.log"

    def start(self, timeout_s: float = 30.0) -> LocalOpa:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        if self.files:
            return self._start_from_files(timeout_s)
        with (self.log_dir / "bundle_server.log").open("ab") as bundle_log:
            bundle = subprocess.Popen(
                [sys.executable, "-m", "gateway.policy.bundle_server",
                 "--path", str(self.policy_dir), "--port", "0",
                 "--interval-s", str(self.interval_s)],
                cwd=REPO, stdout=subprocess.PIPE, stderr=bundle_log,
            )  # fmt: skip
        self._procs.append(bundle)
        assert bundle.stdout is not None
        line = bundle.stdout.readline().decode()
        if "http://" not in line:
            self.stop()
            raise RuntimeError(f"bundle server did not start: {line!r}")
        bundle_addr = line.split("http://", 1)[1].split("/", 1)[0]
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self._opa_argv = [
            self.opa, "run", "--server", "--addr", f"127.0.0.1:{port}",
            "--skip-version-check", "--log-format", "json",
            "--config-file", str(CONFIG),
            "--set", f"services.bundles.url=http://{bundle_addr}",
            # Edits should show quickly here: poll the bundle every second.
            "--set", "bundles.execgate.polling.min_delay_seconds=1",
            "--set", "bundles.execgate.polling.max_delay_seconds=1",
        ]  # fmt: skip
        self._spawn_opa()
        self._wait_ready(timeout_s)
        return self

    def _start_from_files(self, timeout_s: float) -> LocalOpa:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self._opa_argv = [
            self.opa, "run", "--server", "--addr", f"127.0.0.1:{port}",
            "--skip-version-check", "--log-format", "json", "--watch", str(self.policy_dir),
        ]  # fmt: skip
        self._spawn_opa()
        self._wait_ready(timeout_s)
        return self

    def _spawn_opa(self) -> None:
        with self.log_path.open("ab") as opa_log:
            self._procs.append(
                subprocess.Popen(self._opa_argv, stdout=opa_log, stderr=subprocess.STDOUT)
            )

    def kill_opa(self) -> None:
        """SIGKILL the OPA process only (fault tests); the bundle server stays."""
        opa = self._procs.pop()
        opa.kill()
        opa.wait()

    def restart_opa(self, timeout_s: float = 30.0) -> LocalOpa:
        """Start OPA again on the same port, as a supervisor would."""
        self._spawn_opa()
        self._wait_ready(timeout_s)
        return self

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in self._procs):
                break
            try:
                with urllib.request.urlopen(f"{self.url}/health?bundles=true", timeout=1) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.05)
        tail = self.log_tail()
        self.stop()
        raise RuntimeError(f"OPA did not become ready: {tail}")

    def revision(self) -> str:
        with urllib.request.urlopen(f"{self.url}/v1/data/system/bundles", timeout=5) as r:
            return json.loads(r.read())["result"]["execgate"]["manifest"]["revision"]

    def decision_log(self) -> list[dict[str, Any]]:
        entries = []
        for line in self.log_path.read_text().splitlines():
            if '"Decision Log"' in line:
                try:
                    entries.append(json.loads(line))
                except ValueError:  # the line OPA is writing right now
                    continue
        return entries

    def logged_decision(self, decision_id: str, timeout_s: float = 10.0) -> dict[str, Any]:
        """OPA's decision-log entry for `decision_id`, once OPA has written it."""
        deadline = time.monotonic() + timeout_s
        while True:
            for entry in self.decision_log():
                if entry.get("decision_id") == decision_id:
                    return entry
            if time.monotonic() > deadline:
                raise LookupError(f"decision {decision_id} not in {self.log_path}")
            time.sleep(0.05)

    def log_tail(self) -> str:
        return self.log_path.read_text()[-2000:] if self.log_path.exists() else "(no log)"

    def stop(self) -> None:
        for proc in reversed(self._procs):
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        self._procs.clear()
