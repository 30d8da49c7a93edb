"""Which provisioned secrets an execution's proxy gets, and failing closed."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.egress_credentials import credentials_for
from gateway.errors import GatewayError
from gateway.settings.model import EgressSecretSettings, EgressSettings


def settings(tmp_path: Path, value: str = "Bearer t0ken\n") -> EgressSettings:
    (tmp_path / "v").write_text(value)
    secret = EgressSecretSettings(destination="api.example.com:443", value_file=str(tmp_path / "v"))
    return EgressSettings(secrets={"acme": {"api": secret}})


async def test_only_for_an_allowed_destination_of_the_tenant(tmp_path: Path) -> None:
    s = settings(tmp_path)
    (credential,) = await credentials_for(s, "acme", ("*.example.com:443",))
    assert (credential.destination, credential.header) == ("api.example.com:443", "Authorization")
    assert credential.value == "Bearer t0ken" and "t0ken" not in repr(credential)
    assert await credentials_for(s, "acme", ("api.example.com:80",)) == ()
    assert await credentials_for(s, "acme", ()) == ()
    assert await credentials_for(s, "globex", ("api.example.com:443",)) == ()


@pytest.mark.parametrize("value", ["", "a\r\nX-Injected: 1", "two\nlines"])
async def test_unusable_values_fail_closed(tmp_path: Path, value: str) -> None:
    with pytest.raises(GatewayError, match="empty or not one line"):
        await credentials_for(settings(tmp_path, value), "acme", ("api.example.com:443",))


async def test_unreadable_file_fails_closed_without_the_path_contents(tmp_path: Path) -> None:
    s = settings(tmp_path)
    (tmp_path / "v").unlink()
    with pytest.raises(GatewayError, match="cannot be read: FileNotFoundError"):
        await credentials_for(s, "acme", ("api.example.com:443",))
