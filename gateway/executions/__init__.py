"""Executions as the API shows them: records, results, recovery.

Owns the execution records behind `GET /v1/executions/{id}` (`store.ExecutionStore`,
memory + SQLite, long-polling), the rendered result and held answers (`results`), and
the end given at start-up to executions a killed gateway left running (`recovery`).
May import: the audit log and gateway's plain modules.
"""
