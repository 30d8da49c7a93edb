"""gVisor's strace lines into a behaviour record: the lines as this runsc writes them
(taken from real traces), and lines shaped by hostile code."""

from __future__ import annotations

import json
from pathlib import Path

from backends.capture.gvisor import (
    TRACED,
    TraceParser,
    TraceTail,
    read_trace,
    size_of,
    untraced,
)
from backends.capture.record import Baseline, Behaviour, BehaviourRecorder

NAMES = {165: "mount", 101: "ptrace"}


def parse(*messages: str, baseline: Baseline | None = None, max_files: int = 8) -> Behaviour:
    recorder = BehaviourRecorder("gvisor-strace", baseline or Baseline(), max_files=max_files)
    parser = TraceParser(recorder, NAMES)
    for msg in messages:
        parser.message(msg)
    return recorder.finish()


def exit_line(tgid: int, comm: str, call: str, ret: str = "= 0 (0x0)") -> str:
    return f"[{tgid:4d}:{tgid:4d}] {comm} X {call} {ret} (2.1µs)"


def py(call: str, ret: str = "= 0 (0x0)") -> str:
    return exit_line(2, "python3", call, ret)


ENOENT = "= 0 (0x0) errno=2 (no such file or directory)"
EROFS = "= 0 (0x0) errno=30 (read-only file system)"
EPERM = "= 0 (0x0) errno=1 (operation not permitted)"
EACCES = "= 0 (0x0) errno=13 (permission denied)"


def test_file_operations_with_their_errno() -> None:
    b = parse(
        py("openat(AT_FDCWD /tmp, 0x7f /root/.ssh/id_rsa, O_RDONLY, 0o0)", ENOENT),
        py("openat(AT_FDCWD /tmp, 0x7f /etc/passwd, O_RDONLY, 0o0)", "= 3 (0x3)"),
        py("openat(AT_FDCWD /tmp, 0x7f rel.txt, O_WRONLY|O_CREAT, 0o666)", "= 3 (0x3)"),
        py("rename(0x7f rel.txt, 0x7f /tmp/abs.txt)"),
        py("unlinkat(0x3 /tmp, 0x7f nope, 0x200)", ENOENT),
        py("mkdirat(0x3 /tmp, 0x7f mk, 0x1c0)"),
        py("linkat(AT_FDCWD /tmp, 0x7f /tmp/ln, 0xffffff9c, 0x7f ln2, 0x0)"),
        py("truncate(0x7f /etc/hosts, 0x0)", EROFS),
    )
    assert {(f.op, f.path, f.result) for f in b.files} == {
        ("open", "/root/.ssh/id_rsa", "ENOENT"),
        ("open", "/etc/passwd", "ok"),
        ("create", "/tmp/rel.txt", "ok"),
        ("rename", "/tmp/rel.txt -> /tmp/abs.txt", "ok"),
        ("rmdir", "/tmp/nope", "ENOENT"),
        ("mkdir", "/tmp/mk", "ok"),
        ("create", "/tmp/ln2", "ok"),
        ("write", "/etc/hosts", "EROFS"),
    }


def test_a_chdir_forgets_the_working_directory() -> None:
    b = parse(
        exit_line(2, "sh", "openat(AT_FDCWD /tmp, 0x7f /x, O_RDONLY, 0o0)", ENOENT),
        exit_line(2, "sh", "chdir(0x7f /etc)"),
        exit_line(2, "sh", "unlink(0x7f shadow)", EACCES),
    )
    assert ("unlink", "shadow", "EACCES") in {(f.op, f.path, f.result) for f in b.files}


ARGV = '"/bin/sh", "-c", "echo \\"a b\\""'
ENV = '"HOME=/w"'


