"""The `execgate` command line (SPEC section 8)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from gateway.settings.model import SettingsError, load_settings
from gateway.telemetry import logs

DEFAULT_URL = "http://127.0.0.1:8080"


def _parse_ttl(text: str) -> int:
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    text = text.strip().lower()
    try:
        if text and text[-1] in units:
            return int(float(text[:-1]) * units[text[-1]])
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 30m, 1h)") from None


CONFIG_HELP = "TOML config file (default: $EXECGATE_CONFIG); before or after the verb"


def _config_after_verb(parser: argparse.ArgumentParser) -> None:
    """Every verb reads the configuration, and the docs write `execgate serve --config
    FILE` as often as `execgate --config FILE serve`: each subcommand, at every depth,
    takes the flag too. SUPPRESS keeps a verb that was not given it from resetting the
    value given before the verb; given in both places, the later one wins."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                sub.add_argument("--config", default=argparse.SUPPRESS, help=CONFIG_HELP)
                _config_after_verb(sub)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="execgate", description=__doc__)
    parser.add_argument("--config", help=CONFIG_HELP)
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the gateway")
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)

    token = sub.add_parser("token", help="mint a development token with the configured key")
    token.add_argument("--tenant", required=True)
    token.add_argument("--sub", required=True)
    token.add_argument("--scope", default="", help='space-separated, e.g. "exec:python exec:bash"')
    token.add_argument("--ttl", type=_parse_ttl, default=3600, help="e.g. 30m, 1h (default 1h)")

    exe = sub.add_parser("exec", help="submit code to a gateway and print its output")
    exe.add_argument("file", nargs="?", default="-", help="code file, or - for stdin")
    exe.add_argument("--lang", default=None, help="python | bash | javascript (default: by suffix)")
    exe.add_argument("--url", default=os.environ.get("EXECGATE_URL", DEFAULT_URL))
    exe.add_argument(
        "--token",
        default=os.environ.get("EXECGATE_TOKEN"),
        help="bearer token (default: $EXECGATE_TOKEN, else a development token)",
    )
    exe.add_argument("--tenant", default="default", help="tenant of the development token")
    exe.add_argument("--timeout", type=float, default=None, help="limits.timeout_s")
    exe.add_argument("--json", action="store_true", help="print the whole response")

    approvals = sub.add_parser("approvals", help="work the approval queue")
    approvals.add_argument("--url", default=os.environ.get("EXECGATE_URL", DEFAULT_URL))
    approvals.add_argument(
        "--token",
        default=os.environ.get("EXECGATE_TOKEN"),
        help="approver token (default: $EXECGATE_TOKEN, else a development one)",
    )
    approvals.add_argument("--tenant", default="default", help="tenant of the development token")
    approvals.add_argument(
        "--as", dest="approver", default="cli-approver", help="subject of the development token"
    )
    approvals_sub = approvals.add_subparsers(dest="approvals_command", required=True)
    listing = approvals_sub.add_parser("list", help="pending (or --status) approvals")
    listing.add_argument("--status", default="pending")
    listing.add_argument("--json", action="store_true")
    for word in ("approve", "deny"):
        decide = approvals_sub.add_parser(word, help=f"{word} an approval")
        decide.add_argument("approval_id")
        decide.add_argument("--reason", default="")

    audit = sub.add_parser("audit", help="check or follow the audit log")
    audit_sub = audit.add_subparsers(dest="audit_command", required=True)
    verify = audit_sub.add_parser("verify", help="check the hash chain")
    verify.add_argument("file", nargs="?", help="audit file (default: audit.path)")
    tail = audit_sub.add_parser("tail", help="print (and follow) audit records")
    tail.add_argument("file", nargs="?", help="audit file (default: audit.path)")
    tail.add_argument("-f", "--follow", action="store_true")
    tail.add_argument("--type")
    tail.add_argument("--tenant")
    tail.add_argument("--execution-id")
    tail.add_argument("--since", help="RFC 3339 timestamp")

    bench = sub.add_parser("bench", help="benchmarks, side by side in one run")
    bench.add_argument("--runs", type=int, default=50, help="samples per measurement")
    bench.add_argument("--json", dest="json_path", help="also write the results here")
    load = sub.add_parser("load", help="load test: tenants' limits under load (nsjail, root)")
    load.add_argument("--requests", type=int, default=10_000)
    load.add_argument("--concurrency", type=int, default=64)
    load.add_argument("--max-seconds", type=float, default=900, help="give up after this long")
    load.add_argument("--json", dest="json_path", help="also write the report here")
    load.add_argument("--redis-url", default="", help="limits in this Redis (state.backend)")
    policy = sub.add_parser("policy", help="test policy: one decision, or replay recorded ones")
    policy_sub = policy.add_subparsers(dest="policy_command", required=True)
    ev = policy_sub.add_parser("eval", help="one input document against the (or a) policy")
    source = ev.add_mutually_exclusive_group(required=True)
    source.add_argument("file", nargs="?", help="policy input JSON file, or - for stdin")
    source.add_argument("--execution", help="rebuild the input recorded for this execution")
    ev.add_argument("--policy", help="candidate policy directory (default: policy.path)")
    ev.add_argument("--json", action="store_true", help="print the decision document")
    rp = policy_sub.add_parser(
        "replay", help="a candidate policy over recorded decision inputs; what would change"
    )
    rp.add_argument("--policy", required=True, help="candidate policy directory")
    rp.add_argument("--since", type=_parse_ttl, default=None, help="e.g. 24h (default: all kept)")
    rp.add_argument("--tenant")
    rp.add_argument(
        "--opa-log", action="append", default=[], help="OPA decision-log file (JSON lines)"
    )
    rp.add_argument("--json", action="store_true")
    escape = sub.add_parser("escape-test", help="run the escape suite against a backend")
    escape.add_argument("--backend", required=True, help="a configured backend name")
    escape.add_argument("--json", action="store_true", help="print the results as JSON")
    _config_after_verb(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = load_settings(args.config)
    except SettingsError as exc:
        print(f"execgate: {exc}", file=sys.stderr)
        return 2
    logs.configure(os.environ.get("EXECGATE_LOG_LEVEL", "INFO"), settings.server.log_format)
    from gateway import commands

    handler = {
        "serve": commands.serve,
        "token": commands.token,
        "exec": commands.exec_code,
        "audit": commands.audit,
        "approvals": commands.approvals,
        "bench": commands.bench,
        "load": commands.load,
        "escape-test": commands.escape_test,
        "policy": commands.policy,
    }[args.command]
    return handler(args, settings)
