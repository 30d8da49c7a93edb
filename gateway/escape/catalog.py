"""Every technique of the suite, in the order the runner tries them."""

from __future__ import annotations

from gateway.escape import catalog_kernel, catalog_neighbours, catalog_posture, catalog_resources
from gateway.escape.technique import Technique


def techniques() -> list[Technique]:
    found = [
        *catalog_posture.TECHNIQUES,
        *catalog_kernel.TECHNIQUES,
        *catalog_neighbours.TECHNIQUES,
        *catalog_resources.TECHNIQUES,
    ]
    ids = [t.id for t in found]
    duplicates = {i for i in ids if ids.count(i) > 1}
    if duplicates:
        raise ValueError(f"duplicate technique ids: {sorted(duplicates)}")
    return found
