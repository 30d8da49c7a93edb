"""Resources, output collection and residue: what a program can do to the host
by volume, by what it leaves in its workspace, and by what it leaves behind.

Bombs run with small limits so a full suite stays quick; "contained" means the
limit held (from the probe's own count or the result) and the host checks found
nothing left over."""

# Probe programs are data: their lines stay as the sandbox will run them.
# ruff: noqa: E501

from __future__ import annotations

from gateway.escape.technique import (
    Evidence,
    Outcome,
    Technique,
    Verdict,
    bash,
    probe_says,
    python,
    silent,
)

PIDS = 16
OUTPUT = 64 * 1024


def ended(evidence: Evidence) -> Verdict:
    """The probe's count held within its limits, or a limit stopped it."""
    result = evidence.results[-1]
    detail = f"{result.status.value}, {len(result.events)} events, {result.duration_ms} ms"
    report = evidence.report()
    verdict = probe_says(evidence) if report is not None else silent(evidence)
    return Verdict(verdict.outcome, f"{verdict.detail}; {detail}")


def ended_quietly(evidence: Evidence) -> Verdict:
    """A program that prints no verdict (a bomb, a daemon): it started (the runner
    saw its start line) and ended; what it may have left is the residue check's
    and the canaries' to find (they come on top)."""
    result = evidence.results[-1]
    return Verdict(
        Outcome.CONTAINED,
        f"{result.status.value}, {len(result.events)} events, {result.duration_ms} ms",
    )


def output_collected(evidence: Evidence) -> Verdict:
    """What the backend handed back: no host content, no path outside, no giant."""
    if evidence.report() is None:
        return silent(evidence)  # it never got to making its files
    # The canaries' content (their names alone may appear in harmless places).
    token = b"CANARY-" + evidence.host.get("token", "").encode()
    shadow = evidence.host.get("shadow_head", "").encode()
    bad = []
    total = 0
    for f in evidence.result.files:
        total += len(f.content)
        if f.path.startswith("/") or ".." in f.path.split("/"):
            bad.append(f"path {f.path!r}")
        if (token and token in f.content) or (shadow and shadow in f.content):
            bad.append(f"host content in {f.path}")
        if f.size != len(f.content):
            bad.append(f"{f.path}: size {f.size} != {len(f.content)} bytes")
    if total > 64 << 20:
        bad.append(f"{total} bytes of files")
    names = ", ".join(f.path for f in evidence.result.files) or "no files"
    return Verdict(Outcome.ESCAPED if bad else Outcome.CONTAINED, "; ".join(bad) or names)


def output_bounded(evidence: Evidence) -> Verdict:
    r = evidence.result
    size = len(r.stdout) + len(r.stderr)
    return Verdict(
        Outcome.ESCAPED if size > OUTPUT else Outcome.CONTAINED,
        f"{size} bytes returned of a {OUTPUT} limit ({r.status.value})",
    )


def cpu_bounded(evidence: Evidence) -> Verdict:
    r = evidence.result
    # Limit 0.5 CPU; more than 1.5 CPUs' worth over the wall time is no limit at all.
    over = r.usage.cpu_ms > r.duration_ms * 1.5 + 200
    return Verdict(
        Outcome.ESCAPED if over else Outcome.CONTAINED,
        f"{r.usage.cpu_ms} ms CPU in {r.duration_ms} ms at 0.5 CPU",
    )


FILL = r"""
def fill(directory, limit_mb):
    written = 0
    try:
        with open(os.path.join(directory, 'fill'), 'wb') as f:
            while written < limit_mb << 20:
                f.write(b'\0' * (1 << 20))
                f.flush()
                written += 1 << 20
    except OSError:
        pass
    return written >> 20
"""

