"""The record's own rules beyond folding: what is the runtime's, not the code's."""

from __future__ import annotations

from backends.capture.record import Baseline, BehaviourRecorder


def test_runtime_lookups_and_plain_devices_are_not_kept() -> None:
    recorder = BehaviourRecorder(tracer="test")
    recorder.file("open", "/usr/lib/x86_64-linux-gnu/tls/libc.so.6", -2)
    recorder.file("open", "/lib/x86_64-linux-gnu/glibc-hwcaps/x86-64-v3/libz.so.1", -2)
    recorder.file("open", "/usr/share/locale/C/LC_MESSAGES/coreutils.mo", -2)
    recorder.file("write", "/dev/null", 3)
    recorder.file("open", "/dev/urandom", 3)
    assert recorder.finish().empty
    # Their neighbours are kept: a refused write there, a device that is not plain,
    # anything outside the runtime's directories, a failure other than ENOENT.
    recorder.file("create", "/usr/lib/evil.so", -30)
    recorder.file("open", "/dev/mem", 3)
    recorder.file("open", "/opt/lib/x.so", -2)
    recorder.file("open", "/usr/lib/secret", -13)
    recorder.file("open", "/dev/null", -13)
    kept = {(f.op, f.path, f.result) for f in recorder.finish().files}
    assert kept == {
        ("create", "/usr/lib/evil.so", "EROFS"),
        ("open", "/dev/mem", "ok"),
        ("open", "/opt/lib/x.so", "ENOENT"),
        ("open", "/usr/lib/secret", "EACCES"),
        ("open", "/dev/null", "EACCES"),
    }


def test_a_baseline_leaves_out_the_runtimes_refusals() -> None:
    start = BehaviourRecorder(tracer="test")
    start.refused("clone3", 4)
    baseline = Baseline.learn(start.finish())
    assert baseline.syscalls == {"clone3"}
    recorder = BehaviourRecorder(tracer="test", baseline=baseline)
    recorder.refused("clone3")
    recorder.refused("mount")
    assert recorder.finish().syscalls_refused == (("mount", 1),)
