"""A backend that runs nothing: measures the gateway alone (benchmarks, tests).

It is never the default and must be enabled by name; its results say so in stdout.
"""

from __future__ import annotations

import asyncio

from pydantic import BaseModel, ConfigDict, Field

from backends.base import (
    Capabilities,
    ExecResult,
    ExecSpec,
    Health,
    Limits,
    SandboxBackend,
    Status,
    Usage,
    pass_gate,
)


class NoopSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    languages: list[str] = ["python", "bash", "javascript"]
    # Each run takes this long (tests of concurrency limits need runs that last).
    sleep_s: float = Field(0.0, ge=0, le=60)


class NoopBackend(SandboxBackend):
    name = "noop"
    Settings = NoopSettings

    def __init__(self, settings: NoopSettings | None = None) -> None:
        self.settings = settings or NoopSettings()
        self._caps = Capabilities(
            languages=frozenset(self.settings.languages),
            max_limits=Limits(
                timeout_s=3600,
                memory_mb=65536,
                cpus=64,
                pids=65536,
                disk_mb=65536,
                output_bytes=1 << 30,
            ),
            usage_accounting=False,
        )

    @property
    def capabilities(self) -> Capabilities:
        return self._caps

    async def start(self) -> None:
        return None

    async def run(self, spec: ExecSpec) -> ExecResult:
        await pass_gate(spec)  # what a real backend waits for, so measured here too
        if self.settings.sleep_s:
            await asyncio.sleep(self.settings.sleep_s)
        return ExecResult(
            status=Status.OK,
            exit_code=0,
            stdout=b"",
            stderr=b"",
            truncated_stdout=False,
            truncated_stderr=False,
            duration_ms=0,
            usage=Usage(),
        )

    async def health(self) -> Health:
        return Health(ok=True, detail="noop backend runs nothing")

    async def close(self) -> None:
        return None
