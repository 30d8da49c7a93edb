"""What an analyser found, and its JSON shape for the policy input."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Bounds on what goes into the policy input: a program that calls ten thousand
# distinct names must not make every policy evaluation slow.
MAX_IMPORTS = 256
MAX_CALLS = 512


@dataclass
class Findings:
    parsed: bool = False
    imports: set[str] = field(default_factory=set)
    calls: set[str] = field(default_factory=set)
    features: set[str] = field(default_factory=set)

    def merge(self, other: Findings) -> None:
        self.imports |= other.imports
        self.calls |= other.calls
        self.features |= other.features

    def as_dict(self) -> dict[str, Any]:
        return {
            "parsed": self.parsed,
            "imports": sorted(self.imports)[:MAX_IMPORTS],
            "calls": sorted(self.calls)[:MAX_CALLS],
            "features": sorted(self.features),
        }
