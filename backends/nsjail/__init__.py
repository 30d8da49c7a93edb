"""The nsjail backend: a fresh namespace jail per execution, made ahead and used once.

Owns the backend (`backend.NsjailBackend`), its settings (`settings`), the command
line as a pure function (`config`, golden-tested), one sandbox's life (`sandbox`:
make, configure, execute, finish, dispose), the process under its deadline and
output cap (`process`), how it ended (`status`, `log`), host checks (`host`) and
refused system calls named from the kernel log (`seccomp_audit`).
May import: the shared parts of `backends/` (base, cgroups, ceilings, egress,
runtimes, workspace), never another backend.
"""
