"""Which nsjail runs the sandboxes, and what `make nsjail`'s static build promises.

The Makefile sets $EXECGATE_NSJAIL_BIN to its build (deploy/nsjail/build.sh), so the
whole suite, CI's included, runs on the binary `make run` uses. The build is static
(no dynamic linker, the cost it exists to remove) and never resolves an id by name: a
--user or --group id that is not a number is refused, where the wheel's binary asks the
host's account database first (a name like "root" would map the sandbox to uid 0, and
an account named "200000" would win over the number 200000).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from backends.base import BackendError
from backends.nsjail.backend import NsjailBackend
from backends.nsjail.host import NSJAIL_BIN_ENV, default_nsjail_binary
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
