"""The create request of a sandbox container and the launcher's header (pure)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from backends.base import ExecSpec, InputFile, Limits
from backends.docker.config import Shape, container_request, launch_request, reads_whole
from backends.docker.etc import (
    FILES,
    OWNER,
    PREFIX,
    etc_files,
    make_etc_dir,
    reap_etc_dirs,
    remove_etc_dir,
)
from backends.docker.settings import DockerSettings, GvisorSettings
from backends.runtimes import RuntimeSettings

SHAPE = Shape(memory_mb=256, cpus=0.5, pids=64, disk_mb=16)
LABELS = {"execgate.instance": "1-abc"}


def test_runc_container_request() -> None:
    body = container_request(DockerSettings(), "img:1", SHAPE, LABELS, ["-c", "LAUNCHER"])
    host = body.pop("HostConfig")
    assert body == {
        "Image": "img:1",
        "Cmd": ["/usr/bin/python3", "-I", "-S", "-c", "LAUNCHER"],
        "User": "150000:150000",
        "Env": ["PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/workspace", "LANG=C.UTF-8"],
        "WorkingDir": "/workspace",
        "Hostname": "sandbox",
        "Labels": LABELS,
        "Tty": False,
        "OpenStdin": True,
        "StdinOnce": True,
        "AttachStdin": True,
        "AttachStdout": True,
        "AttachStderr": True,
        "NetworkDisabled": True,
    }
    mib = 1024 * 1024
    ulimits = {u["Name"]: (u["Soft"], u["Hard"]) for u in host.pop("Ulimits")}
    assert ulimits == {"core": (0, 0), "nofile": (256, 256), "fsize": (1024 * mib, 1024 * mib),
                       "cpu": (601, 601)}  # fmt: skip
    assert host.pop("MaskedPaths")[-2:] == ["/sys/firmware", "/sys/fs/cgroup"]
    assert host == {
        "NetworkMode": "none",
        "ReadonlyRootfs": True,
        "CapDrop": ["ALL"],
        "SecurityOpt": ["no-new-privileges"],
        "Privileged": False,
        "Init": False,
        "AutoRemove": False,
        "Memory": (256 + 16) * mib,
        "MemorySwap": (256 + 16) * mib,
        "NanoCpus": 500_000_000,
        "PidsLimit": 65,
        "ShmSize": 16 * mib,
        "IpcMode": "private",
        "Tmpfs": {
            "/workspace": "size=16m,nr_inodes=4096,mode=0700,uid=150000,gid=150000",
            "/tmp": "size=16m,nr_inodes=4096,mode=1777",
            "/code": "size=16m,nr_inodes=64,mode=0755,uid=150000,gid=150000",
        },
        "Mounts": [],
        "Runtime": "runc",
        "LogConfig": {"Type": "none", "Config": {}},
    }


def test_gvisor_counts_processes_inside_the_sandbox() -> None:
    body = container_request(
        GvisorSettings(), "img:1", SHAPE, LABELS, ["-c", "L"], seccomp_json="{}"
    )
    host = body["HostConfig"]
    assert host["Runtime"] == "runsc"
    assert host["PidsLimit"] == 1024  # a backstop for gVisor's own threads
    assert {"Name": "nproc", "Soft": 65, "Hard": 65} in host["Ulimits"]
    assert host["Memory"] == (256 + 64) * 1024 * 1024
    assert host["SecurityOpt"] == ["no-new-privileges", "seccomp={}"]


def test_generated_etc_files_replace_the_engines() -> None:
    body = container_request(
        DockerSettings(), "img:1", SHAPE, LABELS, ["-c", "L"], etc_dir="/dev/shm/e"
    )
    rprivate = {"Propagation": "rprivate"}
    assert body["HostConfig"]["Mounts"] == [
        {"Type": "bind", "Source": f"/dev/shm/e/{name}", "Target": f"/etc/{name}",
         "ReadOnly": True, "BindOptions": rprivate}
        for name in ("hosts", "hostname", "resolv.conf")
    ]  # fmt: skip


def test_etc_dir_files_and_leftovers(tmp_path: Path) -> None:
    files = etc_files("127.0.0.53")
    assert files["resolv.conf"].startswith("nameserver 127.0.0.53\n")
    assert files["hostname"] == "sandbox\n" and "localhost" in files["hosts"]
    made = make_etc_dir("10.200.0.1")
    try:
        assert sorted(p.name for p in made.iterdir()) == [
            ".owner", "hostname", "hosts", "resolv.conf"
        ]  # fmt: skip
        assert str(os.getpid()) not in made.name  # the sandbox sees the name
        assert (made / "resolv.conf").read_text().startswith("nameserver 10.200.0.1\n")
        assert made.stat().st_mode & 0o777 == 0o755
        assert {(made / n).stat().st_mode & 0o777 for n in FILES} == {0o644}
        # A dead gateway's directory (no such process start) is removed; ours stays.
        dead = tmp_path / f"{PREFIX}dead"
        dead.mkdir()
        (dead / OWNER).write_text(f"{os.getpid()} 0")
        reap_etc_dirs(tmp_path)
        reap_etc_dirs(made.parent)
        assert not dead.exists() and made.is_dir()
    finally:
        remove_etc_dir(made)
    assert not made.exists()


def test_launch_request_announces_every_size() -> None:
    spec = ExecSpec("exe_1", "bash", "echo", Limits(timeout_s=3), stdin=b"abc",
                    files=(InputFile("a/b.txt", b"12345"),))  # fmt: skip
    header = launch_request(DockerSettings(), spec, b"echo", "n0nce")
    assert header["nonce"] == "n0nce"
    assert header["argv"] == ["/bin/bash"] and header["filename"] == "main.sh"
    assert (header["code_bytes"], header["files"], header["stdin_bytes"]) == (
        4, [["a/b.txt", 5]], 3,
    )  # fmt: skip
    assert header["backstop_s"] == 5
    assert header["env"] == DockerSettings().env


@pytest.mark.parametrize(
    ("interpreter", "whole"),
    [("/usr/bin/python3", True), ("/usr/local/bin/python3.11", True), ("/usr/bin/node", True),
     ("/bin/bash", False), ("/bin/sh", False), ("/usr/bin/perl", False),
     ("/usr/bin/python3-wrapper", False), ("/usr/bin/nodemon", False)],
)  # fmt: skip
def test_only_interpreters_that_compile_the_whole_program_get_it_early(
    interpreter: str, whole: bool
) -> None:
    # An interpreter that runs what it has read so far (a shell) must not be given
    # its program before the file is in place: it could see the FIFO as its file.
    runtimes = {"x": RuntimeSettings(argv=[interpreter], filename="main")}
    settings = DockerSettings(runtimes=runtimes)
    assert reads_whole(settings, "x") is whole
    spec = ExecSpec("exe_1", "x", "", Limits(timeout_s=3))
    assert launch_request(settings, spec, b"", "n0nce")["whole"] is whole


@pytest.mark.parametrize(
    "bad",
    [{"user": "0:0"}, {"user": "root"}, {"env": {"A=B": "x"}}, {"unknown": 1},
     {"pool_size": -1}, {"runtimes": {"bad name": {"argv": ["/x"], "filename": "m"}}}],
)  # fmt: skip
def test_settings_refuse_unsafe_or_unknown_values(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        DockerSettings.model_validate(bad)


@pytest.mark.parametrize("name", ["EXECGATE_AHEAD", "EXECGATE_NETNS"])
def test_execgates_own_variables_are_not_the_operators(name: str) -> None:
    # The runtime would take a namespace from one, the launcher its start-up from the other.
    with pytest.raises(ValidationError, match=f"{name}.*execgate's own"):
        GvisorSettings.model_validate({"env": {name: "/proc/1/fd/3"}})
