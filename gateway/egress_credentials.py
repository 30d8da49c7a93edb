"""A tenant's provisioned egress credentials, for the destinations a decision allows.

Values are read from their files at each use (so rotation needs no restart)
and travel only in the ExecSpec to the backend's egress proxy: never into the
policy input, the audit log, a log line or the sandbox.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from backends.base import Credential
from backends.egress.rules import Rules
from gateway import errors
from gateway.errors import GatewayError
from gateway.settings.model import EgressSecretSettings, EgressSettings


def _read_value(path: str) -> str:
    return Path(path).read_text(encoding="utf-8").strip()


async def credentials_for(
    settings: EgressSettings, tenant: str, egress: tuple[str, ...]
) -> tuple[Credential, ...]:
    """The tenant's secrets whose destination the decision's egress list allows."""
    provisioned = settings.secrets.get(tenant)
    if not provisioned or not egress:  # the common case, on every execution's path
        return ()
    rules = Rules(egress)
    wanted: list[tuple[str, EgressSecretSettings]] = []
    for name, secret in sorted(provisioned.items()):
        host, _, port = secret.destination.rpartition(":")
        if rules.match(host, int(port)) is not None:
            wanted.append((name, secret))
    found = []
    for name, secret in wanted:
        try:
            value = await asyncio.to_thread(_read_value, secret.value_file)
        except (OSError, UnicodeDecodeError) as exc:
            # Fail closed: without its credential the call would go out unauthenticated.
            raise GatewayError(
                errors.BACKEND_UNAVAILABLE,
                f"egress secret {name!r} of tenant {tenant!r} cannot be read: {type(exc).__name__}",
            ) from None
        if not value or any(c in value for c in "\r\n\0"):
            raise GatewayError(
                errors.BACKEND_UNAVAILABLE,
                f"egress secret {name!r} of tenant {tenant!r} is empty or not one line",
            )
        found.append(Credential(secret.destination, secret.header, value))
    return tuple(found)
