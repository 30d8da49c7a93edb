"""The OPA engine: `data.execgate.decision` from an OPA server over its REST API.

One aiohttp session (one connection pool) for the engine's lifetime; each
decision is `POST /v1/data/execgate/decision?provenance=true` with
`{"input": ...}` under its own deadline (`policy.timeout_ms`, connecting
included). What fails closed, and how:

- no connection, a timeout, a 5xx without a JSON error body: "unavailable";
- an answer without `result` (the decision is undefined), a decision that is
  not an object, an OPA error body (an evaluation error such as conflicting
  rules, a 4xx): "invalid".

Retries only where the query cannot have been evaluated: the connection was
refused or could not be made (nothing was sent), or a pooled keep-alive
connection turned out to be closed before any byte of an answer came back (OPA
restarted; the query is read-only, so sending it again changes nothing). Never
after a timeout, never after any answer, and always within the same deadline.

The provenance block names the bundle revision that evaluated this very query,
so `policy.decided` records the policy that decided even while OPA activates a
new bundle; OPA's `decision_id` (present when decision logging is on) becomes
the gateway's decision id, so the two logs join.

An OPA started the way OPA's docs start it, `opa run --server policies/`, has no
bundle: its answers carry no revision. It decides too, and the revision is named
for what it is: `opa-files:<sha256>` over the modules OPA reports
(`GET /v1/policies`: ids and source; data documents are not in it), read at start,
by each health check and again when older than `FILES_REVISION_TTL_S` (in the
background: a decision within that time of an edit can carry the previous hash),
or `unversioned` while OPA has not said. /readyz says so. An OPA whose answers name
bundles, none of them `policy.opa_bundle`, is refused: the configuration is wrong.

Why not `opa-python-client`: see the README ("Choosing the policy engine").
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from typing import Any

import aiohttp

from gateway.json_codec import JsonError, loads
from gateway.policy.base import (
    DECISION_PATH,
    REVIEW_PATH,
    EngineAnswer,
    PolicyEngineError,
    json_kind,
)

log = logging.getLogger(__name__)

# The bundle whose revision we report (its name in OPA's `bundles` configuration).
DEFAULT_BUNDLE = "execgate"
_MAX_ATTEMPTS = 3
_RETRY_PAUSE_S = 0.01
_ERROR_DETAIL_CHARS = 300
# How long a hash of OPA's loaded policy files names its decisions before it is re-read.
FILES_REVISION_TTL_S = 5.0
# Listing the modules sends their ASTs too (~400 KB for policies/): off the decision path,
# so it gets more time than one decision.
FILES_READ_TIMEOUT_S = 2.0
UNVERSIONED = "unversioned"


class OpaEngine:
    """PolicyEngine over an OPA server at `url` (e.g. http://127.0.0.1:8181)."""

    def __init__(self, url: str, timeout_ms: int, *, bundle: str = DEFAULT_BUNDLE) -> None:
        self._base = url.rstrip("/")
        self._decision_url = f"{self._base}/v1/data/{DECISION_PATH}"
        self._review_url = f"{self._base}/v1/data/{REVIEW_PATH}"
        self._timeout_s = timeout_ms / 1000
        self._bundle = bundle
        self._session: aiohttp.ClientSession | None = None
        self._closed = False
        # The revision of the latest answer or health check; "" until OPA has said.
        self.revision = ""
        # Without a bundle: the hash of OPA's loaded modules, when it was read, the refresh.
        self._files_revision: str | None = None
        self._files_read_at = float("-inf")
        self._files_refresh: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Open the connection pool. OPA need not be up yet: /readyz waits for it."""
        if self._closed:
            raise PolicyEngineError("unavailable", "policy engine is closed")
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=64, keepalive_timeout=30),
                # Our own JSON encoding (below), never a surprise content type.
                headers={"Content-Type": "application/json"},
            )
        healthy, detail = await self.health()
        if healthy:
            log.info("OPA policy engine ready at %s: %s", self._base, detail)
        else:
            log.warning("OPA is not ready yet (%s); decisions fail closed until it is", detail)

    async def decide(self, input: dict[str, Any]) -> EngineAnswer:
        status, answer = await self._post(_payload(input))
        return self._answer(status, answer)

    async def review(self, input: dict[str, Any]) -> dict[str, Any] | None:
        status, answer = await self._post(_payload(input), self._review_url)
        if status != 200 or isinstance(answer, JsonError) or not isinstance(answer, dict):
            self._answer(status, answer)  # raises the decision's errors, named
            raise PolicyEngineError("invalid", "OPA answered something other than a JSON object")
        if "result" not in answer:
            return None  # the policy defines no review
        value = answer["result"]
        if not isinstance(value, dict):
            raise PolicyEngineError(
                "invalid", f"data.execgate.review is {json_kind(value)}, not an object"
            )
        return value

    async def health(self) -> tuple[bool, str]:
        """OPA's own readiness, bundles included (`/health?bundles=true`), and its revision."""
        try:
            session = self._usable_session()
        except PolicyEngineError as exc:
            return False, exc.message
        try:
            async with asyncio.timeout(self._timeout_s):
                async with session.get(f"{self._base}/health?bundles=true") as resp:
                    if resp.status != 200:
                        text = (await resp.text())[:_ERROR_DETAIL_CHARS]
                        return False, f"OPA at {self._base} is not ready ({resp.status}): {text}"
                async with session.get(f"{self._base}/v1/data/system/bundles") as resp:
                    bundles = (
                        _result(loads(await resp.read(), where="OPA")) if resp.status == 200 else {}
                    )
        except TimeoutError:
            return False, f"OPA at {self._base} did not answer within {self._ms} ms"
        except (aiohttp.ClientError, ValueError) as exc:
            return False, f"OPA at {self._base} unreachable: {exc}"
        revision = _manifest_revision(bundles, self._bundle)
        if revision is not None:
            self.revision = revision
            return True, f"OPA at {self._base}, bundle {self._bundle} revision {revision[:12]}"
        if isinstance(bundles, dict) and bundles:
            return False, (
                f"OPA at {self._base} has no bundle {self._bundle!r} activated"
                f" (it has {', '.join(sorted(bundles))}): check policy.opa_bundle"
            )
        try:
            files_revision = await self._read_files_revision(session)
        except PolicyEngineError as exc:
            return False, exc.message
        if files_revision is None:
            return False, f"OPA at {self._base} has no bundle and no policy modules loaded"
        self.revision = files_revision
        return True, (
            f"OPA at {self._base} has no bundle (policy.opa_bundle = {self._bundle!r}): it"
            f" decides from the files it loaded; revision {files_revision[:22]} is a hash of"
            f" the modules it reports (GET /v1/policies, re-read every"
            f" {FILES_REVISION_TTL_S:g} s; data documents not included), not a bundle revision"
        )

    async def _read_files_revision(self, session: aiohttp.ClientSession) -> str | None:
        """`opa-files:<sha256>` of OPA's modules (ids and source), None if it has none."""
        read_timeout_s = max(self._timeout_s, FILES_READ_TIMEOUT_S)
        try:
            async with asyncio.timeout(read_timeout_s):
                async with session.get(f"{self._base}/v1/policies") as resp:
                    if resp.status != 200:
                        raise PolicyEngineError(
                            "unavailable", f"OPA at {self._base}: /v1/policies {resp.status}"
                        )
                    body = await resp.json()
        except TimeoutError:
            raise PolicyEngineError(
                "unavailable",
                f"OPA at {self._base} did not list its policies in {read_timeout_s:g} s",
            ) from None
        except (aiohttp.ClientError, ValueError) as exc:
            raise PolicyEngineError("unavailable", f"OPA at {self._base}: {exc}") from None
        modules = body.get("result") if isinstance(body, dict) else None
        if not isinstance(modules, list):
            raise PolicyEngineError("invalid", "OPA's /v1/policies is not a list of modules")
        pairs = sorted(
            (str(m.get("id", "")), str(m.get("raw", ""))) for m in modules if isinstance(m, dict)
        )
        self._files_read_at = time.monotonic()
        if not pairs:
            self._files_revision = None
            return None
        canonical = json.dumps(pairs, ensure_ascii=False, separators=(",", ":"))
        digest = hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()
        self._files_revision = f"opa-files:{digest}"
        return self._files_revision

    def _unbundled_revision(self) -> str:
        """The files' hash for an answer without a bundle, refreshed off the request path."""
        stale = time.monotonic() - self._files_read_at > FILES_REVISION_TTL_S
        if stale and (self._files_refresh is None or self._files_refresh.done()):
            self._files_refresh = asyncio.get_running_loop().create_task(self._refresh_files())
        return self._files_revision or UNVERSIONED

    async def _refresh_files(self) -> None:
        try:
            await self._read_files_revision(self._usable_session())
        except PolicyEngineError as exc:
            # Keep naming the last hash read: a decision came from OPA all the same.
            log.warning("could not re-read OPA's policy modules: %s", exc.message)

    async def close(self) -> None:
        self._closed = True
        if self._files_refresh is not None:
            self._files_refresh.cancel()
            await asyncio.gather(self._files_refresh, return_exceptions=True)
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def _ms(self) -> str:
        return f"{self._timeout_s * 1000:.0f}"

    def _usable_session(self) -> aiohttp.ClientSession:
        if self._closed:
            raise PolicyEngineError("unavailable", "policy engine is closed")
        if self._session is None:
            raise PolicyEngineError("unavailable", "policy engine is not started")
        return self._session

    async def _post(self, payload: bytes, target: str = "") -> tuple[int, Any]:
        session = self._usable_session()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeout_s
        url = f"{target or self._decision_url}?provenance=true"
        attempt = 0
        while True:
            attempt += 1
            try:
                async with asyncio.timeout_at(deadline):
                    async with session.post(url, data=payload) as resp:
                        return resp.status, await _json_or_none(resp)
            except TimeoutError:
                raise PolicyEngineError(
                    "unavailable", f"no policy decision from OPA within {self._ms} ms"
                ) from None
            except (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError) as exc:
                # Not sent, or not read by a live server: safe to send again.
                if attempt >= _MAX_ATTEMPTS or loop.time() + _RETRY_PAUSE_S >= deadline:
                    raise PolicyEngineError("unavailable", f"OPA unreachable: {exc}") from None
                await asyncio.sleep(_RETRY_PAUSE_S)
            except aiohttp.ClientError as exc:
                raise PolicyEngineError("unavailable", f"OPA request failed: {exc}") from None

    def _answer(self, status: int, answer: Any) -> EngineAnswer:
        if status != 200:
            if isinstance(answer, dict) and "code" in answer:
                message = _error_message(answer)[:_ERROR_DETAIL_CHARS]
                kind = "unavailable" if status in (502, 503, 504) else "invalid"
                raise PolicyEngineError(kind, f"OPA error {status} {answer['code']}: {message}")
            raise PolicyEngineError("unavailable", f"OPA answered HTTP {status}")
        if isinstance(answer, JsonError):
            raise PolicyEngineError("invalid", f"OPA's answer refused: {answer}")
        if not isinstance(answer, dict):
            raise PolicyEngineError("invalid", "OPA answered something other than a JSON object")
        if "result" not in answer:
            raise PolicyEngineError("invalid", "data.execgate.decision is undefined")
        value = answer["result"]
        if not isinstance(value, dict):
            raise PolicyEngineError(
                "invalid", f"data.execgate.decision is {json_kind(value)}, not an object"
            )
        provenance = answer.get("provenance")
        revision = _provenance_revision(provenance, self._bundle)
        if revision is None:
            bundles = provenance.get("bundles") if isinstance(provenance, dict) else None
            if isinstance(bundles, dict) and bundles:
                # Bundles, none of them the configured one: which of them decided is unknown.
                raise PolicyEngineError(
                    "invalid",
                    f"OPA decided without an activated bundle {self._bundle!r}"
                    f" (it has {', '.join(sorted(bundles))}): check policy.opa_bundle",
                )
            revision = self._unbundled_revision()
        self.revision = revision
        decision_id = answer.get("decision_id")
        return EngineAnswer(value, revision, decision_id if isinstance(decision_id, str) else None)


def _payload(input: dict[str, Any]) -> bytes:
    try:
        body = json.dumps({"input": input}, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise PolicyEngineError("invalid", f"policy input is not JSON: {exc}") from None
    # A lone surrogate cannot be UTF-8: send \\u escapes instead, as OPA reads them.
    try:
        return body.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps({"input": input}, allow_nan=False).encode("ascii")


def _error_message(body: dict[str, Any]) -> str:
    """OPA's message, with the first underlying error (e.g. eval_conflict_error)."""
    message = str(body.get("message", ""))
    errors = body.get("errors")
    if isinstance(errors, list) and errors and isinstance(errors[0], dict):
        first = errors[0]
        message += f": {first.get('code', '')}: {first.get('message', '')}"
    return message


async def _json_or_none(resp: aiohttp.ClientResponse) -> Any:
    raw = await resp.read()
    try:
        return loads(raw, where="OPA's answer")
    except JsonError as exc:
        return exc  # a 200 with it is refused by name (_answer); an error status needs none


def _result(answer: Any) -> Any:
    return answer.get("result", {}) if isinstance(answer, dict) else {}


def _provenance_revision(provenance: Any, bundle: str) -> str | None:
    if not isinstance(provenance, dict):
        return None
    return _revision_of(provenance.get("bundles"), bundle, ("revision",))


def _manifest_revision(bundles: Any, bundle: str) -> str | None:
    return _revision_of(bundles, bundle, ("manifest", "revision"))


def _revision_of(bundles: Any, bundle: str, path: tuple[str, ...]) -> str | None:
    node = bundles.get(bundle) if isinstance(bundles, dict) else None
    for key in path:
        node = node.get(key) if isinstance(node, dict) else None
    return node if isinstance(node, str) and node else None
