"""The host tracer's bpftrace program and the lines it prints (pure functions).

One program per backend instance, on system-call tracepoints only (no kprobes:
they are not available everywhere, and tracepoints are a stable interface).
The kernel-side filter keeps only tasks whose pid namespace is below the
gateway's (`level > L`) and names each event by the pid namespace at level
L + 1, the sandbox's own: code that makes a nested pid namespace is still
attributed to its sandbox. `numbers[]` is a flexible array, which bpftrace 0.17
does not index, so it is reached by pointer arithmetic on `struct upid`.

Refused system calls need no policy knowledge: a call that seccomp refuses
(ERRNO, TRAP) skips the `sys_enter` tracepoints but still passes `sys_exit`,
so an exit with no matching entry on that thread is a refusal.

Every line is `kind ns pid nsecs ...` (pid as the sandbox names it, nsecs on
CLOCK_MONOTONIC), the path always last so any byte in it (spaces, newlines:
bpftrace's JSON output escapes them) stays inside its own field. Per sandbox
namespace at most `cap` events are printed; the rest are counted in the kernel
and the count is printed at the end (a barrier marker or the namespace's init
exiting), so a flood costs bounded work in the tracer and the gateway.

Only registered namespaces print anything: the gateway registers a sandbox's
namespace when an execution claims it and forgets it at the end, each with a
marker call (`getpriority` with a `which` no kernel knows). Sandboxes waiting
in a pool, other backends' and other gateways' cost the tracer one map look-up
per traced call and the gateway nothing. The markers count only from the
gateway process itself: code in a sandbox that makes the same call to end its
own record early or reset its cap is ignored (the call fails with EINVAL).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import resources

from backends.capture.record import RUNTIME_PREFIXES, SENSITIVE_PREFIXES
from backends.capture.syscalls import COMPAT_FLAG

# getpriority(<which>, ns) from the gateway: "print what you have for ns" (and
# forget it), "follow ns", "forget ns". Invalid `which` values (EINVAL), so the
# calls do nothing else.
BARRIER_WHICH = 0x6578
REGISTER_WHICH = 0x6579
UNREGISTER_WHICH = 0x657A
# bpftrace 0.17's longest string (strings live on the 512-byte BPF stack).
STRLEN = 200
MAX_ARGS = 16
# Per thread state lives in hash maps keyed by tid; this bounds each of them.
MAP_KEYS = 16384

# File operation codes the program prints.
OPS = {1: "open", 2: "create", 3: "unlink", 4: "rename", 5: "mkdir", 6: "rmdir", 7: "stat",
       8: "connect", 9: "chmod", 10: "chown", 11: "write", 12: "mknod", 13: "create"}  # fmt: skip
# A connect's flags: the unix socket name is abstract (no file; shown "@name").
ABSTRACT = 1
# Signal-like system call codes.
SIGNAL_CALLS = {
    1: "kill",
    2: "tkill",
    3: "tgkill",
    4: "ptrace",
    5: "process_vm_readv",
    6: "process_vm_writev",
}
# SysV IPC look-ups by key (IPC_PRIVATE, 0, makes a new private object: not one).
IPC_CALLS = {1: "shm", 2: "msg", 3: "sem"}
O_ACCMODE, O_CREAT, O_TRUNC = 0o3, 0o100, 0o1000
OPEN_CHANGES = O_ACCMODE | O_CREAT | O_TRUNC
# The head of a path the kernel side compares with the prefixes below (a short read:
# the BPF stack holds the full path once, for the line).
PREFIX_LEN = 16
AT_REMOVEDIR = 0x200

# (tracepoint, op code, path argument, second path argument or "", flags expression)
_FILE_CALLS = (
    ("openat", 1, "filename", "", "args->flags"),
    ("open", 1, "filename", "", "args->flags"),
    ("openat2", 1, "filename", "", "((struct open_how *)args->how)->flags"),
    ("creat", 2, "pathname", "", "0"),
    ("unlink", 3, "pathname", "", "0"),
    ("unlinkat", 3, "pathname", "", "args->flag"),
    ("rename", 4, "oldname", "newname", "0"),
    ("renameat", 4, "oldname", "newname", "0"),
    ("renameat2", 4, "oldname", "newname", "0"),
    ("mkdir", 5, "pathname", "", "0"),
    ("mkdirat", 5, "pathname", "", "0"),
    ("rmdir", 6, "pathname", "", "0"),
    # Looking a path up without opening it: failures only (a probe for what exists).
    ("newstat", 7, "filename", "", "0"),
    ("newlstat", 7, "filename", "", "0"),
    ("newfstatat", 7, "filename", "", "0"),
    ("statx", 7, "filename", "", "0"),
    ("access", 7, "filename", "", "0"),
    ("faccessat", 7, "filename", "", "0"),
    ("faccessat2", 7, "filename", "", "0"),
    ("readlink", 7, "path", "", "0"),
    ("readlinkat", 7, "pathname", "", "0"),
    # Changes to a file's mode, owner or size, and new names for files: always kept.
    ("chmod", 9, "filename", "", "0"),
    ("fchmodat", 9, "filename", "", "0"),
    ("chown", 10, "filename", "", "0"),
    ("lchown", 10, "filename", "", "0"),
    ("fchownat", 10, "filename", "", "0"),
    ("truncate", 11, "path", "", "0"),
    ("mknod", 12, "filename", "", "0"),
    ("mknodat", 12, "filename", "", "0"),
    # A link or symlink: a new file at its name (as gVisor's trace records it).
    ("link", 13, "newname", "", "0"),
    ("linkat", 13, "newname", "", "0"),
    ("symlink", 13, "newname", "", "0"),
    ("symlinkat", 13, "newname", "", "0"),
)
AF_UNIX = 1
# (tracepoint, code, target expression, signal/request expression)
_SIGNAL_CALLS = (
    ("kill", 1, "args->pid", "args->sig"),
    ("tkill", 2, "args->pid", "args->sig"),
    ("tgkill", 3, "args->pid", "args->sig"),
    ("ptrace", 4, "args->pid", "args->request"),
    ("process_vm_readv", 5, "args->pid", "0"),
    ("process_vm_writev", 6, "args->pid", "0"),
)


# x86's thread_info.status bit for a task inside a 32-bit system call.
TS_COMPAT = 0x0002
# x86-64's kernel stack (THREAD_SIZE, without KASAN) ends in the user registers.
THREAD_SIZE = 16384
PT_REGS_SIZE = 168
SIGSYS, SYS_SECCOMP = 31, 1


def program(level: int, cap: int, refusable: Sequence[str] = (), gateway_pid: int = 0) -> str:
    """The bpftrace program for a gateway whose pid namespace is at `level` and
    whose pid there is `gateway_pid` (the only process whose markers count);
    `refusable`: the system calls whose refusals are named (refusable_calls)."""
    k = level + 1
    upid = f"((struct upid *)curtask->thread_pid->numbers + {k})"
    inside = f"/curtask->thread_pid->level > {level}/"
    ns = f"$ns = {upid}->ns->ns.inum;"
    head = f"{ns} $p = {upid}->nr;"
    # Registered namespaces only; counted for every printed event, past the cap
    # only counted.
    gate = f"if (@on[$ns] && @n[$ns] >= {cap}) {{ @over[$ns]++; }} else if (@on[$ns]) {{ @n[$ns]++;"
    # A marker from the gateway's own process (its thread group leader, as the
    # gateway's namespace names it), never from a sandbox.
    leader = f"((struct upid *)curtask->group_leader->thread_pid->numbers + {level})"
    marker = f"curtask->thread_pid->level == {level} && {leader}->nr == {gateway_pid}"
    parts = ['BEGIN { printf("ready\\n"); }']
    # Which opens the record would not keep, decided at entry on the path's head (a
    # short read; the exit's stack holds the full path for its line): a successful
    # plain open outside the sensitive places (a superset is kept: the prefixes
    # without their slash), a failed look-up in the runtimes' own directories
    # (backends/capture/record.py has the same rules).
    sensitive = " || ".join(f'strncmp($h, "{p}", {len(p)}) == 0' for p in SENSITIVE_PREFIXES)
    lookup = " || ".join(f'strncmp($h, "{p}/", {len(p) + 1}) == 0' for p in RUNTIME_PREFIXES)
    for call, op, path, path2, flags in _FILE_CALLS:
        second = f" @b[tid] = (uint64)args->{path2};" if path2 else ""
        quiet = ""
        if op == 1:
            quiet = (
                f"\n  $h = str(args->{path}, {PREFIX_LEN});"
                f" if ((@fl[tid] & {OPEN_CHANGES}) == 0 && !({sensitive})) {{ @plain[tid] = 1; }}"
                f" if ({lookup}) {{ @lookup[tid] = 1; }}"
            )
        elif op == 7:
            quiet = (
                f"\n  $h = str(args->{path}, {PREFIX_LEN}); @plain[tid] = 1;"
                f" if ({lookup}) {{ @lookup[tid] = 1; }}"
            )
        parts.append(
            f"tracepoint:syscalls:sys_enter_{call} {inside} {{ {ns} if (@on[$ns]) {{"
            f" @op[tid] = {op}; @a[tid] = (uint64)args->{path};{second}"
            f" @fl[tid] = (int64){flags};{quiet} }} }}"
        )
    # connect(2) to a unix socket: its name, as a path (or an abstract name).
    parts.append(
        f"tracepoint:syscalls:sys_enter_connect {inside} {{ {ns} if (@on[$ns]) {{\n"
        f"  if (*(uint16 *)args->uservaddr == {AF_UNIX}) {{ @op[tid] = 8;\n"
        # An abstract name is not NUL-terminated: its length rides in the flags.
        "    if (*(uint8 *)((uint64)args->uservaddr + 2) == 0) {"
        f" @fl[tid] = {ABSTRACT} | ((args->addrlen - 3) << 8);"
        " @a[tid] = (uint64)args->uservaddr + 3; }\n"
        "    else { @fl[tid] = 0; @a[tid] = (uint64)args->uservaddr + 2; } } } }"
    )
    calls = [c[0] for c in _FILE_CALLS] + ["connect"]
    exits = ",\n".join(f"tracepoint:syscalls:sys_exit_{c}" for c in calls)
    parts.append(
        f"{exits}\n/@op[tid]/ {{\n"
        # What the record would not keep is not printed (nor counted against the cap).
        "  $keep = 1; if (args->ret >= 0 && @plain[tid]) { $keep = 0; }\n"
        "  if (args->ret == -2 && @lookup[tid]) { $keep = 0; }\n"
        f"  if ($keep) {{ {head} {gate}\n"
        # A rename's new name first (its own line: two strings overflow the stack).
        f'  if (@b[tid]) {{ printf("g %u %d %llu %s\\n", $ns, $p, nsecs, str(@b[tid])); }}\n'
        f'  printf("f %u %d %llu %d %d %d %s\\n", $ns, $p, nsecs, @op[tid], @fl[tid],'
        f" args->ret, str(@a[tid])); }} }}\n"
        "  delete(@op[tid]); delete(@a[tid]); delete(@b[tid]); delete(@fl[tid]);"
        " delete(@plain[tid]); delete(@lookup[tid]); }"
    )
    # A SysV IPC object asked for by its key: where a sandbox looks for a
    # neighbour's shared memory, queue or semaphores (its own IPC namespace answers).
    for code, name in IPC_CALLS.items():
        parts.append(
            f"tracepoint:syscalls:sys_enter_{name}get {inside} {{ {ns}"
            f" if (@on[$ns] && args->key != 0) {{ @ic[tid] = {code}; @ik[tid] = args->key; }} }}"
        )
    exits = ", ".join(f"tracepoint:syscalls:sys_exit_{name}get" for name in IPC_CALLS.values())
    parts.append(
        f"{exits} /@ic[tid]/ {{ {head} {gate}\n"
        '  printf("k %u %d %llu %d %lld %d\\n", $ns, $p, nsecs, @ic[tid], @ik[tid], args->ret); }\n'
        "  delete(@ic[tid]); delete(@ik[tid]); }"
    )
    # execve: path and arguments at entry (after a successful exec they are gone).
    args = "".join(
        f"  if ($go) {{ $s = (uint64)*(args->argv + {i}); if ($s == 0) {{ $go = 0; }} else {{"
        f' printf("a %u %d %llu %s\\n", $ns, $p, nsecs, str($s)); }} }}\n'
        for i in range(MAX_ARGS)
    )
    for call in ("execve", "execveat"):
        parts.append(
            f"tracepoint:syscalls:sys_enter_{call} {inside} {{ {head} {gate}\n"
            f'  printf("x %u %d %llu %s\\n", $ns, $p, nsecs, str(args->filename));'
            f" $go = 1;\n{args}  @x[tid] = 1; }} }}"
        )
    parts.append(
        "tracepoint:syscalls:sys_exit_execve, tracepoint:syscalls:sys_exit_execveat"
        f' /@x[tid]/ {{ {head} printf("X %u %d %llu %d\\n", $ns, $p, nsecs, args->ret);'
        " delete(@x[tid]); }"
    )
    for call, code, target, sig in _SIGNAL_CALLS:
        parts.append(
            f"tracepoint:syscalls:sys_enter_{call} {inside} {{ {ns} if (@on[$ns]) {{"
            f" @sg[tid] = {code}; @st[tid] = (int64){target}; @ss[tid] = (int64){sig}; }} }}"
        )
    exits = ", ".join(f"tracepoint:syscalls:sys_exit_{c[0]}" for c in _SIGNAL_CALLS)
    parts.append(
        f"{exits} /@sg[tid]/ {{ {head} {gate}\n"
        '  printf("s %u %d %llu %d %d %d %d\\n", $ns, $p, nsecs, @sg[tid], @st[tid],'
        " @ss[tid], args->ret); }\n"
        "  delete(@sg[tid]); delete(@st[tid]); delete(@ss[tid]); }"
    )
    # Refusals: an exit without its entry (a new task's first return is not one:
    # it returns 0), on the calls the policy may refuse only: the raw_syscalls
    # tracepoints would tax every system call of every process on the host.
    if refusable:
        enters = ",\n".join(f"tracepoint:syscalls:sys_enter_{c}" for c in refusable)
        exits = ",\n".join(f"tracepoint:syscalls:sys_exit_{c}" for c in refusable)
        parts.append(
            f"{enters}\n{inside} {{ {ns} if (@on[$ns]) {{ @in[tid] = args->__syscall_nr + 1; }} }}"
        )
        parts.append(
            f"{exits}\n{inside} {{\n"
            f"  if (args->ret < 0 && @in[tid] != args->__syscall_nr + 1) {{ {head} {gate}\n"
            '    printf("r %u %d %llu %d %d\\n", $ns, $p, nsecs, args->__syscall_nr, args->ret);'
            " } }\n"
            "  delete(@in[tid]); }"
        )
    # A call the filter answers by killing never returns: its SIGSYS names it,
    # from the registers at the top of the task's kernel stack. The policies kill
    # what no per-call tracepoint would show refused: another architecture's calls
    # (int 0x80, x32 numbers) and calls a kernel may have no tracepoint for
    # (init_module, kexec_load). A tracepoint on every system call (raw_syscalls)
    # would see them too, at +150-300 ns on each call of every host process.
    regs = f"((struct pt_regs *)((uint64)curtask->stack + {THREAD_SIZE} - {PT_REGS_SIZE}))"
    parts.append(
        "tracepoint:signal:signal_generate\n"
        f"/args->sig == {SIGSYS} && args->code == {SYS_SECCOMP}"
        f" && curtask->thread_pid->level > {level}/ {{ {head} {gate}\n"
        f"  $nr = {regs}->orig_ax;"
        f" if (curtask->thread_info.status & {TS_COMPAT}) {{ $nr = $nr | {COMPAT_FLAG}; }}\n"
        '  printf("r %u %d %llu %d %d\\n", $ns, $p, nsecs, $nr, -1); } }'
    )
    # The end of a sandbox: its init exiting (the namespace's last word), or the
    # gateway's barrier on each CPU; either prints and forgets the namespace's count.
    parts.append(
        f"tracepoint:sched:sched_process_exit {inside} {{\n"
        "  delete(@in[tid]); delete(@op[tid]); delete(@a[tid]); delete(@b[tid]);"
        " delete(@plain[tid]); delete(@lookup[tid]);"
        " delete(@fl[tid]); delete(@x[tid]); delete(@sg[tid]); delete(@st[tid]);"
        " delete(@ss[tid]); delete(@ic[tid]); delete(@ik[tid]);\n"
        f"  if (curtask->thread_pid->level == {k} && {upid}->nr == 1) {{ {head}\n"
        '    if (@on[$ns]) { printf("z %u %d %llu %d\\n", $ns, $p, nsecs, @over[$ns]);'
        " delete(@over[$ns]); delete(@n[$ns]); } } }"
    )
    parts.append(
        "tracepoint:syscalls:sys_enter_getpriority\n"
        f"/args->which == {BARRIER_WHICH} && {marker}/ {{\n"
        "  $ns = (uint32)args->who;\n"
        '  printf("b %u %d %llu %d\\n", $ns, cpu, nsecs, @over[$ns]);'
        " delete(@over[$ns]); delete(@n[$ns]); delete(@on[$ns]); }"
    )
    parts.append(
        "tracepoint:syscalls:sys_enter_getpriority\n"
        f"/args->which == {REGISTER_WHICH} && {marker}/ {{\n"
        "  $ns = (uint32)args->who; @on[$ns] = 1; delete(@n[$ns]); delete(@over[$ns]); }"
    )
    parts.append(
        "tracepoint:syscalls:sys_enter_getpriority\n"
        f"/args->which == {UNREGISTER_WHICH} && {marker}/ {{\n"
        "  $ns = (uint32)args->who; delete(@on[$ns]); delete(@n[$ns]); delete(@over[$ns]); }"
    )
    return "\n".join(parts) + "\n"


def allowed_calls(kafel: str) -> set[str]:
    """The calls the allowlist (backends/seccomp.kafel) allows whatever their
    arguments: their refusals cannot happen under it."""
    text = re.sub(r"//[^\n]*", "", kafel)
    allowed: set[str] = set()
    for block in re.finditer(r"\bALLOW\s*\{", text):
        depth, pos, item, conditional = 1, block.end(), "", False
        while depth:
            char = text[pos]
            pos += 1
            if char in "({":
                depth += 1
                conditional = True
            elif char in ")}":
                depth -= 1
            if (depth == 1 and char == ",") or depth == 0:
                if not conditional:
                    allowed.add(item.strip())
                item, conditional = "", False
            elif depth == 1 and char not in ")}":
                item += char
    return {name for name in allowed if re.fullmatch(r"[a-z0-9_]+", name)}


def refusable_calls(tracepoints: Iterable[str], kafel: str | None = None) -> list[str]:
    """System calls with tracepoints (names as in events/syscalls) the bundled
    allowlist may refuse: every one but those it allows unconditionally."""
    if kafel is None:
        kafel = resources.files("backends").joinpath("seccomp.kafel").read_text()
    allowed = allowed_calls(kafel)
    return sorted(set(tracepoints) - allowed)


@dataclass(frozen=True, slots=True)
class Line:
    """One printed event: kind, namespace, pid in the sandbox, time, the rest."""

    kind: str
    ns: int
    pid: int
    nsecs: int
    fields: tuple[int, ...]
    text: str = ""  # a path or an argument: always last, may hold any byte


# kind -> (how many integer fields follow the common ones, whether text ends it)
SHAPES: dict[str, tuple[int, bool]] = {
    "f": (3, True),  # op, flags, ret, path
    "g": (0, True),  # a rename's new name
    "x": (0, True),  # exec path
    "a": (0, True),  # exec argument
    "X": (1, False),  # exec result
    "s": (4, False),  # call, target, signal/request, ret
    "k": (3, False),  # SysV IPC call, key, ret
    "r": (2, False),  # syscall number, ret
    "z": (1, False),  # over count (the namespace's init exited)
    "b": (1, False),  # over count (barrier; pid is the CPU)
}


def parse(data: str) -> Line | None:
    """One printf payload (its trailing newline included) -> Line, None if malformed."""
    data = data.removesuffix("\n")
    kind = data[:1]
    shape = SHAPES.get(kind)
    if shape is None:
        return None
    numbers, text = shape
    parts = data.split(" ", 4 + numbers) if text else data.split(" ")
    try:
        values = tuple(int(p) for p in parts[1 : 4 + numbers])
    except ValueError:
        return None
    if len(values) != 3 + numbers or (text and len(parts) != 5 + numbers):
        return None
    if not text and len(parts) != 4 + numbers:
        return None
    return Line(kind, values[0], values[1], values[2], values[3:], parts[-1] if text else "")


def open_op(flags: int) -> str:
    """What an open with these flags does to the file."""
    if flags & O_CREAT:
        return "create"
    if flags & OPEN_CHANGES:
        return "write"
    return "open"
