"""`[backends.<name>.capture]`: whether a backend records what the code tried.

On by default wherever the host allows it; when it cannot (no BPF permission, no
tracer, a runtime without trace support) the backend still runs and says
`capture: off` with the reason on every result and in readiness, unless
`required` is set: then the backend is unavailable instead (fail closed).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class CaptureSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    # True: a backend that cannot capture is unhealthy (nothing runs on it).
    required: bool = False
    # Empty: the tracer found on PATH (bpftrace for the backends on the host kernel).
    tracer_path: str = ""
    # Per execution: distinct entries kept (identical attempts fold into one, counted).
    max_files: int = Field(256, ge=0, le=10_000)
    max_programs: int = Field(64, ge=0, le=10_000)
    max_signals: int = Field(64, ge=0, le=10_000)
    max_bytes: int = Field(64 * 1024, ge=1024, le=16 * 1024 * 1024)
