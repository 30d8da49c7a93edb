"""The audit log: one hash-chained JSON Lines file, durable before any answer.

Owns the record format and the chain (`chain`: canonical JSON, hashes, `verify_file`),
the writer (`log.AuditLog`: group-commit fsync, `append`/`submit`), the file itself
(`file`), readers (`read`: filtered queries and `tail`; `reverse`: newest first, seq
cursors) and the values that may enter a record (`values.jsonable`).
May import: gateway's plain modules (errors, files). Nothing above it.
"""
