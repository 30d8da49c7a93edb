"""deploy/docker/runsc-netns: what the runtime puts in a gVisor sandbox's spec, and
what it refuses (the container then does not start).

Real files and real namespaces: the script runs as runsc-egress runs it, on a
bundle's config.json, against descriptors this test process holds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from backends.egress.netns import discard, enter, run_in_thread
from tests.backends.egress.test_boundary import require_root

SCRIPT = Path(__file__).resolve().parents[2] / "deploy" / "docker" / "runsc-netns"
VARIABLE = "EXECGATE_NETNS"


def spec(env: list[str], network: dict[str, str] | None = None) -> dict[str, Any]:
    """The parts of an engine-made spec that matter here (docker's `none` network)."""
    namespaces = [{"type": "pid"}, {"type": "mount"}]
    if network is not None:
        namespaces.insert(1, network)
    return {
        "ociVersion": "1.0.2",
        "process": {"args": ["python3"], "env": ["PATH=/usr/bin", *env], "cwd": "/"},
        "linux": {"namespaces": namespaces},
    }


def run(tmp_path: Path, document: dict[str, Any]) -> tuple[int, str, dict[str, Any]]:
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    config = bundle / "config.json"
    config.write_text(json.dumps(document))
    config.chmod(0o600)
    log = tmp_path / "log.json"
    done = subprocess.run(
        [sys.executable, "-I", "-S", str(SCRIPT), str(config), str(log)],
        capture_output=True,
        text=True,
    )
    if done.returncode:
        # The reason is in the runtime's log too, as the engine reads it.
        (line,) = log.read_text().splitlines()
        assert json.loads(line) == {"level": "error", "msg": done.stderr.strip()}
    else:
        assert not log.exists()
    return done.returncode, done.stderr, json.loads(config.read_text())


@pytest.fixture
def netns() -> Iterator[str]:
    """A new network namespace, held by this process: /proc/PID/fd/N."""
    require_root()
    fd = run_in_thread(lambda: enter(None))
    assert fd is not None
    try:
        yield f"/proc/{os.getpid()}/fd/{fd}"
    finally:
        discard([], fd)


def test_the_namespace_goes_into_the_spec_and_the_variable_out_of_it(
    tmp_path: Path, netns: str
) -> None:
    code, err, after = run(tmp_path, spec([f"{VARIABLE}={netns}", "A=1"], {"type": "network"}))
    assert code == 0, err
    assert {"type": "network", "path": netns} in after["linux"]["namespaces"]
    assert after["process"]["env"] == ["PATH=/usr/bin", "A=1"]
    assert (tmp_path / "bundle" / "config.json").stat().st_mode & 0o777 == 0o600
    assert sorted(os.listdir(tmp_path / "bundle")) == ["config.json"]


def test_everything_else_in_the_spec_is_kept_as_it_was(tmp_path: Path, netns: str) -> None:
    document = spec([f"{VARIABLE}={netns}"], {"type": "network"})
    # What a spec can carry: any string (escapes, non-ASCII, controls), numbers of
    # every size, nesting, null and booleans.
    document["process"]["args"] += ['h\u00e9llo "q" \\ \x01 \u2028 \U0001f600', ""]
    document["annotations"] = {"n": None, "t": True, "f": False, "x": 1.5, "big": 10**20}
    document["linux"]["resources"] = {"memory": {"limit": 268435456}, "devices": []}
    code, err, after = run(tmp_path, document)
    assert code == 0, err
    document["linux"]["namespaces"][1]["path"] = netns
    document["process"]["env"] = ["PATH=/usr/bin"]
    assert after == document


@pytest.mark.parametrize(
    "text",
    ["", "[]", "{", '{"a": 1} {"b": 2}', '{"a": NaN}', "\ufeff{}", '{"a": "\\x"}'],
)
def test_a_spec_that_is_not_a_json_object_is_refused(tmp_path: Path, text: str) -> None:
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text(text)
    done = subprocess.run(
        [sys.executable, "-I", "-S", str(SCRIPT), str(bundle / "config.json")],
        capture_output=True,
        text=True,
    )
    assert done.returncode != 0
    assert "runsc-netns: " in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert (bundle / "config.json").read_text() == text


def test_surrounding_whitespace_is_json_too(tmp_path: Path, netns: str) -> None:
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    config = bundle / "config.json"
    config.write_text("\n " + json.dumps(spec([f"{VARIABLE}={netns}"], {"type": "network"})) + "\n")
    done = subprocess.run(
        [sys.executable, "-I", "-S", str(SCRIPT), str(config)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert {"type": "network", "path": netns} in json.loads(config.read_text())["linux"][
        "namespaces"
    ]


def refused(tmp_path: Path, document: dict[str, Any], message: str) -> None:
    code, err, after = run(tmp_path, document)
    assert code != 0
    assert message in err, err
    assert "Traceback" not in err
    assert after == document
    assert sorted(os.listdir(tmp_path / "bundle")) == ["config.json"]


# Other shapes of a path to the namespace, or to one through a link: given this
# process's pid, the descriptor's number and its canonical path.
SHAPES: dict[str, Callable[[int, int, str], str]] = {
    "empty": lambda pid, fd, path: "",
    "own-ns": lambda pid, fd, path: "/proc/self/ns/net",
    "pid-ns-path": lambda pid, fd, path: f"/proc/{pid}/ns/net",
    "dotdot": lambda pid, fd, path: f"/proc/{pid}/fd/../fd/{fd}",
    "relative": lambda pid, fd, path: path.lstrip("/"),
    "self": lambda pid, fd, path: f"/proc/self/fd/{fd}",
    "thread": lambda pid, fd, path: f"/proc/{pid}/task/{pid}/fd/{fd}",
    "trailing": lambda pid, fd, path: path + "\n",
    "doubled": lambda pid, fd, path: path.replace("/fd/", "//fd/"),
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_a_path_of_another_shape_is_refused(tmp_path: Path, netns: str, shape: str) -> None:
    value = SHAPES[shape](os.getpid(), int(netns.rsplit("/", 1)[1]), netns)
    refused(tmp_path, spec([f"{VARIABLE}={value}"], {"type": "network"}), "is not /proc/PID/fd/N")


@pytest.mark.parametrize(
    ("target", "message"),
    [
        # A descriptor of something else: a file, another kind of namespace.
        (__file__, "is not a network namespace"),
        ("/proc/self/ns/pid", "is not a network namespace"),
        ("/proc/self/ns/mnt", "is not a network namespace"),
        # The host's own network namespace, through a descriptor.
        ("/proc/self/ns/net", "the host's network namespace"),
        # A descriptor that is not open.
        ("", "cannot open"),
    ],
)
def test_a_descriptor_of_anything_else_is_refused(
    tmp_path: Path, netns: str, target: str, message: str
) -> None:
    held = os.open(target, os.O_RDONLY) if target else 2**20
    try:
        document = spec([f"{VARIABLE}=/proc/{os.getpid()}/fd/{held}"], {"type": "network"})
        refused(tmp_path, document, message)
    finally:
        if target:
            os.close(held)


@pytest.mark.parametrize(
    ("times", "network", "message"),
    [
        # No variable, or two.
        (0, {"type": "network"}, "name its network namespace once"),
        (2, {"type": "network"}, "name its network namespace once"),
        # A spec that is not the engine's `none` network: one that joins a namespace
        # already, or none at all.
        (1, {"type": "network", "path": "/proc/1/ns/net"}, "does not ask for a new"),
        (1, None, "does not ask for a new network namespace"),
    ],
)
def test_a_spec_not_made_for_it_is_refused(
    tmp_path: Path, netns: str, times: int, network: dict[str, str] | None, message: str
) -> None:
    refused(tmp_path, spec([f"{VARIABLE}={netns}"] * times, network), message)
