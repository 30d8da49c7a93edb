"""Reading nsjail's own log (kept apart from the program's stderr).

nsjail reports how its child ended only in its log ("exited with status: N",
"terminated with signal: SIGKILL (9)"); its exit code folds signals into
128+N, which a program can also return. Lines at warning level or worse
before the child was executed mean nsjail itself failed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_EXITED = re.compile(r"\) exited with status: (\d+),")
_SIGNALED = re.compile(r"\) terminated with signal: \S+ \((\d+)\),")
_TIME_LIMIT = re.compile(r"run time >= time limit")
_EXECUTING = re.compile(r"\] Executing '")
_PROBLEM = re.compile(r"^\[[WEF]\]")


@dataclass(frozen=True, slots=True)
class NsjailReport:
    executed: bool  # the child reached execve of the program
    exit_status: int | None
    signal: int | None
    time_limit_hit: bool
    problems: tuple[str, ...]  # warning/error/fatal lines, for BackendError messages

    @property
    def failed(self) -> bool:
        """nsjail could not start the program (or the program could not be executed)."""
        return not self.executed or any(line.startswith("[F]") for line in self.problems)


def parse_log(text: str) -> NsjailReport:
    exit_status = signal = None
    executed = time_limit = False
    problems: list[str] = []
    for line in text.splitlines():
        if _EXECUTING.search(line):
            executed = True
        elif m := _EXITED.search(line):
            exit_status = int(m.group(1))
        elif m := _SIGNALED.search(line):
            signal = int(m.group(1))
        elif _TIME_LIMIT.search(line):
            time_limit = True
        elif _PROBLEM.match(line):
            problems.append(line)
    return NsjailReport(
        executed=executed,
        exit_status=exit_status,
        signal=signal,
        time_limit_hit=time_limit,
        problems=tuple(problems),
    )
