"""What each `execgate` subcommand does; argument parsing lives in cli.py."""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from gateway.settings.model import Settings

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

    from gateway.app import StartupError, create_app, freeze_startup_heap
    from gateway.policy.base import PolicyEngineError
    from gateway.policy.compiler import OpaNotFound, find_opa_binary

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
        app = create_app(settings)
        app.on_startup.append(freeze_startup_heap)  # after the services' cleanup context
        web.run_app(
            app,
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
    from gateway.auth.tokens import load_or_create_dev_secret, mint_token

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
    from gateway.auth.tokens import load_or_create_dev_secret, mint_token

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
        raise CallFailed(_http_error(exc)) from None
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
    url = args.url.rstrip("/")
    try:
        if args.json:
            result = _call(url + "/v1/executions", bearer, body)
            if result.get("status") == "pending_approval":
                result = _await_approval(url, bearer, result)
        else:
            # Output as the program writes it, to the matching stream.
            result = _stream(url + "/v1/executions", bearer, body, url)
    except CallFailed as exc:
        print(f"execgate: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    if args.json:
        print(json.dumps(result, indent=2))
    status = result["status"]
    if status in ("ok", "error"):
        return int(result["exit_code"])
    print(f"execgate: execution ended with status {status}", file=sys.stderr)
    return EXIT_TIMEOUT if status == "timeout" else EXIT_KILLED


def _events(response: Any) -> Any:
    """(event, data) pairs of a text/event-stream response, as they arrive."""
    event, data = "message", []
    for raw in response:
        line = raw.decode("utf-8").rstrip("\r\n")
        if not line:
            if data:
                yield event, json.loads("\n".join(data))
            event, data = "message", []
        elif line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].lstrip())


def _stream(post_url: str, bearer: str, body: object, base: str) -> dict[str, Any]:
    """POST for events; print output as it comes; follow a hold until it has run."""
    request = urllib.request.Request(
        post_url,
        data=json.dumps(body).encode(),
        headers={
            "Authorization": f"Bearer {bearer}",
            "Content-Type": "application/json",
            "Accept": "text/event-stream, application/json;q=0.5",
        },
        method="POST",
    )
    held: dict[str, Any] | None = None
    while True:
        try:
            with urllib.request.urlopen(request, timeout=3600) as response:
                if not response.headers.get("Content-Type", "").startswith("text/event-stream"):
                    return json.load(response)  # a gateway that answers in one piece
                for event, data in _events(response):
                    if event == "output":
                        out = sys.stdout if data["stream"] == "stdout" else sys.stderr
                        out.write(data["text"])
                        out.flush()
                    elif event == "held" and held is None:
                        held = data
                        print(
                            f"execgate: held for approval {data['approval_id']} "
                            f"(expires {data['expires_at']}):",
                            file=sys.stderr,
                        )
                        for reason in data.get("reasons", []):
                            print(f"  - {reason}", file=sys.stderr)
                    elif event == "result":
                        return dict(data)
                    elif event == "error":
                        err = data.get("error", {})
                        raise CallFailed(f"{err.get('code')}: {err.get('message', '')}")
        except urllib.error.HTTPError as exc:
            raise CallFailed(_http_error(exc)) from None
        except urllib.error.URLError as exc:
            raise CallFailed(f"cannot reach {post_url}: {exc.reason}") from None
        if held is None:
            raise CallFailed("the gateway ended the stream without a result")
        # Still waiting for a person: follow the execution's events again.
        request = urllib.request.Request(
            f"{base}/v1/executions/{held['execution_id']}/events?wait=30",
            headers={"Authorization": f"Bearer {bearer}", "Accept": "text/event-stream"},
        )


def _http_error(exc: urllib.error.HTTPError) -> str:
    payload = exc.read().decode("utf-8", "replace")
    try:
        err = json.loads(payload)["error"]
        message = f"{err['code']}: {err['message']}"
        for reason in err.get("reasons", []):
            message += f"\n  - {reason}"
    except (ValueError, KeyError, TypeError):
        message = f"HTTP {exc.code}: {payload[:500]}"
    return message


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
        from gateway.audit.chain import verify_file

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
    from gateway.audit.chain import tail

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
    from gateway.bench.run import main as bench_main

    return bench_main(args.runs, args.json_path)


