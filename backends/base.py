"""The one interface every sandbox backend implements.

User code failing is data (an `ExecResult` with a status); the sandbox itself
failing is an exception (`BackendError`), which the gateway turns into a 503
`backend_unavailable`. Nothing here knows about HTTP, policy or tenants.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel

from backends.capture.record import Behaviour


class Status(enum.StrEnum):
    OK = "ok"  # exited 0
    ERROR = "error"  # exited non-zero
    TIMEOUT = "timeout"  # wall-clock deadline or CPU-time limit
    OOM = "oom"  # memory limit
    KILLED = "killed"  # another limit or a signal
    OUTPUT_LIMIT = "output_limit"  # stdout/stderr over output_bytes


@dataclass(frozen=True, slots=True)
class Limits:
    """Hard limits for one execution, already clamped by the gateway."""

    timeout_s: float = 5.0
    memory_mb: int = 256
    cpus: float = 1.0
    pids: int = 64
    disk_mb: int = 64
    output_bytes: int = 1_048_576

    def as_dict(self) -> dict[str, Any]:
        return {
            "timeout_s": self.timeout_s,
            "memory_mb": self.memory_mb,
            "cpus": self.cpus,
            "pids": self.pids,
            "disk_mb": self.disk_mb,
            "output_bytes": self.output_bytes,
        }


@dataclass(frozen=True, slots=True)
class InputFile:
    path: str  # relative, normalised, validated by the gateway
    content: bytes


@dataclass(frozen=True, slots=True)
class OutputFile:
    path: str
    size: int
    content: bytes


@dataclass(frozen=True, slots=True)
class Credential:
    """A tenant's secret the egress proxy adds to requests for one destination."""

    destination: str  # host:port, exact
    header: str
    value: str = field(repr=False)


# Called with ("stdout" | "stderr", bytes) for each piece of output the backend keeps
# (under the output cap), as it arrives: live output for whoever follows the run.
OutputSink = Callable[[str, bytes], None]

# Awaited by the backend once, right before it hands the code over to a sandbox that
# is ready for it: the gateway's `execution.started` record becoming durable, which
# so overlaps the making ready. If it raises, nothing is handed over: the backend
# disposes of the sandbox and lets the exception through (not as a BackendError).
Gate = Callable[[], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class ExecSpec:
    """Everything a backend needs to run one piece of code once."""

    execution_id: str
    language: str
    code: str
    limits: Limits
    stdin: bytes = b""
    files: tuple[InputFile, ...] = ()
    # Destinations the decision allowed; empty means no network at all.
    egress: tuple[str, ...] = ()
    # Secrets the proxy adds on the way out; never given to the sandbox.
    credentials: tuple[Credential, ...] = ()
    # Internal ranges (CIDR) the operator lets names reach ([egress] internal_allow).
    internal_allow: tuple[str, ...] = ()
    # Where output goes as it arrives (None: only the result carries it).
    on_output: OutputSink | None = field(default=None, compare=False, repr=False)
    # What must hold before the code is handed over (None: nothing, as in a test).
    gate: Gate | None = field(default=None, compare=False, repr=False)


async def pass_gate(spec: ExecSpec) -> None:
    """Wait for `spec`'s gate (backends call this at the hand-over, nowhere else)."""
    if spec.gate is not None:
        await spec.gate()


@dataclass(frozen=True, slots=True)
class Usage:
    cpu_ms: int = 0
    max_rss_kb: int = 0


@dataclass(frozen=True, slots=True)
class SandboxEvent:
    """Something the backend saw and stopped (limit hit, syscall refused...)."""

    kind: str  # e.g. "oom", "pids_limit", "output_limit", "deadline", "seccomp"
    detail: str = ""


@dataclass(frozen=True, slots=True)
class NetworkAttempt:
    """One thing the code tried on the network, and what the gateway did."""

    kind: str  # "dns", "connect", "http", "tcp", "udp"
    host: str
    port: int
    verdict: str  # "allowed" or "blocked"
    rule: str  # the egress entry that allowed it, or why it was blocked
    detail: str = ""


@dataclass(frozen=True, slots=True)
class ExecResult:
    status: Status
    exit_code: int | None
    stdout: bytes
    stderr: bytes
    truncated_stdout: bool
    truncated_stderr: bool
    duration_ms: int
    usage: Usage
    files: tuple[OutputFile, ...] = ()
    events: tuple[SandboxEvent, ...] = ()
    network: tuple[NetworkAttempt, ...] = ()
    # What the code tried beyond the network (None: the backend has no capture).
    behaviour: Behaviour | None = None


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a backend can do, declared as data so the gateway can clamp and route."""

    languages: frozenset[str]
    max_limits: Limits
    egress: bool = False
    usage_accounting: bool = True
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Health:
    ok: bool
    detail: str = ""


class BackendError(Exception):
    """The sandbox could not be created, run or cleaned up: not the user's fault.

    `events` are what the backend saw on the way (sandboxes that failed to start):
    the gateway audits them even though the request ends in a 503."""

    def __init__(self, message: str = "", *, events: tuple[SandboxEvent, ...] = ()) -> None:
        super().__init__(message)
        self.events = events


class SandboxStartError(BackendError):
    """A sandbox failed before the program was handed over to it: nothing ran.

    `stage` says where (backends/attempts.py STAGES); `retryable` is False when a
    fresh sandbox cannot do better (the engine is unreachable)."""

    def __init__(
        self,
        stage: str,
        message: str,
        *,
        events: tuple[SandboxEvent, ...] = (),
        retryable: bool = True,
    ) -> None:
        super().__init__(message, events=events)
        self.stage = stage
        self.retryable = retryable


class SandboxBackend(abc.ABC):
    """start -> run(spec)* -> close. One instance per configured backend name."""

    name: ClassVar[str]
    # A pydantic model (extra="forbid") for this backend's `[backends.<name>]` section.
    Settings: ClassVar[type[BaseModel]]
    # Takes the gateway's shared host tracers (`tracers=`, backends/capture/host.py
    # TracerHub): one kernel tracer for every backend on the host kernel.
    shares_host_tracer: ClassVar[bool] = False

    @property
    @abc.abstractmethod
    def capabilities(self) -> Capabilities: ...

    @abc.abstractmethod
    async def start(self) -> None:
        """Check prerequisites and prepare host resources; raise BackendError if unusable."""

    @abc.abstractmethod
    async def run(self, spec: ExecSpec) -> ExecResult:
        """Run one spec in a fresh sandbox, used once: nothing of the program runs
        once this returns, and what is left of the sandbox is removed (tracked, in
        the background at the latest). The code is handed over only once
        `spec.gate` has passed (`pass_gate`)."""

    @abc.abstractmethod
    async def health(self) -> Health: ...

    @abc.abstractmethod
    async def close(self) -> None: ...

    def capture_status(self) -> tuple[bool, str]:
        """(on, why not): whether results carry a behaviour record (backends/capture)."""
        return False, "this backend records no behaviour"

    def recorded_kinds(self) -> frozenset[str]:
        """The kinds of attempt (backends/capture/record.py KINDS) results record now:
        empty while capture is off."""
        return frozenset()
