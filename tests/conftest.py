"""Suite-wide: one host tracer hub; the summary names every test skipped for a
missing component.

pytest's `-rs` folds skips by where `pytest.skip` was called, and every skip here is
called in tests/components.py: this section names each test with its reason, so a
developer sees what their machine did not run (under CI=true each is a failure).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from _pytest.terminal import TerminalReporter

from backends.capture.host import TracerHub


@pytest.fixture(scope="session")
def tracer_hub() -> Iterator[TracerHub]:
    """The host tracers every captured backend of the run shares, as a gateway's
    backends do: the kernel tracer attaches once (~11 s of CPU), not per backend.
    Bound to no event loop, so module and function loops alike can use it."""
    hub = TracerHub()
    yield hub
    asyncio.run(hub.close())


def pytest_terminal_summary(terminalreporter: TerminalReporter) -> None:
    skipped = terminalreporter.stats.get("skipped", [])
    if not skipped:
        return
    terminalreporter.section("skipped here (components missing; CI=true fails these)")
    for report in skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        reason = str(reason).removeprefix("Skipped: ")
        terminalreporter.line(f"SKIPPED {report.nodeid}: {reason}")