def test_programs_signals_and_refusals() -> None:
    b = parse(
        exit_line(3, "python3", f"execve(0x7f /bin/sh, 0x7f [{ARGV}], 0x7f [{ENV}])"),
        exit_line(3, "python3", "kill(0x1, SIGKILL)"),
        exit_line(3, "python3", "kill(0x3, 0)"),  # itself: not another process
        exit_line(3, "python3", "tgkill(0x9, 0x9, SIGTERM)", "= 0 (0x0) errno=3 (no such process)"),
        "[   3:   3] Syscall 165: denied by seccomp",
        "[   3:   3] Syscall 165: denied by seccomp",
        "[   3:   3] Syscall 999: denied by seccomp",
        "Unsupported syscall rseq(0x7f,0x20,0x0,0x53053053,0x0,0x0). It is likely ...",
    )
    assert [(p.path, p.argv) for p in b.programs] == [("/bin/sh", ("/bin/sh", "-c", 'echo "a b"'))]
    assert {(s.syscall, s.target, s.signal, s.result) for s in b.signals} == {
        ("kill", 1, 9, "ok"),
        ("tgkill", 9, 15, "ESRCH"),
    }
    assert dict(b.syscalls_refused) == {"mount": 2, "syscall 999": 1, "rseq": 1}


def test_the_launcher_and_the_baseline_are_left_out() -> None:
    baseline = Baseline(syscalls=frozenset({"rseq"}))
    b = parse(
        exit_line(1, "python3", "openat(AT_FDCWD /, 0x7f /etc/shadow, O_RDONLY, 0o0)", ENOENT),
        "[   1:   1] Syscall 165: denied by seccomp",
        "Unsupported syscall rseq(0x0). It is likely ...",
        baseline=baseline,
    )
    assert b.empty


def test_a_command_name_shaped_like_a_call_hides_nothing() -> None:
    # The name is at most 15 bytes: the real " X name(" is the last within them.
    b = parse(
        exit_line(4, "a X kill(0x5", "openat(AT_FDCWD /, 0x7f /etc/x, O_RDONLY, 0o0)", ENOENT),
        exit_line(4, "X kill(0x1, 9)", "openat(AT_FDCWD /, 0x7f /etc/y, O_RDONLY, 0o0)", ENOENT),
    )
    assert {f.path for f in b.files} == {"/etc/x", "/etc/y"}
    assert not b.signals


def test_a_path_with_commas_blurs_only_itself() -> None:
    b = parse(exit_line(2, "p", "mkdir(0x7f /tmp/d, 0x1 /etc/fake\nI1201, 0o777)"))
    assert [f.path for f in b.files] == ["/tmp/d, 0x1 /etc/fake\nI1201"]


def test_lines_that_are_not_calls_are_ignored() -> None:
    b = parse(
        "Installing seccomp filters for 69 syscalls",
        "[   2:   2] python3 E openat(AT_FDCWD /, 0x7f /etc/x, O_RDONLY, 0o0)",
        "[   2:   2] python3 X openat(garbled",
        "[   2:   2] python3 X unknowncall(0x1) = 0 (0x0) (1µs)",
    )
    assert b.empty


def write_log(directory: Path, messages: list[str]) -> Path:
    directory.mkdir()
    path = directory / "runsc.log.20261201-181742.352472.boot.txt"
    path.write_text("".join(json.dumps({"msg": m, "level": "info"}) + "\n" for m in messages))
    return path


def test_read_from_the_hand_over_on_and_bounded(tmp_path: Path) -> None:
    before = [exit_line(2, "p", "openat(AT_FDCWD /, 0x7f /before, O_RDONLY, 0o0)", ENOENT)]
    flood = [
        exit_line(2, "p", f"openat(AT_FDCWD /, 0x7f /nope/{i}, O_RDONLY, 0o0)", ENOENT)
        for i in range(5000)
    ]
    log = write_log(tmp_path / "cid", before)
    offset = size_of(tmp_path / "cid")
    with log.open("a") as f:
        f.write("".join(json.dumps({"msg": m}) + "\n" for m in flood))
    recorder = BehaviourRecorder("gvisor-strace", max_files=8)
    assert read_trace(tmp_path / "cid", offset, TraceParser(recorder, {}), parse_bytes=64 * 1024)
    b = recorder.finish()
    assert "/before" not in {f.path for f in b.files}
    assert len(b.files) == 8
    # Parsed or not, every exit past the hand-over is an entry or counted.
    assert len(b.files) + b.dropped == 5000