def load(args: argparse.Namespace, settings: Settings) -> int:
    from gateway.bench.load import main as load_main

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
    """Run the escape suite against a freshly started backend; non-zero unless sound."""
    import asyncio

    from backends import backend_class
    from gateway.escape.catalog.index import techniques
    from gateway.escape.report import as_json, summary, table
    from gateway.escape.runner import run_suite

    key_file = str(Path(settings.auth.hs256_secret_file).absolute())

    async def main() -> int:
        backend = backend_class(args.backend)(settings.backend_settings(args.backend))
        await backend.start()
        try:
            progress = None
            if not args.json and sys.stderr.isatty():
                # On a terminal: techniques done of total, on one rewritten line.
                total = len(techniques())
                done = [0]

                def progress(finding: Any) -> None:
                    done[0] += 1
                    line = f"\r[{done[0]}/{total}] {finding.technique.id}"
                    print(f"{line[:79]:<80}", end="", file=sys.stderr, flush=True)

            result = await run_suite(
                backend,
                credential_files=(key_file,),
                progress=progress,
            )
        finally:
            await backend.close()
        if progress is not None:
            print(file=sys.stderr)
        print(json.dumps(as_json(result), indent=2) if args.json else table(result))
        if not args.json:
            print(summary(result), file=sys.stderr)
        # Sound or nothing: an escape, a run the suite could not judge, too many
        # "not applicable" all fail (a sandbox that runs nothing proves nothing).
        return 0 if result.sound else 1

    return asyncio.run(main())


def policy(args: argparse.Namespace, settings: Settings) -> int:
    """`policy eval` (one decision, with reasons) and `policy replay` (a candidate over
    the decisions the gateway kept)."""
    import asyncio

    from gateway.app import make_engine
    from gateway.policy.base import PolicyEngineError
    from gateway.policy.decision import DecisionError
    from gateway.policy.inputs import decision_inputs_path, read_kept
    from gateway.policy.replay import Report, opa_decision_log, render_decision, replay

    directory = Path(args.policy) if args.policy else Path(settings.policy.path)
    if not directory.is_dir():
        print(f"execgate: policy directory {directory} does not exist", file=sys.stderr)
        return 2
    # Always the embedded engine: the candidate is a directory, not a running OPA.
    policy_settings = settings.policy.model_copy(
        update={"path": str(directory), "engine": "embedded", "reload_interval_s": 0.0}
    )
    candidate = settings.model_copy(update={"policy": policy_settings})
    kept_path = decision_inputs_path(settings)

    def load_input() -> dict[str, Any] | None:
        if args.execution:
            found = list(read_kept(kept_path, execution_id=args.execution))
            if not found:
                print(
                    f"execgate: no recorded decision input for {args.execution} in {kept_path}",
                    file=sys.stderr,
                )
                return None
            print(
                f"input recorded for {args.execution} (decision {found[-1].decision_id}; "
                "masked: no code)",
                file=sys.stderr,
            )
            return found[-1].input
        try:
            text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text()
            document = json.loads(text)
        except (OSError, ValueError) as exc:
            print(f"execgate: cannot read the input document: {exc}", file=sys.stderr)
            return None
        if isinstance(document, dict) and set(document) == {"input"}:
            document = document["input"]  # `opa eval --input` style wrapping
        if not isinstance(document, dict):
            print("execgate: the input document must be a JSON object", file=sys.stderr)
            return None
        return document

    async def run_eval(document: dict[str, Any]) -> int:
        engine = make_engine(candidate)
        await engine.start()
        try:
            answer = await engine.decide(document)
        finally:
            await engine.close()
        if args.json:
            print(json.dumps(answer.value, indent=2, sort_keys=True))
            return 0
        try:
            print(render_decision(answer.value, answer.revision))
        except DecisionError as exc:
            print(f"execgate: the policy's decision is invalid: {exc}", file=sys.stderr)
            print(json.dumps(answer.value, indent=2, sort_keys=True))
            return 1
        return 0

    def load_kept() -> list[Any]:
        kept = list(read_kept(kept_path, since_s=args.since, tenant=args.tenant))
        seen = {k.decision_id for k in kept}
        for log_file in args.opa_log:
            logged = opa_decision_log(Path(log_file), args.tenant)
            kept += [k for k in logged if k.decision_id not in seen]
        return kept

    async def run_replay(kept: list[Any]) -> int:
        engine = make_engine(candidate)
        await engine.start()
        report = Report(candidate=str(directory), revision=engine.revision)
        try:
            await replay(engine, kept, report)
        finally:
            await engine.close()
        print(json.dumps(report.as_dict(), indent=2) if args.json else report.render())
        return 1 if report.failed else 0

    try:
        if args.policy_command == "eval":
            document = load_input()
            return 2 if document is None else asyncio.run(run_eval(document))
        return asyncio.run(run_replay(load_kept()))
    except PolicyEngineError as exc:
        print(f"execgate: policy {directory}: {exc}", file=sys.stderr)
        return 2
