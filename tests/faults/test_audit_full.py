"""Audit disk full: the gateway stops admitting executions (503 audit_unavailable,
/readyz 503) rather than run unaudited ones, and resumes by itself once there is room,
with the chain intact and the refused records counted.

The audit log lives on a real, tiny tmpfs mounted for the test (root)."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from gateway.app import create_app
from gateway.appkeys import SERVICES
from gateway.audit.chain import verify_file
from gateway.auth.keys import load_or_create_dev_secret
from gateway.auth.tokens import mint_token
from tests.gateway.conftest import audit_records, auth, make_settings, require_root

pytestmark = pytest.mark.integration


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    require_root()
    mount = tmp_path / "auditfs"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(directory: Path) -> Path:
    """Write until the file system says ENOSPC."""
    filler = directory / "filler"
    with filler.open("wb", buffering=0) as f, contextlib.suppress(OSError):
        while True:
            f.write(b"\0" * 512)
    return filler


def executions(client: TestClient) -> float:
    counter = client.app[SERVICES].metrics.executions
    return sum(s.value for m in counter.collect() for s in m.samples if s.name.endswith("_total"))


async def test_a_full_audit_disk_stops_executions_until_there_is_room(
    aiohttp_client: Any, tmp_path: Path, small_disk: Path
) -> None:
    settings = make_settings(
        tmp_path,
        EXECGATE_AUDIT_PATH=str(small_disk / "audit.jsonl"),
        EXECGATE_BACKENDS_DEFAULT="noop",
    )
    client = await aiohttp_client(create_app(settings))
    secret = load_or_create_dev_secret(Path(settings.auth.hs256_secret_file))
    headers = auth(mint_token(secret, tenant="acme", sub="a", scopes=["exec:python"], ttl_s=600))
    body = {"language": "python", "code": "print(1)"}

    assert (await client.post("/v1/executions", json=body, headers=headers)).status == 200

    filler = await asyncio.to_thread(fill, small_disk)
    # A record may still fit in the file's last page; the first failed write flips the
    # gateway to refusing, and from then on nothing is admitted.
    answers = []
    for _ in range(10):
        resp = await client.post("/v1/executions", json=body, headers=headers)
        answers.append((resp.status, (await resp.json()).get("error", {}).get("code")))
        if answers[-1] == (503, "audit_unavailable"):
            break
    assert answers[-1] == (503, "audit_unavailable"), answers
    ran_before = executions(client)
    for _ in range(5):
        resp = await client.post("/v1/executions", json=body, headers=headers)
        assert resp.status == 503
        assert (await resp.json())["error"]["code"] == "audit_unavailable"
    assert executions(client) == ran_before, "an execution ran while the audit log was failing"
    ready = await client.get("/readyz")
    assert ready.status == 503 and "audit" in (await ready.json())["missing"]
    metrics = await (await client.get("/metrics")).text()
    assert "execgate_audit_healthy 0.0" in metrics

    filler.unlink()
    deadline = time.monotonic() + 30
    while (await client.get("/readyz")).status != 200:
        assert time.monotonic() < deadline, "the audit log never recovered"
        await asyncio.sleep(0.2)
    assert (await client.post("/v1/executions", json=body, headers=headers)).status == 200

    assert verify_file(settings.audit.path).ok
    records = audit_records(settings)
    [note] = [r for r in records if r["type"] == "audit.write_failed"]
    assert note["lost_records"] >= 1
    # Everything that ran is in the log: no execution without its durable start record.
    assert sum(r["type"] == "execution.started" for r in records) == executions(client)
