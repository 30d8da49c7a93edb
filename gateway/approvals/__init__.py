"""Human approval: held executions, the people who decide, the tokens they grant.

Owns the approval records (`records`: SQLite store, `Approval`), the desk that holds,
notifies and takes decisions (`desk.ApprovalDesk`), what an approval binds
(`binding`), the EdDSA approval tokens (`tokens.ApprovalSigner`) and Standard
Webhooks signing and verification (`webhooks`).
May import: the audit log, auth, executions, settings and gateway's plain modules.
"""
