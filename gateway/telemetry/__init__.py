"""What the gateway tells its operators: metrics, logs, traces.

Owns the Prometheus registry (`metrics.Metrics`), gauges read at scrape time and audit
observers (`live`), log lines with request and execution ids and redaction (`logs`),
and optional OpenTelemetry spans (`tracing.Tracing`).
May import: settings and gateway's plain modules.
"""
