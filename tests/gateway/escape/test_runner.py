"""The suite against every backend, as CI runs it: the run must be sound.

One full run per backend, with the summary line printed to the terminal. The
backends are the production ones, built from default settings (nsjail with a
test-private state directory and uid)."""

from __future__ import annotations

import pytest

from backends.capture.host import TracerHub
from backends.capture.settings import CaptureSettings
from backends.docker.backend import DockerBackend
from backends.docker.gvisor import GvisorBackend
from backends.docker.settings import DockerSettings, GvisorSettings
from backends.nsjail.backend import NsjailBackend
from backends.nsjail.settings import NsjailSettings
from gateway.escape.catalog.index import techniques
from gateway.escape.report import row, summary
from gateway.escape.runner import SuiteResult, run_suite
from gateway.escape.technique import Outcome
from tests.backends.conftest import start_docker_backend

pytestmark = pytest.mark.integration


def assert_nothing_escaped(result: SuiteResult, capsys: pytest.CaptureFixture[str]) -> None:
    with capsys.disabled():
        print("\n" + summary(result))
    assert len(result.findings) == len(techniques())
    assert result.escaped == [], "\n".join(row(f) for f in result.escaped)
    # Sound, not merely "nothing escaped": no errors, "not applicable" within the ceiling.
    unsound = result.errors + result.having(Outcome.NOT_APPLICABLE)
    assert result.sound, (result.problems, "\n".join(row(f) for f in unsound))


async def test_nsjail_contains_every_technique(
    escape_nsjail_settings: NsjailSettings,
    capsys: pytest.CaptureFixture[str],
    tracer_hub: TracerHub,
) -> None:
    # Capture on: the report counts the techniques each backend recorded.
    backend = NsjailBackend(
        escape_nsjail_settings.model_copy(update={"capture": CaptureSettings()}),
        tracers=tracer_hub,
    )
    await backend.start()
    try:
        result = await run_suite(backend)
    finally:
        await backend.close()
    assert_nothing_escaped(result, capsys)


@pytest.mark.parametrize(
    "backend_class, settings",
    [(DockerBackend, DockerSettings()), (GvisorBackend, GvisorSettings())],
    ids=["docker", "docker-gvisor"],
)
async def test_docker_backends_contain_every_technique(
    backend_class: type[DockerBackend],
    settings: DockerSettings,
    capsys: pytest.CaptureFixture[str],
    tracer_hub: TracerHub,
) -> None:
    backend = await start_docker_backend(backend_class(settings, tracers=tracer_hub))
    try:
        result = await run_suite(backend)
    finally:
        await backend.close()
    assert_nothing_escaped(result, capsys)
