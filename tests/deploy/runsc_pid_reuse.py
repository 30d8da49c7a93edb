"""Run as PID 1 of a private pid namespace (tests/deploy/test_runsc_safe.py): start a
gVisor sandbox with runsc, optionally let it die, put innocent processes on the pids
runsc recorded for its sandbox and gofer, delete the container with the runsc given,
and print (as JSON) what became of the innocents and of the sandbox.

    unshare --pid --fork --mount-proc python3 runsc_pid_reuse.py DIR RUNSC {dead|running}

Everything happens in this pid namespace: its pids name none of the host's processes.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

RUNSC = "/usr/bin/runsc"
CID = "execgate-pid-reuse"


def reap(pids: list[int]) -> None:
    """Reap these orphans (runsc's sandbox and gofer, children of this PID 1 once
    `runsc create` has exited), as the engine's shim does."""
    for pid in pids:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)


def reaping(pids: list[int], done: threading.Event) -> None:
    while not done.wait(0.01):
        reap(pids)


def runsc_pids() -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if cmdline.startswith((b"runsc-sandbox", b"runsc-gofer")):
                found.append(int(entry.name))
    return found


def bundle(workdir: Path) -> None:
    subprocess.run([RUNSC, "spec", "--", "/bin/sleep", "1000"], cwd=workdir, check=True)
    config = json.loads((workdir / "config.json").read_text())
    config["root"] = {"path": "/", "readonly": True}
    config["process"]["terminal"] = False
    namespaces = config["linux"]["namespaces"]
    config["linux"]["namespaces"] = [n for n in namespaces if n["type"] != "network"]
    (workdir / "config.json").write_text(json.dumps(config))


def main(workdir: Path, delete_with: str, mode: str) -> None:
    # The engine's layout: the bundle directory is named after the container.
    directory = workdir / CID
    directory.mkdir()
    bundle(directory)
    flags = ["--root", str(workdir / "state"), "--network=none"]
    subprocess.run([RUNSC, *flags, "create", "--bundle", str(directory), CID], check=True)
    subprocess.run([RUNSC, *flags, "start", CID], check=True)
    recorded = runsc_pids()
    innocents: dict[int, subprocess.Popen[bytes]] = {}
    if mode == "dead":
        for pid in recorded:
            os.kill(pid, signal.SIGKILL)
        for _ in range(200):  # reaped: their pids are free again
            reap(recorded)
            # Gone from /proc entirely: a zombie still holds its pid.
            reap(recorded)
            if not runsc_pids() and not any(Path(f"/proc/{p}").exists() for p in recorded):
                break
            time.sleep(0.05)
        for pid in recorded:
            # The pid allocator hands out ns_last_pid + 1 next (if free).
            Path("/proc/sys/kernel/ns_last_pid").write_text(str(pid - 1))
            innocent = subprocess.Popen(["sleep", "600"])
            innocents[pid] = innocent
    done = threading.Event()
    reaper = threading.Thread(target=reaping, args=(recorded, done))
    reaper.start()
    try:
        delete = subprocess.run(
            [delete_with, *flags, "delete", "--force", CID], capture_output=True, timeout=60
        )
    finally:
        done.set()
        reaper.join()
    report = {
        "recorded": recorded,
        "innocents_on_recorded_pids": sorted(p.pid for p in innocents.values()),
        "innocents_killed": sorted(p.pid for p in innocents.values() if p.poll() is not None),
        "runsc_left": runsc_pids(),
        "delete_rc": delete.returncode,
        "delete_stderr": delete.stderr.decode(errors="replace")[-500:],
        "state_left": sorted(os.listdir(workdir / "state")),
    }
    for innocent in innocents.values():
        innocent.kill()
        innocent.wait()
    print(json.dumps(report))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], sys.argv[3])
