"""The OPA bundle of the policy directory, and the server that publishes it."""

from __future__ import annotations

import gzip
import io
import json
import tarfile
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient

from gateway.policy.bundle import build_bundle
from gateway.policy.bundle_server import BUNDLE_ROUTE, SOURCE, create_app
from gateway.policy.sources import load_sources
from tests.gateway.policy.conftest import write_policy
from tests.policies.opa_server import POLICIES


def members(bundle: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(bundle))) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers()}  # type: ignore[union-attr]


def test_bundle_holds_what_the_embedded_engine_loads() -> None:
    sources = load_sources(POLICIES)
    files = members(build_bundle(sources))
    assert json.loads(files["/.manifest"])["revision"] == sources.revision
    assert json.loads(files["/data.json"]) == sources.data
    rego = {name for name in files if name.endswith(".rego")}
    assert rego == {"/" + Path(m).relative_to(POLICIES).as_posix() for m in sources.modules}
    assert not any(name.endswith("_test.rego") for name in files)
    assert "/examples/no_network.rego" in rego and "/system/log.rego" in rego


def test_bundle_is_reproducible() -> None:
    assert build_bundle(load_sources(POLICIES)) == build_bundle(load_sources(POLICIES))


async def test_server_serves_with_etag_and_rebuilds(tmp_path: Path, aiohttp_client: Any) -> None:
    directory = write_policy(tmp_path, 'package execgate\ndecision := {"v": 1}\n')
    client: TestClient = await aiohttp_client(create_app(directory, interval_s=3600))
    first = await client.get(BUNDLE_ROUTE)
    assert first.status == 200 and first.content_type == "application/gzip"
    etag = first.headers["ETag"]
    assert etag == f'"{load_sources(directory).revision}"'
    assert (await client.get(BUNDLE_ROUTE, headers={"If-None-Match": etag})).status == 304

    write_policy(directory, 'package execgate\ndecision := {"v": 2}\n')
    source = client.app[SOURCE]
    await source.refresh()
    second = await client.get(BUNDLE_ROUTE, headers={"If-None-Match": etag})
    assert second.status == 200 and second.headers["ETag"] != etag
    assert b'"v": 2' in members(await second.read())["/policy.rego"]

    # Unreadable as a policy: the last good bundle stays.
    (directory / "data.json").write_text("{broken")
    await source.refresh()
    third = await client.get(BUNDLE_ROUTE)
    assert third.headers["ETag"] == second.headers["ETag"]
