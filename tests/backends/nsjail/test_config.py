"""Golden tests of the rendered nsjail command line.

Regenerate after an intended change with:
    EXECGATE_REGEN_GOLDEN=1 .venv/bin/pytest tests/backends/nsjail/test_config.py
and review the diff of tests/backends/golden/ like code.
"""

from __future__ import annotations

import itertools
import os
import subprocess
from pathlib import Path

import pytest

from backends.nsjail.config import (
    LAUNCH_FAILED,
    JailPaths,
    launch_line,
    launcher_script,
    program_argv,
    render_args,
    rlimit_cpu_s,
    time_limit_s,
)
from backends.nsjail.settings import NsjailSettings
from backends.runtimes import RuntimeSettings

GOLDEN = Path(__file__).parent / "golden"
RUN = "/srv/execgate/runs/4242-cafe-7"
PATHS = JailPaths(
    code_dir=f"{RUN}/code",
    workspace_dir=f"{RUN}/workspace",
    tmp_dir=f"{RUN}/tmp",
    shm_dir=f"{RUN}/shm",
    etc_dir="/srv/execgate/etc",
    seccomp_policy="/srv/execgate/seccomp.kafel",
    log_fd=7,
)

CASES: dict[str, NsjailSettings] = {
    "defaults": NsjailSettings(),
    "custom_settings": NsjailSettings(
        sandbox_uid=200000,
        sandbox_gid=200001,
        hostname="jail",
        seccomp_log=True,
        rlimit_nofile=64,
        ro_mounts=["/usr"],
        max_timeout_s=30,
        max_cpus=1.5,
        max_disk_mb=64,
        warm_max_age_s=10,
        start_interpreter_ahead=False,
        runtimes={
            "python": RuntimeSettings(
                argv=["/usr/bin/python3", "-I", "-X", "utf8"], filename="main.py"
            ),
            "ruby_like": RuntimeSettings(argv=["/usr/bin/with space", "it's"], filename="main.rb"),
        },
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_rendered_args_match_golden(case: str) -> None:
    rendered = "\n".join(render_args(CASES[case], PATHS, "python")) + "\n"
    golden = GOLDEN / f"{case}.txt"
    if os.environ.get("EXECGATE_REGEN_GOLDEN") == "1":
        golden.write_text(rendered)
    assert golden.exists(), f"missing {golden}: run with EXECGATE_REGEN_GOLDEN=1"
    assert rendered == golden.read_text()


def test_rendering_is_pure() -> None:
    defaults = CASES["defaults"]
    assert render_args(defaults, PATHS, "python") == render_args(defaults, PATHS, "python")


def test_security_invariants_hold_for_every_case() -> None:
    for settings, language in itertools.product(CASES.values(), ("python", "bash")):
        if language not in settings.runtimes:
            continue
        args = render_args(settings, PATHS, language)
        joined = " ".join(args)
        uid, gid = settings.sandbox_uid, settings.sandbox_gid
        # Mapped to the unprivileged host ids only, never through newuidmap.
        assert args[args.index("--user") + 1] == f"1000:{uid}:1"
        assert args[args.index("--group") + 1] == f"1000:{gid}:1"
        assert "--uid_mapping" not in args and "--gid_mapping" not in args
        # Every namespace is new and nothing weakens the jail.
        for weakening in ("--disable_clone", "--keep_env", "--keep_caps", "--cap",
                          "--disable_no_new_privs", "--rw", "--proc_rw", "--use_pasta",
                          "--macvlan", "--iface_own", "--disable_rlimits", "--chroot",
                          "--pass_fd"):  # fmt: skip
            assert weakening not in joined.replace("--disable_clone_newnet", "")
        # The one exception: the network namespace is the gateway's, made ahead
        # (backends/egress/boundary.py); nsjail is started inside it.
        assert args.count("--disable_clone_newnet") == 1
        assert "--seccomp_policy" in args
        # Writable binds are the sandbox's own directories and two devices only.
        writable = [args[i + 1] for i, a in enumerate(args) if a == "--bindmount"]
        assert all(w.startswith(RUN) or w in ("/dev/null", "/dev/zero") for w in writable)
        # The jailed program is the language's interpreter on its code file, or
        # the launcher.
        jailed = args[args.index("--") + 1 :]
        if settings.start_interpreter_ahead:
            assert jailed == program_argv(settings.runtimes[language])
            assert jailed[-1] == f"/code/{settings.runtimes[language].filename}"
        else:
            assert jailed[:2] == ["/bin/sh", "-c"]


def test_launcher_execs_each_runtime_on_its_line() -> None:
    settings = CASES["custom_settings"]
    script = launcher_script(settings)
    # Print each argument instead of exec'ing: shows the argv each line runs.
    probe = script.replace(" exec ", " printf '%s|' ")
    for line, expected in [
        (b"python\n", "/usr/bin/python3|-I|-X|utf8|/code/main.py|"),
        (b"ruby_like\nrest of stdin", "/usr/bin/with space|it's|/code/main.rb|"),
    ]:
        done = subprocess.run(["/bin/sh", "-c", probe], input=line, capture_output=True)
        assert done.stdout.decode() == expected
    unknown = subprocess.run(["/bin/sh", "-c", script], input=b"cobol\n", capture_output=True)
    assert unknown.returncode == LAUNCH_FAILED
    empty = subprocess.run(["/bin/sh", "-c", script], input=b"", capture_output=True)
    assert empty.returncode == LAUNCH_FAILED
    assert launch_line(settings, "python") == b"python\n"
    assert launch_line(CASES["defaults"], "python") == b""


def test_backstops_lie_beyond_every_deadline() -> None:
    for settings in CASES.values():
        assert time_limit_s(settings) > settings.max_timeout_s + settings.warm_max_age_s
        assert rlimit_cpu_s(settings) > settings.max_timeout_s * settings.max_cpus
