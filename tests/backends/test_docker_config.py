"""The create request of a sandbox container and the launcher's header (pure)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from backends.base import ExecSpec, InputFile, Limits
from backends.docker_config import Shape, container_request, launch_request
from backends.docker_settings import DockerSettings, GvisorSettings

SHAPE = Shape(memory_mb=256, cpus=0.5, pids=64, disk_mb=16)
LABELS = {"execgate.instance": "1-abc"}


def test_runc_container_request() -> None:
    body = container_request(DockerSettings(), "img:1", SHAPE, LABELS, "LAUNCHER")
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
        "Runtime": "runc",
        "LogConfig": {"Type": "none", "Config": {}},
    }


def test_gvisor_counts_processes_inside_the_sandbox() -> None:
    body = container_request(GvisorSettings(), "img:1", SHAPE, LABELS, "L", seccomp_json="{}")
    host = body["HostConfig"]
    assert host["Runtime"] == "runsc"
    assert host["PidsLimit"] == 1024  # a backstop for gVisor's own threads
    assert {"Name": "nproc", "Soft": 65, "Hard": 65} in host["Ulimits"]
    assert host["Memory"] == (256 + 64) * 1024 * 1024
    assert host["SecurityOpt"] == ["no-new-privileges", "seccomp={}"]


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
    "bad",
    [{"user": "0:0"}, {"user": "root"}, {"env": {"A=B": "x"}}, {"unknown": 1},
     {"pool_size": -1}, {"runtimes": {"bad name": {"argv": ["/x"], "filename": "m"}}}],
)  # fmt: skip
def test_settings_refuse_unsafe_or_unknown_values(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        DockerSettings.model_validate(bad)
