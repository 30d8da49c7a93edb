"""gVisor's strace lines into a behaviour record: the lines as this runsc writes them
(taken from real traces), and lines shaped by hostile code."""

from __future__ import annotations

import json
from pathlib import Path

from backends.capture.gvisor import TRACED, TraceParser, read_trace, size_of, untraced
from backends.capture.record import Baseline, Behaviour, BehaviourRecorder

NAMES = {165: "mount", 101: "ptrace"}


def parse(*messages: str, baseline: Baseline | None = None) -> Behaviour:
    recorder = BehaviourRecorder("gvisor-strace", baseline or Baseline(), max_files=8)
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
        exit_line(2, "sh", "unlink(0x7f shadow)", "= 0 (0x0) errno=13 (permission denied)"),
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
