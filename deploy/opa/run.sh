#!/usr/bin/env bash
# Start OPA as execgate's policy decision point on 127.0.0.1:8181 (`make opa-run`).
#
# OPA takes policies/ as the bundle "execgate" from a local bundle server that
# rebuilds it whenever a file changes (OPA polls every 1-2 s: edits apply without
# a restart). Decision logs, masked by policies/system/log.rego, go to
# $OPA_LOG_DIR/opa.log (OPA's console log, JSON lines; `"msg":"Decision Log"`).
# Point the gateway at it with `policy.engine = "opa"` (EXECGATE_POLICY_ENGINE=opa).
set -euo pipefail
cd "$(dirname "$0")/../.."

OPA="${EXECGATE_OPA_BIN:-$HOME/.cache/execgate/opa/v1.22.4/opa}"
POLICY_DIR="${EXECGATE_POLICY_PATH:-policies}"
OPA_ADDR="${OPA_ADDR:-127.0.0.1:8181}"
BUNDLE_PORT="${BUNDLE_PORT:-8282}"
OPA_LOG_DIR="${OPA_LOG_DIR:-var/opa}"
PYTHON="${PYTHON:-.venv/bin/python}"

[ -x "$OPA" ] || { echo "no OPA binary at $OPA: run 'make opa' first" >&2; exit 1; }
mkdir -p "$OPA_LOG_DIR"

"$PYTHON" -m gateway.policy.bundle_server --path "$POLICY_DIR" --port "$BUNDLE_PORT" \
  2>>"$OPA_LOG_DIR/bundle_server.log" &
bundle_pid=$!
"$OPA" run --server --addr "$OPA_ADDR" --skip-version-check --log-format json \
  --config-file deploy/opa/config.yaml \
  --set "services.bundles.url=http://127.0.0.1:$BUNDLE_PORT" \
  >>"$OPA_LOG_DIR/opa.log" 2>&1 &
opa_pid=$!
trap 'kill "$opa_pid" "$bundle_pid" 2>/dev/null; wait' EXIT INT TERM

echo "OPA on http://$OPA_ADDR (bundle from $POLICY_DIR, logs in $OPA_LOG_DIR); Ctrl-C stops it"
wait -n "$opa_pid" "$bundle_pid"
