"""What every backend's settings share: the ceilings it accepts, its output-file caps
and how hard it tries to get a request a sandbox (backends/attempts.py).

The gateway clamps each request to these (backends/base.py `Capabilities.max_limits`),
and each backend clamps again with `clamp` before it runs anything.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from backends.base import Limits
from backends.capture.settings import CaptureSettings

MIN_MEMORY_MB = 16


class SandboxCeilings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # Ceilings this backend accepts (the gateway clamps requests to them).
    max_timeout_s: float = Field(300.0, gt=0)
    max_memory_mb: int = Field(4096, ge=MIN_MEMORY_MB)
    max_cpus: float = Field(2.0, gt=0)
    max_pids: int = Field(1024, ge=8)
    max_disk_mb: int = Field(1024, ge=1)
    max_output_bytes: int = Field(16 * 1024 * 1024, ge=1024)

    # Output files collected from the workspace after the run.
    max_output_files: int = Field(64, ge=0)
    max_output_file_bytes: int = Field(8 * 1024 * 1024, ge=0)
    max_output_total_bytes: int = Field(16 * 1024 * 1024, ge=0)

    # A sandbox that fails before the program is handed over (create, start,
    # boundary, readiness) is replaced by a fresh one: at most this many tries per
    # request, all of them within this many seconds (then 503 backend_unavailable).
    start_attempts: int = Field(3, ge=1, le=10)
    start_deadline_s: float = Field(60.0, gt=0, le=600)

    # What the code tried beyond the network (backends/capture).
    capture: CaptureSettings = Field(default_factory=CaptureSettings)

    # `runtimes` is each backend's own table; its keys are language names everywhere.
    @field_validator("runtimes", check_fields=False)
    @classmethod
    def _plain_language_names(cls, value: dict[str, object]) -> dict[str, object]:
        for language in value:
            if not language.isascii() or not language.replace("_", "").isalnum():
                raise ValueError(f"language name {language!r} must be letters, digits, _")
        return value

    def max_limits(self) -> Limits:
        return Limits(
            timeout_s=self.max_timeout_s,
            memory_mb=self.max_memory_mb,
            cpus=self.max_cpus,
            pids=self.max_pids,
            disk_mb=self.max_disk_mb,
            output_bytes=self.max_output_bytes,
        )


def clamp(limits: Limits, maximum: Limits) -> Limits:
    """Each limit within (a sane floor, the backend's ceiling)."""
    return Limits(
        timeout_s=min(max(limits.timeout_s, 0.001), maximum.timeout_s),
        memory_mb=min(max(limits.memory_mb, MIN_MEMORY_MB), maximum.memory_mb),
        cpus=min(max(limits.cpus, 0.01), maximum.cpus),
        pids=min(max(limits.pids, 1), maximum.pids),
        disk_mb=min(max(limits.disk_mb, 1), maximum.disk_mb),
        output_bytes=min(max(limits.output_bytes, 0), maximum.output_bytes),
    )