TECHNIQUES = [
    Technique("resources.fork_bomb", "resources", "fork without end",
              bash("echo started\n:(){ :|:& };:\nsleep 5", timeout_s=1.5, pids=PIDS), ended_quietly),
    Technique("resources.thread_bomb", "resources", "start threads without end",
              python("import threading, time\nn = 0\ntry:\n    while n < 4000:\n"
                     "        threading.Thread(target=time.sleep, args=(5,), daemon=True).start()\n"
                     "        n += 1\nexcept (RuntimeError, OSError):\n    pass\n"
                     f"report(n > {PIDS} + 8, f'{{n}} threads at a limit of {PIDS}')\nos._exit(0)\n",
                     timeout_s=3.0, pids=PIDS), ended),
    Technique("resources.fd_bomb", "resources", "open file descriptors without end",
              python("fds = []\ntry:\n    while len(fds) < 200000:\n        fds.append(os.open('/dev/null', 0))\n"
                     "except OSError:\n    pass\nreport(len(fds) > 65536, f'{len(fds)} fds')\n"), ended),
    Technique("resources.memory_bomb", "resources", "allocate far past the memory limit",
              python("chunks = []\nfor i in range(1, 17):\n    chunks.append(os.urandom(1) * (16 << 20))\n"
                     "    report(i * 16 > 96, f'{i * 16} MiB allocated at a 48 MiB limit')\n",
                     memory_mb=48), ended),
    Technique("resources.shm_bomb", "resources", "fill /dev/shm",
              python(FILL + "mb = fill('/dev/shm', 64)\nreport(mb > 8, f'{mb} MiB at a 4 MiB disk limit')\n",
                     disk_mb=4), ended),
    Technique("resources.disk_bomb", "resources", "fill /workspace and /tmp",
              python(FILL + "mb = fill('/workspace', 64) + fill('/tmp', 64)\n"
                     "report(mb > 8, f'{mb} MiB at a 4 MiB disk limit')\n", disk_mb=4), ended),
    Technique("resources.inode_bomb", "resources", "create files without end",
              python("n = 0\ntry:\n    while n < 300000:\n        open(f'/workspace/{n}', 'w').close()\n"
                     "        n += 1\nexcept OSError:\n    pass\nreport(n >= 300000, f'{n} files at 4 MiB')\n",
                     disk_mb=4, timeout_s=10.0), ended),
    Technique("resources.output_flood", "resources", "flood both streams with invalid UTF-8 and escapes",
              bash("head -c 300000 /dev/urandom &\nwhile :; do printf '\\033]0;pwn\\007\\033[2J\\xff\\xfe'; done >&2",
                   output_bytes=OUTPUT), output_bounded),
    Technique("resources.cpu_spread", "resources", "spread CPU over many children past the quota",
              bash("echo started\nfor i in 1 2 3 4; do (while :; do :; done) & done\nsleep 2; kill 0",
                   cpus=0.5), cpu_bounded),
    Technique("resources.ignore_sigterm", "resources", "ignore SIGTERM past the deadline",
              bash("echo started\ntrap '' TERM INT HUP\nwhile :; do sleep 0.1; done", timeout_s=1.0), ended_quietly),
    Technique("resources.refork", "resources", "re-fork daemons that outlive the program",
              bash("echo started\n(while :; do (sleep 30 &) ; sleep 0.05; done) &\nsleep 0.3\nexit 0"), ended_quietly),
    Technique("resources.setsid", "resources", "leave a setsid daemon behind",
              bash("echo started\nsetsid sleep 30 </dev/null >/dev/null 2>&1 &\nexit 0"), ended_quietly),
    Technique("resources.self_stop", "resources", "stop itself (SIGSTOP) to hang the run",
              bash("echo started\nkill -STOP $$\necho resumed", timeout_s=1.5), ended_quietly),
    Technique("resources.orphan_pipes", "resources", "leave an orphan holding the output pipes",
              bash("(sleep 30 &)\necho parent done", timeout_s=2.0), ended_quietly),
    Technique("resources.core_dump", "resources", "raise the core limit and dump core",
              bash("if ulimit -c unlimited 2>/dev/null; then r=true; else r=false; fi\n"
                   "echo \"{\\\"escaped\\\": $r, \\\"detail\\\": \\\"core limit $(ulimit -c)\\\"}\"\n"
                   "kill -SEGV $$"), ended),
    Technique("output.symlink", "output", "return symlinks to host files as outputs",
              python("for i, c in enumerate(H['canaries'] + ['/etc/shadow', '/etc/passwd']):\n"
                     "    os.symlink(c, f'/workspace/link{i}')\n"
                     "os.symlink('/', '/workspace/root')\nreport(False, 'links made')\n"),
              output_collected),
    Technique("output.hardlink", "output", "return hard links to files outside the workspace",
              python("made = []\nfor src in ['/etc/passwd', sys.executable] + H['canaries']:\n"
                     "    try:\n        os.link(src, f'/workspace/h{len(made)}')\n        made.append(src)\n"
                     "    except OSError:\n        pass\nreport(False, f'linked: {made}')\n"),
              output_collected),
    Technique("output.fifo", "output", "hang output collection on a FIFO",
              python("os.mkfifo('/workspace/fifo')\nreport(False, 'fifo made')\n"), output_collected),
    Technique("output.device", "output", "return device nodes (zero, urandom) as outputs",
              python("os.symlink('/dev/zero', '/workspace/zero')\n"
                     "os.symlink('/dev/urandom', '/workspace/random')\nreport(False, 'made')\n"),
              output_collected),
    Technique("output.sparse_giant", "output", "return a sparse file of 100 GiB",
              python("try:\n    with open('/workspace/sparse', 'wb') as f:\n        f.truncate(100 << 30)\n"
                     "    report(False, 'sparse file made')\nexcept OSError as exc:\n"
                     "    report(False, f'refused: {exc}')\n"), output_collected),
    Technique("output.tar_traversal", "output", "return an archive with ../ and absolute members",
              python("import tarfile, io\nwith tarfile.open('/workspace/evil.tar', 'w') as t:\n"
                     "    for name in ('../../../../tmp/' + H['token'], '/tmp/' + H['token']):\n"
                     "        info = tarfile.TarInfo(name); info.size = 1\n"
                     "        t.addfile(info, io.BytesIO(b'x'))\nreport(False, 'archive made')\n"),
              output_collected),
    Technique("residue.next_execution", "residue", "leave files and processes for the next execution",
              bash("echo @@MARK@@ > /tmp/m; echo @@MARK@@ > /workspace/m; echo @@MARK@@ > /dev/shm/m\n"
                   "(exec -a @@MARK@@ sleep 30 &)\nexit 0"),
              followup=bash("seen=$(cat /tmp/m /workspace/m /dev/shm/m 2>/dev/null; "
                            "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' ' | grep -o '@@MARKRE@@')\n"
                            "if [ -n \"$seen\" ]; then r=true; else r=false; fi\n"
                            "echo \"{\\\"escaped\\\": $r, \\\"detail\\\": \\\"seen: ${seen:-nothing}\\\"}\"")),
    Technique("residue.concurrent", "residue", "see a concurrent execution's files and processes",
              bash("echo @@MARK@@ > /tmp/m; echo @@MARK@@ > /workspace/m; echo @@MARK@@ > /dev/shm/m\n"
                   "exec -a @@MARK@@ sleep 3", timeout_s=10.0),
              followup=bash("sleep 1\nseen=$(cat /tmp/m /workspace/m /dev/shm/m 2>/dev/null; "
                            "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' ' | grep -o '@@MARKRE@@')\n"
                            "if [ -n \"$seen\" ]; then r=true; else r=false; fi\n"
                            "echo \"{\\\"escaped\\\": $r, \\\"detail\\\": \\\"seen: ${seen:-nothing}\\\"}\""),
              concurrent=True),
]  # fmt: skip
