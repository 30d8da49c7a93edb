"""nsjail's seccomp allowlist as the engine's JSON profile (pure)."""

from __future__ import annotations

import pytest

from backends.docker.seccomp import bundled_profile, profile_from_kafel


def test_the_bundled_profile_is_an_allowlist() -> None:
    profile = bundled_profile()
    assert profile["defaultAction"] == "SCMP_ACT_ERRNO" and profile["defaultErrnoRet"] == 1
    allowed = set(profile["syscalls"][0]["names"])
    assert {"read", "write", "execve", "stat", "uname", "sendfile", "wait4"} <= allowed
    refused = {"mount", "unshare", "setns", "ptrace", "bpf", "keyctl", "io_uring_setup",
               "userfaultfd", "perf_event_open", "init_module", "kexec_load", "clone3"}  # fmt: skip
    assert not allowed & refused
    named = {name for rule in profile["syscalls"] for name in rule["names"]}
    killed = {"init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load"}
    assert "clone3" in named and not (named - {"clone3"} - killed) & refused
    # What the kafel kills, the engine kills (a SIGSYS the behaviour record names).
    (kill,) = [r for r in profile["syscalls"] if r["action"] == "SCMP_ACT_KILL_PROCESS"]
    assert set(kill["names"]) == killed
    (clone,) = [r for r in profile["syscalls"] if r["names"] == ["clone"]]
    assert clone["args"] == [
        {"index": 0, "value": 0x7E020080, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}
    ]


def test_an_unknown_condition_is_refused() -> None:
    with pytest.raises(ValueError, match="no libseccomp rule"):
        profile_from_kafel("POLICY p { ALLOW { read, chmod(a, mode) { mode == 1 } } }")
    simple = profile_from_kafel("// c, d\nPOLICY p { ALLOW { read, newstat,\n write } }")
    assert simple["syscalls"][0]["names"] == ["read", "stat", "write"]
