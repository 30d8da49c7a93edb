"""Broken backends, test-only: each implements the backend interface and fails to
be a sandbox in one way. The suite must call none of them sound.

RunsNothing   every run "succeeds" having run nothing (a runtime set to /bin/true)
ExitsEarly    the interpreter starts and exits before the program (prints a banner)
AlwaysErrors  every run raises BackendError (refusing is no containment)
SaysNotApplicable  a program that starts, then finds nothing to try, every time
SeesNothing   contains everything, says it records behaviour, and records nothing
"""

from __future__ import annotations

import dataclasses
import re

from pydantic import BaseModel, ConfigDict

from backends.base import (
    BackendError,
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
from backends.capture.record import KINDS, Behaviour
from gateway.escape.technique import start_line

MARK = re.compile(r"execgate-mark-[0-9a-f]{12}")


class BrokenSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Broken(SandboxBackend):
    name = "broken"
    Settings = BrokenSettings

    def __init__(self, settings: BrokenSettings | None = None) -> None:
        self.runs = 0

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(languages=frozenset({"python", "bash"}), max_limits=Limits())

    async def start(self) -> None:
        pass

    async def health(self) -> Health:
        return Health(True)

    async def close(self) -> None:
        pass

    async def run(self, spec: ExecSpec) -> ExecResult:
        self.runs += 1
        await pass_gate(spec)
        return self.answer(spec)

    def answer(self, spec: ExecSpec) -> ExecResult:
        raise NotImplementedError


def _result(stdout: bytes = b"", stderr: bytes = b"", status: Status = Status.OK) -> ExecResult:
    return ExecResult(status, 0 if status == Status.OK else 1, stdout, stderr, False, False, 3,
                      Usage())  # fmt: skip


class RunsNothing(Broken):
    name = "runs-nothing"

    def answer(self, spec: ExecSpec) -> ExecResult:
        return _result()


class ExitsEarly(Broken):
    name = "exits-early"

    def answer(self, spec: ExecSpec) -> ExecResult:
        return _result(b"Python 3 ready\n", b"bye\n")


class AlwaysErrors(Broken):
    name = "always-errors"

    def answer(self, spec: ExecSpec) -> ExecResult:
        raise BackendError("cannot create the sandbox: no such runtime")


class SaysNotApplicable(Broken):
    """Cheats as far as a backend can: it finds the run's mark in the code, prints
    the start line, then "not applicable". Only the ceiling stops it."""

    name = "says-not-applicable"

    def answer(self, spec: ExecSpec) -> ExecResult:
        found = MARK.search(spec.code)
        assert found is not None, spec.code[:200]
        return _result(f'{start_line(found.group())}\n{{"na": "nothing here"}}\n'.encode())


class SeesNothing(Broken):
    """Every probe starts and is contained, and every record (capture "on") is
    empty: the attempts the sandbox stopped went unseen."""

    name = "sees-nothing"

    def recorded_kinds(self) -> frozenset[str]:
        return frozenset(KINDS)

    def answer(self, spec: ExecSpec) -> ExecResult:
        found = MARK.search(spec.code)
        assert found is not None, spec.code[:200]
        out = f'{start_line(found.group())}\n{{"escaped": false, "detail": "stopped"}}\n'
        return dataclasses.replace(
            _result(out.encode()), behaviour=Behaviour(capture="on", tracer="test")
        )


BROKEN: tuple[type[Broken], ...] = (RunsNothing, ExitsEarly, AlwaysErrors)
