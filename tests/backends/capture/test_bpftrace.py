"""The tracer's program and its lines (pure): what the kernel side filters and prints."""

from __future__ import annotations

from backends.capture.bpftrace import (
    BARRIER_WHICH,
    REGISTER_WHICH,
    UNREGISTER_WHICH,
    Line,
    allowed_calls,
    open_op,
    parse,
    program,
    refusable_calls,
)


def test_the_filter_and_the_key_follow_the_gateways_level() -> None:
    text = program(level=2, cap=100, refusable=["mount", "ptrace"], gateway_pid=4242)
    # Only tasks below the gateway's namespace; each named by the one just below it,
    # so a namespace the code makes inside its sandbox is still the sandbox's.
    assert "/curtask->thread_pid->level > 2/" in text
    assert "((struct upid *)curtask->thread_pid->numbers + 3)->ns->ns.inum" in text
    # Only registered namespaces print, up to the cap.
    assert "if (@on[$ns] && @n[$ns] >= 100)" in text
    # The markers count from the gateway's own process only, never from a sandbox.
    gateway = (
        "curtask->thread_pid->level == 2 &&"
        " ((struct upid *)curtask->group_leader->thread_pid->numbers + 2)->nr == 4242"
    )
    for which in (BARRIER_WHICH, REGISTER_WHICH, UNREGISTER_WHICH):
        assert f"/args->which == {which} && {gateway}/" in text
    assert text.count("args->which ==") == 3
    # Refusals are exits without their entry, on the calls the policy may refuse
    # (raw_syscalls would cost every system call on the host).
    assert "tracepoint:syscalls:sys_exit_mount,\ntracepoint:syscalls:sys_exit_ptrace" in text
    # No raw_syscalls: it would tax every system call of every process on the host.
    # What the policies kill (other architectures) is named from its SIGSYS.
    assert "raw_syscalls" not in text
    assert "tracepoint:signal:signal_generate\n/args->sig == 31 && args->code == 1" in text
    calls = ("openat", "openat2", "creat", "unlinkat", "renameat2", "mkdirat", "rmdir",
             "execve", "execveat", "kill", "tgkill", "ptrace", "process_vm_writev")  # fmt: skip
    for call in calls:
        assert f"sys_enter_{call} " in text, call


def test_a_path_keeps_every_byte_of_its_own() -> None:
    # The path is the last field: spaces, newlines and anything that looks like
    # another event stay inside it.
    line = parse("f 4026532001 7 123 1 0 -2 /tmp/a b\nf 4026532999 1 1 1 0 0 /etc/x\n")
    forged = "/tmp/a b\nf 4026532999 1 1 1 0 0 /etc/x"
    assert line == Line("f", 4026532001, 7, 123, (1, 0, -2), forged)


def test_malformed_lines_are_ignored() -> None:
    for data in ("", "q 1 2 3", "f 1 2 3", "f x 2 3 1 0 0 /p", "r 1 2 3 4", "r 1 2 3 4 5 6",
                 "X 1 2 3 zero", "b 1 2"):  # fmt: skip
        assert parse(data) is None, data
    assert parse("r 5 6 7 165 -1\n") == Line("r", 5, 6, 7, (165, -1))
    assert parse("b 5 1 9 12\n") == Line("b", 5, 1, 9, (12,))


def test_open_flags_name_the_operation() -> None:
    assert open_op(0) == "open"
    assert open_op(0o2000000) == "open"  # O_CLOEXEC alone reads
    assert open_op(1) == "write" and open_op(2) == "write"
    assert open_op(0o1000) == "write"  # O_TRUNC
    assert open_op(0o101) == "create"


def test_refusable_calls_are_all_but_the_unconditionally_allowed() -> None:
    kafel = (
        "POLICY p { ALLOW { read, write,\n"
        "  clone(flags) { (flags & 1) == 0 }, // a condition: refusable\n"
        "  socket(family, type, protocol) { family == 1 || (family == 16 && protocol == 0) },"
        "  brk } }\nUSE p DEFAULT ERRNO(1)"
    )
    assert allowed_calls(kafel) == {"read", "write", "brk"}
    calls = ["read", "write", "brk", "clone", "socket", "mount"]
    assert refusable_calls(calls, kafel) == ["clone", "mount", "socket"]
    # The bundled allowlist: the privileged calls are refusable, the plain ones not.
    bundled = refusable_calls(["mount", "unshare", "ptrace", "bpf", "openat", "read", "ioctl"])
    assert bundled == ["bpf", "ioctl", "mount", "ptrace", "unshare"]
