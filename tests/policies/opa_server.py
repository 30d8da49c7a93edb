"""A real OPA server for tests, and where its binary comes from.

`OpaServer` is `gateway.policy.opa_local.LocalOpa`: the bundle server and
`opa run` on free loopback ports, started the way deploy/opa/run.sh starts
them (same config file), owned by the test that started them. The OPA binary
comes from $EXECGATE_OPA_BIN (the Makefile exports it), the Makefile's pinned
build, PATH or ~/go/bin; without it tests skip locally and fail in CI.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from gateway.policy.local_opa import REPO, LocalOpa, free_port
from tests.components import missing_component

POLICIES = REPO / "policies"
OpaServer = LocalOpa

__all__ = ["POLICIES", "REPO", "OpaServer", "find_opa", "free_port"]


def find_opa() -> str:
    # The Makefile exports EXECGATE_OPA_BIN; next, its pinned build (OPA_VERSION).
    pinned = Path.home() / ".cache" / "execgate" / "opa" / "v1.22.4" / "opa"
    candidates = [os.environ.get("EXECGATE_OPA_BIN"), str(pinned), shutil.which("opa")]
    candidates.append(str(Path.home() / "go" / "bin" / "opa"))
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            return candidate
    missing_component("the opa binary is needed (set EXECGATE_OPA_BIN or put opa on PATH)")
