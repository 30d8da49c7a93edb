"""The docker backends: runc (`docker`) and gVisor's runsc (`docker-gvisor`).

Owns the backends (`backend.DockerBackend`, `gvisor.GvisorBackend`), their settings
(`settings`), the create request as a pure function (`config`), the Docker SDK on its
own threads (`engine`), one container's life (`sandbox`), the launcher that is PID 1
inside (`launcher`) and its framed protocol (`protocol`), the pool of containers
started ahead (`pool`), the seccomp profile rendered from backends/seccomp.kafel
(`seccomp`), the gateway's /etc files (`etc`), how a run ended (`status`), the image
tag (`image`) and the reaper of a dead gateway's containers (`reaper`).
May import: the shared parts of `backends/`, never another backend.
"""
