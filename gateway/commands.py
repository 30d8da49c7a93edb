"""What each `execgate` subcommand does; argument parsing lives in cli.py."""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from gateway.settings import Settings

# `execgate exec` exit statuses that are not the program's own.
EXIT_TIMEOUT = 124  # like coreutils timeout(1)
EXIT_REFUSED = 125  # the gateway refused or failed; nothing ran
EXIT_KILLED = 137  # oom, killed, output_limit without an exit status

_SUFFIX_LANG = {
    ".py": "python",
    ".sh": "bash",
    ".bash": "bash",
    ".js": "javascript",
    ".mjs": "javascript",
}


def serve(args: argparse.Namespace, settings: Settings) -> int:
    from aiohttp import web

    from gateway.app import StartupError, create_app
    from gateway.policy.base import PolicyEngineError
    from gateway.policy.opa_build import OpaNotFound, find_opa_binary

    if settings.policy.engine == "embedded":
        # Before anything starts: no compiler, no policy, no gateway (fail closed). Not a
        # fallback to rego-cpp: that is a different evaluator (README, "Policy engine").
        try:
            find_opa_binary(settings.policy.opa_bin)
        except OpaNotFound as exc:
            print(f"execgate: {exc.message}", file=sys.stderr)
            return 2
    host = args.host or settings.server.host
    port = args.port if args.port is not None else settings.server.port
    # SIGTERM: the listener closes, running requests get shutdown_grace_s to finish, the
    # rest are cancelled (their sandboxes killed, audited), then services close.
    try:
        web.run_app(
            create_app(settings),
            host=host,
            port=port,
            access_log=None,
            print=None,
            shutdown_timeout=settings.server.shutdown_grace_s,
        )
    except (StartupError, PolicyEngineError) as exc:
        # Audited as gateway.start_failed already; the operator needs the cause, not a trace.
        print(f"execgate: the gateway did not start: {exc}", file=sys.stderr)
        return 1
    return 0


def token(args: argparse.Namespace, settings: Settings) -> int:
    from gateway.tokens import load_or_create_dev_secret, mint_token

    secret = load_or_create_dev_secret(Path(settings.auth.hs256_secret_file))
    print(
        mint_token(
            secret,
            tenant=args.tenant,
            sub=args.sub,
            scopes=args.scope.split(),
            ttl_s=args.ttl,
            tenant_claim=settings.auth.tenant_claim,
            issuer=settings.auth.issuer,
            audience=settings.auth.audience,
        )
    )
    return 0


def _dev_token(settings: Settings, *, tenant: str, sub: str, scopes: list[str]) -> str:
    from gateway.tokens import load_or_create_dev_secret, mint_token

    secret = load_or_create_dev_secret(Path(settings.auth.hs256_secret_file))
    return mint_token(
        secret,
        tenant=tenant,
        sub=sub,
        scopes=scopes,
        ttl_s=300,
        tenant_claim=settings.auth.tenant_claim,
        issuer=settings.auth.issuer,
        audience=settings.auth.audience,
    )


