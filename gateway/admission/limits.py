"""Applied limits: the lowest of request, policy obligations, tenant ceiling and backend."""

from __future__ import annotations

from typing import Any

from backends.base import Limits
from gateway.settings.model import TenantSettings

KEYS = ("timeout_s", "memory_mb", "cpus", "pids", "disk_mb", "output_bytes")
_INTS = {"memory_mb", "pids", "disk_mb", "output_bytes"}
# What a request that asks for nothing gets, before clamping.
DEFAULTS = Limits()


def clamp(
    requested: dict[str, Any],
    obligations: dict[str, Any],
    tenant: TenantSettings,
    backend_max: Limits,
) -> Limits:
    values: dict[str, Any] = {}
    for key in KEYS:
        candidates = [
            requested.get(key, getattr(DEFAULTS, key)),
            getattr(tenant, key),
            getattr(backend_max, key),
        ]
        if obligations.get(key) is not None:
            candidates.append(obligations[key])
        value = min(candidates)
        values[key] = int(value) if key in _INTS else float(value)
    return Limits(**values)
