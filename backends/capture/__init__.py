"""What sandboxed code tried beyond the network: the behaviour record and its tracers.

`record` holds the bounded per-execution `Behaviour` (files, programs, signals,
refused system calls) and the `BehaviourRecorder` tracers feed; tracers live
beside it, one module each (host eBPF for the backends sharing the host kernel,
gVisor's own trace for docker-gvisor).
"""

from backends.capture.record import (
    Baseline,
    Behaviour,
    BehaviourRecorder,
    FileAttempt,
    ProgramAttempt,
    SignalAttempt,
    capture_off,
)
from backends.capture.settings import CaptureSettings

__all__ = [
    "Baseline",
    "Behaviour",
    "BehaviourRecorder",
    "CaptureSettings",
    "FileAttempt",
    "ProgramAttempt",
    "SignalAttempt",
    "capture_off",
]