def _call(url: str, bearer: str, body: object | None = None) -> dict[str, Any]:
    """One JSON call to the gateway; raises CallFailed with the gateway's own message."""
    request = urllib.request.Request(
        url,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {bearer}", "Content-Type": "application/json"},
        method="GET" if body is None else "POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=3600) as response:
            return json.load(response)
    except urllib.error.HTTPError as exc:
        payload = exc.read().decode("utf-8", "replace")
        try:
            err = json.loads(payload)["error"]
            message = f"{err['code']}: {err['message']}"
            for reason in err.get("reasons", []):
                message += f"\n  - {reason}"
        except (ValueError, KeyError, TypeError):
            message = f"HTTP {exc.code}: {payload[:500]}"
        raise CallFailed(message) from None
    except urllib.error.URLError as exc:
        raise CallFailed(f"cannot reach {url}: {exc.reason}") from None


class CallFailed(Exception):
    pass


def exec_code(args: argparse.Namespace, settings: Settings) -> int:
    code = sys.stdin.read() if args.file == "-" else Path(args.file).read_text(encoding="utf-8")
    language = args.lang or _SUFFIX_LANG.get(Path(args.file).suffix, "python")
    bearer = args.token or _dev_token(
        settings, tenant=args.tenant, sub="cli", scopes=[f"exec:{language}"]
    )
    body: dict[str, object] = {"language": language, "code": code}
    if args.timeout is not None:
        body["limits"] = {"timeout_s": args.timeout}
    try:
        result = _call(args.url.rstrip("/") + "/v1/executions", bearer, body)
    except CallFailed as exc:
        print(f"execgate: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    if result.get("status") == "pending_approval":
        try:
            result = _await_approval(args.url, bearer, result)
        except CallFailed as exc:
            print(f"execgate: {exc}", file=sys.stderr)
            return EXIT_REFUSED
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        sys.stdout.write(result["stdout"])
        sys.stderr.write(result["stderr"])
    status = result["status"]
    if status in ("ok", "error"):
        return int(result["exit_code"])
    print(f"execgate: execution ended with status {status}", file=sys.stderr)
    return EXIT_TIMEOUT if status == "timeout" else EXIT_KILLED


def _await_approval(url: str, bearer: str, held: dict[str, Any]) -> dict[str, Any]:
    """Long-poll a held execution until a person decides and it has run."""
    print(
        f"execgate: held for approval {held['approval_id']} (expires {held['expires_at']}):",
        file=sys.stderr,
    )
    for reason in held.get("reasons", []):
        print(f"  - {reason}", file=sys.stderr)
    record_url = f"{url.rstrip('/')}/v1/executions/{held['execution_id']}?wait=30"
    while True:
        record = _call(record_url, bearer)
        if record["status"] == "done":
            return record["result"]
        if record["status"] == "failed":
            error = record.get("error") or {}
            raise CallFailed(f"{error.get('code', 'failed')}: {error.get('message', '')}")


def audit(args: argparse.Namespace, settings: Settings) -> int:
    path = Path(args.file or settings.audit.path)
    if args.audit_command == "verify":
        from gateway.audit_chain import verify_file

        report = verify_file(path)
        if report.ok:
            print(f"{path}: OK, {report.records} records, chain intact")
            return 0
        print(
            f"{path}: BROKEN at record seq={report.first_bad_seq} (line {report.line}): "
            f"{report.reason}",
            file=sys.stderr,
        )
        return 1
    from gateway.audit_chain import tail

    try:
        for record in tail(
            path,
            follow=args.follow,
            type=args.type,
            tenant=args.tenant,
            execution_id=args.execution_id,
            since=args.since,
        ):
            print(json.dumps(record, ensure_ascii=False), flush=True)
    except KeyboardInterrupt:
        pass
    except ValueError as exc:  # a --since that is not a timestamp
        print(f"execgate: {exc}", file=sys.stderr)
        return 2
    return 0


def bench(args: argparse.Namespace, settings: Settings) -> int:
    from gateway.bench import main as bench_main

    return bench_main(args.runs, args.json_path)


def load(args: argparse.Namespace, settings: Settings) -> int:
    from gateway.load import main as load_main

    return load_main(
        args.requests, args.concurrency, args.max_seconds, args.json_path, args.redis_url
    )


def approvals(args: argparse.Namespace, settings: Settings) -> int:
    bearer = args.token or _dev_token(
        settings,
        tenant=args.tenant,
        sub=args.approver,
        scopes=["approvals:read", "approvals:decide"],
    )
    base = args.url.rstrip("/") + "/v1/approvals"
    try:
        if args.approvals_command == "list":
            listing = _call(f"{base}?status={args.status}", bearer)["approvals"]
            if args.json:
                print(json.dumps(listing, indent=2))
                return 0
            for a in listing:
                print(
                    f"{a['approval_id']}  {a['status']:<8} {a['tenant']:<12} "
                    f"{a['requester']:<16} {a['language']:<10} expires {a['expires_at']}"
                )
                for reason in a["reasons"]:
                    print(f"    - {reason}")
            return 0
        answer = _call(
            f"{base}/{args.approval_id}/decision",
            bearer,
            {"decision": args.approvals_command, "reason": args.reason},
        )
    except CallFailed as exc:
        print(f"execgate: {exc}", file=sys.stderr)
        return 1
    print(f"{answer['approval_id']}: {answer['status']}")
    if answer.get("approval_token"):
        print(answer["approval_token"])
    return 0


def escape_test(args: argparse.Namespace, settings: Settings) -> int:
    """Run the escape suite against a freshly started backend; non-zero if any escaped."""
    import asyncio

    from backends import backend_class
    from gateway.escape.report import as_json, row, summary, table
    from gateway.escape.runner import run_suite

    key_file = str(Path(settings.auth.hs256_secret_file).absolute())

    async def main() -> int:
        backend = backend_class(args.backend)(settings.backend_settings(args.backend))
        await backend.start()
        try:
            progress = None if args.json else (lambda f: print(row(f), file=sys.stderr))
            result = await run_suite(
                backend,
                credential_files=(key_file,),
                progress=progress,
            )
        finally:
            await backend.close()
        print(json.dumps(as_json(result), indent=2) if args.json else table(result))
        if not args.json:
            print(summary(result), file=sys.stderr)
        return 1 if result.escaped else 0

    return asyncio.run(main())
