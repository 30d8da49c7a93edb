"""Reading the deploy/ files as the tests see them."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
K8S = DEPLOY / "k8s"
COMPOSE = DEPLOY / "compose.yaml"

_DEFAULTED = re.compile(r"\$\{[A-Z_]+:-([^}]*)\}")


def compose_text() -> str:
    """The compose file with `${VAR:-default}` interpolated as compose does, unset vars."""
    return _DEFAULTED.sub(r"\1", COMPOSE.read_text())


def k8s_documents() -> list[tuple[str, dict[str, Any]]]:
    """(file name, document) for every resource the kustomization lists."""
    listed = yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"]
    return [
        (name, doc)
        for name in listed
        for doc in yaml.safe_load_all((K8S / name).read_text())
        if doc
    ]


def seconds(duration: str | int) -> float:
    """A compose duration ("40s", "1m30s") in seconds."""
    if isinstance(duration, int):
        return float(duration)
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    return sum(float(n) * units[u] for n, u in re.findall(r"([\d.]+)(ms|h|m|s)", duration))
