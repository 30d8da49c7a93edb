"""Every technique of the suite, in the order the runner tries them."""

from __future__ import annotations

from gateway.escape.catalog import kernel, neighbours, posture, resources
from gateway.escape.technique import Technique


def techniques() -> list[Technique]:
    found = [
        *posture.TECHNIQUES,
        *kernel.TECHNIQUES,
        *neighbours.TECHNIQUES,
        *resources.TECHNIQUES,
    ]
    ids = [t.id for t in found]
    duplicates = {i for i in ids if ids.count(i) > 1}
    if duplicates:
        raise ValueError(f"duplicate technique ids: {sorted(duplicates)}")
    return found
