"""Workspaces: input path checks, output collection, the tmpfs lifecycle."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from backends.base import InputFile
from backends.workspace import Workspace, WorkspaceError, WorkspaceManager, checked_relative
from tests.backends.conftest import require_root


@pytest.mark.parametrize(
    "path",
    ["", "/etc/passwd", "../x", "a/../../x", "a//b", "./a", "a/./b", "a\\b", "a\x00b", "a/"],
)
def test_unsafe_input_paths_are_refused(path: str) -> None:
    with pytest.raises(WorkspaceError):
        checked_relative(path)


@pytest.mark.parametrize("path", ["a", "a/b/c.txt", ".hidden", "x..y", "dir.d/f"])
def test_plain_relative_paths_pass(path: str) -> None:
    assert checked_relative(path).as_posix() == path


def manager(tmp_path: Path) -> WorkspaceManager:
    return WorkspaceManager(tmp_path / "runs", os.getuid(), os.getgid())


def plain_workspace(tmp_path: Path) -> Workspace:
    root = tmp_path / "ws-root"
    (root / "workspace").mkdir(parents=True)
    return Workspace(root=root)


def test_collect_takes_regular_files_only(tmp_path: Path) -> None:
    ws = plain_workspace(tmp_path)
    top = ws.workspace_dir
    (top / "a.txt").write_bytes(b"A")
    (top / "sub" / "deeper").mkdir(parents=True)
    (top / "sub" / "deeper" / "b.bin").write_bytes(b"\x00\x01")
    (top / "link-out").symlink_to("/etc/passwd")
    (top / "link-in").symlink_to(top / "a.txt")
    (top / "dirlink").symlink_to("/etc")
    os.mkfifo(top / "fifo")
    got = manager(tmp_path).collect(ws, max_files=10, max_file_bytes=100, max_total_bytes=1000)
    assert [(f.path, f.content, f.size) for f in got.files] == [
        ("a.txt", b"A", 1),
        ("sub/deeper/b.bin", b"\x00\x01", 2),
    ]
    assert len(got.skipped) == 4  # three links and the fifo, each said


def test_collect_caps_size_count_and_total(tmp_path: Path) -> None:
    ws = plain_workspace(tmp_path)
    for i in range(5):
        (ws.workspace_dir / f"f{i}").write_bytes(b"x" * 10)
    (ws.workspace_dir / "huge").write_bytes(b"y" * 101)
    m = manager(tmp_path)
    got = m.collect(ws, max_files=10, max_file_bytes=100, max_total_bytes=1000)
    assert [f.path for f in got.files] == ["f0", "f1", "f2", "f3", "f4"]
    assert any("huge" in s for s in got.skipped)
    got = m.collect(ws, max_files=2, max_file_bytes=100, max_total_bytes=1000)
    assert [f.path for f in got.files] == ["f0", "f1"]
    got = m.collect(ws, max_files=10, max_file_bytes=100, max_total_bytes=25)
    assert [f.path for f in got.files] == ["f0", "f1"]


def test_collect_skips_unchanged_inputs(tmp_path: Path) -> None:
    import hashlib

    ws = plain_workspace(tmp_path)
    (ws.workspace_dir / "same").write_bytes(b"1")
    (ws.workspace_dir / "changed").write_bytes(b"2")
    ws.inputs = {"same": hashlib.sha256(b"1").digest(), "changed": hashlib.sha256(b"x").digest()}
    got = manager(tmp_path).collect(ws, max_files=10, max_file_bytes=10, max_total_bytes=10)
    assert [f.path for f in got.files] == ["changed"]


@pytest.fixture
def root_manager(sandbox_state_dir: Path) -> WorkspaceManager:
    require_root()
    m = WorkspaceManager(sandbox_state_dir / "runs", 170001, 170001)
    m.prepare()
    return m


@pytest.mark.integration
def test_tmpfs_workspace_lifecycle(root_manager: WorkspaceManager) -> None:
    files = (InputFile("in/data.csv", b"1,2\n"), InputFile("top.txt", b"t"))
    ws = root_manager.create("1-t-1", 64)
    try:
        assert os.path.ismount(ws.root)
        assert os.statvfs(ws.root).f_blocks * os.statvfs(ws.root).f_frsize == 64 << 20
        root_manager.fill(ws, 2, "main.py", b"print(1)", files)
        # Shrunk to the request's size by a remount of the same tmpfs.
        assert os.statvfs(ws.root).f_blocks * os.statvfs(ws.root).f_frsize == 2 << 20
        code_file = ws.code_dir / "main.py"
        assert code_file.read_bytes() == b"print(1)"
        st = os.stat(code_file)
        assert (st.st_uid, st.st_mode & 0o777) == (0, 0o644)
        data = ws.workspace_dir / "in" / "data.csv"
        assert data.read_bytes() == b"1,2\n"
        assert os.stat(data).st_uid == 170001
        assert os.stat(ws.workspace_dir / "in").st_uid == 170001
        assert os.stat(ws.root).st_mode & 0o777 == 0o700
        # The disk cap: 2 MiB, all directories together.
        with pytest.raises(OSError), open(ws.tmp_dir / "big", "wb") as f:
            f.write(b"0" * (3 << 20))
        assert root_manager.disk_full(ws)
    finally:
        root_manager.destroy(ws)
    assert not ws.root.exists()
    assert root_manager.names() == set()


@pytest.mark.integration
def test_inputs_that_do_not_fit_are_refused_and_cleaned(root_manager: WorkspaceManager) -> None:
    ws = root_manager.create("1-t-2", 64)
    try:
        with pytest.raises(WorkspaceError, match="disk limit"):
            root_manager.fill(ws, 1, "main.py", b"", (InputFile("big", b"0" * (2 << 20)),))
    finally:
        root_manager.destroy(ws)
    assert root_manager.names() == set()


@pytest.mark.integration
def test_colliding_inputs_are_refused(root_manager: WorkspaceManager) -> None:
    files = (InputFile("a", b"file"), InputFile("a/b", b"under a file"))
    ws = root_manager.create("1-t-3", 1)
    try:
        with pytest.raises(WorkspaceError, match="collides"):
            root_manager.fill(ws, 1, "main.py", b"", files)
        with pytest.raises(WorkspaceError, match="not a plain relative path"):
            root_manager.fill(ws, 1, "other.py", b"", (InputFile("../escape", b"x"),))
    finally:
        root_manager.destroy(ws)
    assert root_manager.names() == set()


@pytest.mark.integration
def test_reap_unmounts_leftovers(root_manager: WorkspaceManager) -> None:
    root_manager.create("999999999-dead-1", 1)
    (root_manager.runs_dir / "999999999-dead-2").mkdir()  # crashed before mounting
    (root_manager.runs_dir / "999999999-dead-2" / "junk").write_text("x")
    assert root_manager.reap(lambda name: False) == ["999999999-dead-1", "999999999-dead-2"]
    assert root_manager.names() == set()