def test_a_small_last_read_is_made_at_once_a_large_or_busy_one_is_left(tmp_path: Path) -> None:
    # The final read of a short program's trace is made where the caller is (the
    # event loop): only when it is small and no other read (a watch's, in its
    # thread) holds the tail; otherwise None, and nothing of the tail has moved.
    def tail_after(lines: list[str]) -> TraceTail:
        directory = tmp_path / f"cid{len(list(tmp_path.iterdir()))}"
        log = write_log(directory, [])
        tail = TraceTail(directory, TraceParser(BehaviourRecorder("gvisor-strace"), {}))
        tail.mark()
        with log.open("a") as f:
            f.write("".join(json.dumps({"msg": m}) + "\n" for m in lines))
        return tail

    one = [exit_line(2, "p", "openat(AT_FDCWD /, 0x7f /small, O_RDONLY, 0o0)", ENOENT)]
    small = tail_after(one)
    assert small.last_read_if_small(16 * 1024) is True
    assert {f.path for f in small.parser.recorder.finish().files} == {"/small"}

    many = [
        exit_line(2, "p", f"openat(AT_FDCWD /, 0x7f /big/{i}, O_RDONLY, 0o0)", ENOENT)
        for i in range(500)
    ]
    large = tail_after(many)
    assert large.last_read_if_small(16 * 1024) is None and large.offset < large.size()
    assert large.pump(True)  # in a thread, as before
    assert len(large.parser.recorder.finish().files) + large.parser.recorder.dropped == 500

    busy = tail_after(one)
    with busy._lock:  # a watch's read under way
        assert busy.last_read_if_small(16 * 1024) is None
    unmarked = TraceTail(tmp_path / "absent", TraceParser(BehaviourRecorder("x"), {}))
    assert unmarked.last_read_if_small(16 * 1024) is None


def test_no_trace_is_said(tmp_path: Path) -> None:
    recorder = BehaviourRecorder("gvisor-strace")
    assert not read_trace(tmp_path / "absent", 0, TraceParser(recorder, {}))
    assert size_of(tmp_path / "absent") == 0


def test_a_runtime_without_the_strace_is_named() -> None:
    full = ["--strace", "--debug", "--strace-syscalls=" + ",".join(TRACED)]
    assert untraced("runsc-capture", {"runtimeArgs": full}) == ""
    assert "no runtime 'x'" in untraced("x", None)
    assert "lacks --debug" in untraced("x", {"runtimeArgs": ["--strace"]})
    partial = ["--strace", "--debug", "--strace-syscalls=openat"]
    assert "does not trace" in untraced("x", {"runtimeArgs": partial})


