"""A bundle server for OPA: serves the policy directory as a bundle, rebuilt on change.

OPA's own way to take new policy without a restart is to poll a bundle service
(`deploy/opa/config.yaml`); this is that service for development and CI, and
the reference for what a production one serves. Every `interval_s` it hashes
the directory; when the hash changes it rebuilds the bundle (revision = that
hash). A directory that cannot be read as a policy (invalid JSON, no modules)
leaves the last good bundle in place and is logged; a bundle whose Rego does
not compile is refused by OPA itself, which keeps its active bundle and reports
the error in its log and status.

    python -m gateway.policy.bundle_server --path policies --port 8282

`GET /bundles/execgate.tar.gz` answers with the bundle and `ETag: "<revision>"`,
or 304 to `If-None-Match` of the current revision. With `--port 0` the line
printed at start names the port chosen.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from gateway.policy.base import PolicyEngineError
from gateway.policy.bundle import BUNDLE_NAME, build_bundle
from gateway.policy.sources import fingerprint, load_sources

log = logging.getLogger(__name__)

BUNDLE_ROUTE = f"/bundles/{BUNDLE_NAME}.tar.gz"


@dataclass
class _Bundle:
    revision: str = ""
    content: bytes = b""


class BundleSource:
    """The latest good bundle of `path`, refreshed every `interval_s` by `run()`."""

    def __init__(self, path: Path, interval_s: float) -> None:
        self.path = path
        self.interval_s = interval_s
        self.current = _Bundle()
        self._seen = ""

    async def refresh(self) -> None:
        try:
            seen = await asyncio.to_thread(fingerprint, self.path)
            if seen in (self._seen, self.current.revision):
                return
            self._seen = seen
            sources = await asyncio.to_thread(load_sources, self.path)
        except PolicyEngineError as exc:
            log.error("policy bundle not rebuilt, still serving %s: %s", self._short, exc)
            return
        self.current = _Bundle(sources.revision, build_bundle(sources))
        log.info("policy bundle rebuilt: revision %s", self._short)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self.refresh()

    @property
    def _short(self) -> str:
        return self.current.revision[:12] or "nothing"


SOURCE = web.AppKey("bundle_source", BundleSource)


async def _serve(request: web.Request) -> web.Response:
    bundle = request.app[SOURCE].current
    if not bundle.content:
        raise web.HTTPServiceUnavailable(text="no policy bundle could be built yet")
    etag = f'"{bundle.revision}"'
    if request.headers.get("If-None-Match") == etag:
        return web.Response(status=304, headers={"ETag": etag})
    return web.Response(
        body=bundle.content, content_type="application/gzip", headers={"ETag": etag}
    )


def create_app(path: Path, interval_s: float) -> web.Application:
    app = web.Application()
    app[SOURCE] = BundleSource(path, interval_s)

    async def refresher(app: web.Application) -> AsyncIterator[None]:
        source = app[SOURCE]
        await source.refresh()
        task = asyncio.create_task(source.run(), name="bundle-refresh")
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    app.cleanup_ctx.append(refresher)
    app.router.add_get(BUNDLE_ROUTE, _serve)
    return app


async def _main(path: Path, host: str, port: int, interval_s: float) -> None:
    runner = web.AppRunner(create_app(path, interval_s), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = runner.addresses[0][1]
    print(f"serving {path} as a bundle on http://{host}:{bound}{BUNDLE_ROUTE}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--path", type=Path, default=Path("policies"))
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8282)
    parser.add_argument("--interval-s", type=float, default=1.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(message)s")
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_main(args.path.resolve(), args.host, args.port, args.interval_s))


if __name__ == "__main__":
    main()
