"""cgroups: v2 against a fake directory tree, v1 for real on a v1 host."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import time
from pathlib import Path

import pytest

from backends.cgroups import (
    CgroupError,
    CgroupLimits,
    V1Manager,
    V2Manager,
    detect,
    own_cgroups,
    remove_container_leftovers,
)
from tests.backends.conftest import missing_component, require_root

LIMITS = CgroupLimits(memory_bytes=64 << 20, pids_max=17, cpu_quota_us=50_000)


def fake_v2(root: Path, own: str = "/") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "cgroup.controllers").write_text("cpuset cpu io memory hugetlb pids rdma\n")
    (root / "cgroup.subtree_control").write_text("")
    (root / "cgroup.procs").write_text("")
    self_cgroup = root.parent / "self-cgroup"
    self_cgroup.write_text(f"0::{own}\n")
    return self_cgroup


def test_own_cgroups_parses_v1_and_v2_lines(tmp_path: Path) -> None:
    path = tmp_path / "cgroup"
    path.write_text("4:memory:/a/b\n2:cpu,cpuacct:/c\n0::/unified/x\n1:name=systemd:/s\n")
    assert own_cgroups(path) == {
        "memory": "/a/b",
        "cpu": "/c",
        "cpuacct": "/c",
        "": "/unified/x",
        "name=systemd": "/s",
    }


def test_detect_prefers_v2_when_unified(tmp_path: Path) -> None:
    self_cgroup = fake_v2(tmp_path / "cg")
    manager = detect(tmp_path / "cg", "/execgate", "auto", self_cgroup)
    assert isinstance(manager, V2Manager)
    assert manager.parent == tmp_path / "cg" / "execgate"


def test_detect_v1_layout(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    for controller in ("memory", "pids", "cpu", "cpuacct"):
        (root / controller).mkdir(parents=True)
    self_cgroup = tmp_path / "self"
    self_cgroup.write_text("4:memory:/svc\n3:pids:/\n2:cpu:/\n1:cpuacct:/\n")
    manager = detect(root, "/execgate", "auto", self_cgroup)
    assert isinstance(manager, V1Manager)
    assert manager.parents["memory"] == root.resolve() / "memory" / "execgate"
    relative = detect(root, "execgate", "v1", self_cgroup)
    assert isinstance(relative, V1Manager)
    assert relative.parents["memory"] == root.resolve() / "memory" / "svc" / "execgate"


def test_detect_without_cgroups_names_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(CgroupError, match="no usable cgroups"):
        detect(tmp_path, "/execgate", "auto", tmp_path / "none")
    with pytest.raises(CgroupError, match="no cgroup v2"):
        detect(tmp_path, "/execgate", "v2", tmp_path / "none")


def test_v2_prepare_delegates_controllers_down_to_the_parent(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    self_cgroup = fake_v2(root, own="/svc")
    (root / "svc").mkdir()
    (root / "svc" / "cgroup.subtree_control").write_text("")
    manager = detect(root, "sandboxes/execgate", "v2", self_cgroup)
    assert isinstance(manager, V2Manager)
    (root / "svc" / "sandboxes").mkdir()
    (root / "svc" / "sandboxes" / "cgroup.subtree_control").write_text("")
    (root / "svc" / "sandboxes" / "execgate").mkdir()
    (root / "svc" / "sandboxes" / "execgate" / "cgroup.subtree_control").write_text("")
    manager.prepare()
    for level in ("", "svc", "svc/sandboxes", "svc/sandboxes/execgate"):
        control = (root / level / "cgroup.subtree_control").read_text()
        assert control == "+memory +pids +cpu", level
    assert manager.problem() is None


def test_v2_prepare_refuses_missing_controllers(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    self_cgroup = fake_v2(root)
    (root / "cgroup.controllers").write_text("cpu io\n")
    with pytest.raises(CgroupError, match="memory, pids"):
        detect(root, "/execgate", "v2", self_cgroup).prepare()


def test_v2_execution_cgroup_limits_usage_and_removal(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    manager = V2Manager(root, "/execgate", fake_v2(root))
    (root / "execgate").mkdir()
    cgroup = manager.create("123-ab-1", LIMITS)
    d = root / "execgate" / "123-ab-1"
    assert (d / "memory.max").read_text() == str(64 << 20)
    assert (d / "pids.max").read_text() == "17"
    assert (d / "cpu.max").read_text() == "50000 100000"
    assert cgroup.join_files == (d / "cgroup.procs",)
    assert manager.children() == {"123-ab-1"}

    # What the kernel would have counted by the end of a run.
    (d / "cgroup.procs").write_text("")
    (d / "cpu.stat").write_text("usage_usec 1500\nuser_usec 1000\nsystem_usec 500\n")
    (d / "memory.peak").write_text("9437184\n")
    (d / "memory.events").write_text("low 0\nhigh 0\nmax 4\noom 1\noom_kill 1\n")
    (d / "pids.events").write_text("max 12\n")
    usage = cgroup.usage()
    assert (usage.cpu_ns, usage.memory_peak_bytes) == (1_500_000, 9437184)
    assert (usage.oom_kills, usage.pids_max_hits) == (1, 12)

    cgroup.kill_all()  # nothing listed in cgroup.procs: returns at once
    assert not (d / "cgroup.kill").exists() or (d / "cgroup.kill").read_text() == ""
    # cgroupfs drops interface files with the directory; a fake tree must do so itself.
    for f in d.iterdir():
        f.unlink()
    cgroup.remove()
    assert not d.exists()


def test_limits_already_held_are_not_written_again(tmp_path: Path) -> None:
    """A claim whose limits a primed sandbox already has writes nothing; any other
    limits are written whole, and a write that failed leaves them unknown (the next
    apply writes everything again)."""
    root = tmp_path / "cg"
    manager = V2Manager(root, "/execgate", fake_v2(root))
    (root / "execgate").mkdir()
    cgroup = manager.create("123-ab-2", LIMITS)
    d = root / "execgate" / "123-ab-2"
    assert cgroup.applied == LIMITS
    (d / "pids.max").write_text("untouched")
    cgroup.apply(LIMITS)
    assert (d / "pids.max").read_text() == "untouched"
    other = dataclasses.replace(LIMITS, pids_max=9)
    cgroup.apply(other)
    assert (d / "pids.max").read_text() == "9"
    assert cgroup.applied == other
    (d / "memory.max").unlink()
    (d / "memory.max").mkdir()  # the write fails
    with pytest.raises(OSError):
        cgroup.apply(LIMITS)
    assert cgroup.applied is None
    (d / "memory.max").rmdir()
    (d / "pids.max").write_text("untouched")
    cgroup.apply(other)  # the same as before the failure, written again
    assert (d / "pids.max").read_text() == "9"


def test_v2_usage_on_old_kernels_is_zero_not_an_error(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    manager = V2Manager(root, "/execgate", fake_v2(root))
    (root / "execgate").mkdir()
    usage = manager.create("1-a-1", LIMITS).usage()
    assert usage.memory_peak_bytes == 0 and usage.oom_kills == 0


def test_reap_keeps_what_the_predicate_keeps(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    manager = V2Manager(root, "/execgate", fake_v2(root))
    (root / "execgate" / "keep-me").mkdir(parents=True)
    (root / "execgate" / "stale").mkdir()
    assert manager.reap(lambda name: name.startswith("keep")) == ["stale"]
    assert manager.children() == {"keep-me"}


# --- the real thing ------------------------------------------------------------------


@pytest.mark.integration
def test_v1_for_real_limits_kill_and_remove() -> None:
    require_root()
    manager = detect()
    if not isinstance(manager, V1Manager):
        missing_component("this host has no cgroup v1 (v2 is tested with a fake tree)")
    manager.prepare()
    name = f"{os.getpid()}-cgtest-{time.monotonic_ns()}"
    cgroup = manager.create(name, LIMITS)
    try:
        assert (cgroup.dirs["memory"] / "memory.limit_in_bytes").read_text().strip() == str(
            64 << 20
        )
        assert (cgroup.dirs["pids"] / "pids.max").read_text().strip() == "17"
        script = 'for f; do echo 0 > "$f"; done; sleep 60 & sleep 60 & wait'
        procs = [str(p) for p in cgroup.join_files]
        assert all(p.endswith("/tasks") for p in procs)
        child = subprocess.Popen(["/bin/sh", "-c", script, "sh", *procs])
        for _ in range(500):
            if len(cgroup.pids()) >= 3:
                break
            time.sleep(0.01)
        assert child.pid in cgroup.pids()
        cgroup.kill_all()
        assert child.wait(timeout=5) == -9
        assert cgroup.pids() == set()
        assert cgroup.usage().cpu_ns > 0
    finally:
        cgroup.kill_all()
        cgroup.remove()
    assert name not in manager.children()


def test_container_leftovers_v1_v2_and_systemd_layouts_removed(tmp_path: Path) -> None:
    cid = "f" * 64
    made = [
        tmp_path / "memory" / "docker" / cid,
        tmp_path / "pids" / "docker" / cid / "inner",  # a runtime's own nested cgroup
        tmp_path / "unified" / "docker" / cid,
        tmp_path / "system.slice" / f"docker-{cid}.scope",
    ]
    for path in made:
        path.mkdir(parents=True)
    other = tmp_path / "memory" / "docker" / ("e" * 64)
    other.mkdir()
    busy = tmp_path / "cpu" / "docker" / cid
    busy.mkdir(parents=True)
    (busy / "cgroup.procs").write_text("123\n")  # not empty: a process still in it

    removed = remove_container_leftovers(cid, root=tmp_path)

    assert not any(p.exists() for p in made)
    assert len(removed) == 4
    assert other.is_dir() and busy.is_dir()  # another container's, and a busy one
    for hostile in ("", "..", "../memory", "a/b"):
        assert remove_container_leftovers(hostile, root=tmp_path) == []
    assert other.is_dir()
