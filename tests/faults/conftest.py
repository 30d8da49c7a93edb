"""Fault tests. Those marked `engine_restart` restart the host's shared Docker engine:
they are moved to the very end of the session, after every other test has used it."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    restarts = [item for item in items if item.get_closest_marker("engine_restart")]
    for item in restarts:
        items.remove(item)
    items.extend(restarts)
