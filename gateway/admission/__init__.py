"""Admission: whether a tenant may run now, and within which limits.

Owns per-tenant rate (GCRA), CPU-seconds per hour, executions per day, concurrency
and the fairly shared global cap (`gate.Admission`), and the applied limits, the
lowest of request, obligations, tenant ceiling and backend (`limits.clamp`).
May import: `gateway.state` (where the counters live), settings, `backends.base`.
"""