def test_lookups_sockets_modes_and_owners() -> None:
    # The lines as this runsc writes them (each taken from a real trace).
    b = parse(
        py("newfstatat(AT_FDCWD /workspace, 0x7f /etc/shadow-x, 0x7fb7, 0x0)", ENOENT),
        py("newfstatat(0x3 /etc, 0x7f nope-st, 0x7fa9, 0x0)", ENOENT),
        py("statx(AT_FDCWD /workspace, 0x7f /nope/statx, 0x0, 0xfff, 0x7fc2)", ENOENT),
        py("stat(0x7f /root/.kube/config, 0x7fb7)", ENOENT),
        py("lstat(0x7f /proc/1/root/x, 0x7fb7)", ENOENT),
        py("access(0x7f /etc/sudoers-x, 0o4)", ENOENT),
        py("faccessat(0x3 /etc, 0x7f nope-acc, 0o4)", ENOENT),
        py("readlink(0x7f /root/link, 0x7fb7, 0x1000)", ENOENT),
        py("readlinkat(0x3 /etc, 0x7f nope-rl, 0x7fa9, 0x1000)", ENOENT),
        py(
            'connect(0x3 socket:[1], 0x7fb7 {Family: AF_UNIX, Addr: "/var/run/docker.sock"}, 0x17)',
            ENOENT,
        ),
        py(
            'connect(0x3 socket:[1], 0x7fb7 {Family: AF_UNIX, Addr: "\\x00abstract-x"}, 0xd)',
            "= 0 (0x0) errno=111 (connection refused)",
        ),
        py("chmod(0x7f /etc/passwd, 0o777)", EPERM),
        py("fchmodat(0x3 /etc, 0x7f group, 0o777)", EPERM),
        py("chown(0x7f /etc/passwd, 0x0, 0x0)", EPERM),
        py("lchown(0x7f /etc/group, 0x1, 0x1)", EPERM),
        py("fchownat(0x3 /etc, 0x7f hosts, 0x1, 0x1, 0x0)", EPERM),
        py("mknodat(AT_FDCWD /workspace, 0x7f /etc/nod, S_IFCHR|0o600, 0x103)", EACCES),
        py("mknod(0x7f /workspace/n, 0o600, 0x0)"),
        max_files=32,
    )
    assert {(f.op, f.path, f.result) for f in b.files} == {
        ("stat", "/etc/shadow-x", "ENOENT"),
        ("stat", "/etc/nope-st", "ENOENT"),
        ("stat", "/nope/statx", "ENOENT"),
        ("stat", "/root/.kube/config", "ENOENT"),
        ("stat", "/proc/1/root/x", "ENOENT"),
        ("stat", "/etc/sudoers-x", "ENOENT"),
        ("stat", "/etc/nope-acc", "ENOENT"),
        ("stat", "/root/link", "ENOENT"),
        ("stat", "/etc/nope-rl", "ENOENT"),
        ("connect", "/var/run/docker.sock", "ENOENT"),
        ("connect", "@abstract-x", "ECONNREFUSED"),
        ("chmod", "/etc/passwd", "EPERM"),
        ("chmod", "/etc/group", "EPERM"),
        ("chown", "/etc/passwd", "EPERM"),
        ("chown", "/etc/group", "EPERM"),
        ("chown", "/etc/hosts", "EPERM"),
        ("mknod", "/etc/nod", "EACCES"),
        ("mknod", "/workspace/n", "ok"),
    }
    assert b.kinds() == {"files", "lookups", "sockets"}


def test_found_look_ups_and_other_families_are_not_kept() -> None:
    stat = (
        "newfstatat(AT_FDCWD /workspace, 0x7f /usr/bin/python3, 0x7fb7 {dev=8, ino=16,"
        " mode=S_IFREG|0o755, nlink=1, uid=0, gid=0, rdev=0, size=6834488}, 0x0)"
    )
    b = parse(
        py(stat),
        py('readlink(0x7f /etc/alt, 0x7fb7 "a, b", 0x1000)', "= 4 (0x4)"),
        py("connect(0x3 socket:[1], 0x7fb7 {Family: AF_INET, Addr: 127.0.0.1, Port: 80}, 0x10)"),
    )
    assert b.empty, b.as_dict()


def test_a_socket_name_shaped_like_the_line_is_one_name() -> None:
    # Go quotes the address: a crafted name cannot end it early or add a field.
    forged = '"/x\\"}, 0x17) = 0 (0x0)"'
    b = parse(
        py(f"connect(0x3 socket:[1], 0x7fb7 {{Family: AF_UNIX, Addr: {forged}}}, 0x17)", ENOENT),
    )
    assert [(f.op, f.path, f.result) for f in b.files] == [
        ("connect", '/x"}, 0x17) = 0 (0x0)', "ENOENT")
    ]


def test_sysv_keys_but_not_private_objects() -> None:
    b = parse(
        py("shmget(0xc0de, 0x0, 0x0)", ENOENT),
        py("msgget(0xc0df, 0x0)", ENOENT),
        py("semget(0xffffffff, 0x0, 0x0)", ENOENT),
        py("shmget(0x0, 0x1000, 0x380)", "= 1 (0x1)"),
    )
    assert [(f.op, f.path, f.result) for f in b.files] == [
        ("ipc", "shm:0x0000c0de", "ENOENT"),
        ("ipc", "msg:0x0000c0df", "ENOENT"),
        ("ipc", "sem:0xffffffff", "ENOENT"),
    ]
