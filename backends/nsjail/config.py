"""The nsjail command line of one sandbox: a pure function, golden-tested.

Everything that decides what the sandbox can see and do is rendered here, from
the backend settings and the sandbox's host paths, so a change to the jail
shows up as a diff in `tests/backends/nsjail/golden/`.

The command line depends on the request's language only: a sandbox is made
before the request arrives (see sandbox.py) and waits, fully jailed, in the
language's interpreter, started on the code file's path and blocked on the FIFO
standing there (backends/handover.py). With `start_interpreter_ahead` off it
waits in a tiny /bin/sh "launcher" for one line on stdin naming the language
instead. What a request decides is applied at launch: the cgroup limits, the
tmpfs size, the code and input files, then the hand-over (or the launch line,
after which the rest of stdin is the program's). Limits rendered here (time
limit, CPU and file-size rlimits) are backstops at the backend's maxima.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass

from backends.egress.boundary import PROXY_ENV
from backends.nsjail.settings import NsjailSettings
from backends.runtimes import RuntimeSettings

# The sandbox user inside its user namespace; it maps to settings.sandbox_uid.
INSIDE_ID = 1000
JAIL_CODE_DIR = "/code"
JAIL_WORKSPACE = "/workspace"
JAIL_PATH = "/usr/bin:/bin"
# The launcher's exit status when it got no (or an unknown) launch line.
LAUNCH_FAILED = 126

# Device nodes bound from the host: (path, writable). Nothing else of /dev.
DEVICES: tuple[tuple[str, bool], ...] = (
    ("/dev/null", True),
    ("/dev/zero", True),
    ("/dev/random", False),
    ("/dev/urandom", False),
)
DEV_SYMLINKS: tuple[tuple[str, str], ...] = (
    ("/proc/self/fd", "/dev/fd"),
    ("/proc/self/fd/0", "/dev/stdin"),
    ("/proc/self/fd/1", "/dev/stdout"),
    ("/proc/self/fd/2", "/dev/stderr"),
)


@dataclass(frozen=True, slots=True)
class JailPaths:
    """Host-side paths of one execution (and the shared, generated /etc)."""

    code_dir: str
    workspace_dir: str
    tmp_dir: str
    shm_dir: str
    etc_dir: str
    seccomp_policy: str
    log_fd: int


def time_limit_s(settings: NsjailSettings) -> int:
    """nsjail's own wall-clock limit, counted from the sandbox's creation: a
    backstop behind the backend's deadline, allowing for time spent waiting."""
    return (
        math.ceil(settings.max_timeout_s) + settings.warm_max_age_s + settings.time_limit_margin_s
    )


def rlimit_cpu_s(settings: NsjailSettings) -> int:
    """Per-process CPU seconds: more than any deadline allows at any cgroup
    quota, so it only fires if those failed (SIGKILL: soft == hard)."""
    return math.ceil(settings.max_timeout_s * max(settings.max_cpus, 1.0)) + 1


def program_argv(runtime: RuntimeSettings) -> list[str]:
    """What runs the code: the interpreter and the code file."""
    return [*runtime.argv, f"{JAIL_CODE_DIR}/{runtime.filename}"]


def launcher_script(settings: NsjailSettings) -> str:
    """/bin/sh reads the launch line, then execs (pid 1 stays the program).

    dash reads a pipe one byte at a time, so nothing past the newline is taken
    from the program's stdin."""
    cases = "".join(
        f"{language}) exec {shlex.join(program_argv(runtime))} ;; "
        for language, runtime in sorted(settings.runtimes.items())
    )
    fail = f"exit {LAUNCH_FAILED}"
    return f'read -r language || {fail}; case "$language" in {cases}esac; {fail}'


def launch_line(settings: NsjailSettings, language: str) -> bytes:
    """What stdin starts with: nothing for an interpreter started ahead."""
    return b"" if settings.start_interpreter_ahead else f"{language}\n".encode()


def environment(settings: NsjailSettings) -> list[str]:
    # Only these: nothing of the gateway's environment reaches the sandbox.
    return [
        f"PATH={JAIL_PATH}",
        f"HOME={JAIL_WORKSPACE}",
        # What the launcher's shell exported; an interpreter started directly
        # gets the same.
        f"PWD={JAIL_WORKSPACE}",
        "LANG=C.UTF-8",
        "TMPDIR=/tmp",
        "USER=sandbox",
        f"HOSTNAME={settings.hostname}",
        *PROXY_ENV,  # the gateway's egress proxy: the only way out
    ]


def jailed_command(settings: NsjailSettings, language: str) -> list[str]:
    """What nsjail starts: the language's interpreter itself, on the code file's
    path, where it waits for its code (backends/handover.py); or, with
    `start_interpreter_ahead` off, the launcher, which waits for its line."""
    if settings.start_interpreter_ahead:
        return program_argv(settings.runtimes[language])
    return ["/bin/sh", "-c", launcher_script(settings)]


def render_args(settings: NsjailSettings, paths: JailPaths, language: str) -> list[str]:
    """nsjail's arguments (without the binary itself) for one sandbox of `language`."""
    uid, gid = settings.sandbox_uid, settings.sandbox_gid
    args: list[str] = [
        "--mode", "o",
        "--log_fd", str(paths.log_fd),
        "--hostname", settings.hostname,
        "--cwd", JAIL_WORKSPACE,
        # inside:outside:count with no --uid_mapping: nsjail writes the maps
        # itself and maps nothing else (in particular not the calling root).
        "--user", f"{INSIDE_ID}:{uid}:1",
        "--group", f"{INSIDE_ID}:{gid}:1",
        "--time_limit", str(time_limit_s(settings)),
        # Memory is the cgroup's job; V8 reserves far more address space than
        # it uses, so an address-space rlimit would only break node.
        "--rlimit_as", "inf",
        "--rlimit_cpu", str(rlimit_cpu_s(settings)),
        "--rlimit_fsize", str(settings.max_disk_mb),
        "--rlimit_nofile", str(settings.rlimit_nofile),
        "--rlimit_core", "0",
        "--seccomp_policy", paths.seccomp_policy,
        # The namespace nsjail starts in is the sandbox's, made by the gateway.
        "--disable_clone_newnet",
    ]  # fmt: skip
    if settings.seccomp_log:
        args.append("--seccomp_log")
    for directory in settings.ro_mounts:
        args += ["--bindmount_ro", directory]
    for link, target in settings.symlinks.items():
        args += ["--symlink", f"{target}:{link}"]
    args += [
        "--bindmount_ro", f"{paths.etc_dir}:/etc",
        "--bindmount_ro", f"{paths.code_dir}:{JAIL_CODE_DIR}",
        "--bindmount", f"{paths.workspace_dir}:{JAIL_WORKSPACE}",
        "--bindmount", f"{paths.tmp_dir}:/tmp",
    ]  # fmt: skip
    for device, writable in DEVICES:
        args += ["--bindmount" if writable else "--bindmount_ro", device]
    args += ["--bindmount", f"{paths.shm_dir}:/dev/shm"]
    for target, link in DEV_SYMLINKS:
        args += ["--symlink", f"{target}:{link}"]
    for variable in environment(settings):
        args += ["--env", variable]
    return [*args, "--", *jailed_command(settings, language)]
