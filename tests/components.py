"""One rule for components a test needs: skip on a developer's machine, fail in CI."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def missing_component(reason: str) -> NoReturn:
    """A component the test needs is absent: in CI (CI=true) that is a failure."""
    if os.environ.get("CI") == "true":
        pytest.fail(reason)
    else:  # a developer's machine without the component: say so, loudly
        pytest.skip(reason)
