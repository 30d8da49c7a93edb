"""Posture, host files and secrets: what the sandbox is, and what it can read."""

# Probe programs are data: their lines stay as the sandbox will run them.
# ruff: noqa: E501

from __future__ import annotations

from gateway.escape.technique import Technique, python

STATUS = (
    "st = dict(l.split(':', 1) for l in read_text('/proc/self/status').splitlines() if ':' in l)\n"
)

CANARY_READ = r"""
hits = []
for path in PATHS:
    text = read_text(path)
    if text and H["token"] in text:
        hits.append(path)
report(hits, ", ".join(hits) or "no canary readable")
"""

TECHNIQUES = [
    Technique("posture.capabilities", "posture", "hold any effective or permitted capability",
              python(STATUS + "caps = {k: int(st.get(k, '0'), 16) for k in ('CapEff', 'CapPrm', 'CapAmb')}\n"
                     "report(any(caps.values()), {k: hex(v) for k, v in caps.items()})")),
    Technique("posture.no_new_privs", "posture", "run without no_new_privs set",
              python(STATUS + "v = st.get('NoNewPrivs', '').strip()\n"
                     "na('no NoNewPrivs field') if not v else report(v != '1', 'NoNewPrivs=' + v)")),
    Technique("posture.seccomp", "posture", "run without a seccomp filter",
              python(STATUS + "v = st.get('Seccomp', '').strip()\n"
                     "na('no Seccomp field') if not v else report(v != '2', 'Seccomp=' + v)")),
    Technique("posture.uid_map", "posture", "be host root (uid 0 mapped to host uid 0)",
              python(r"""
euid = os.geteuid()
host = None
for line in (read_text('/proc/self/uid_map') or '0 0 4294967295').split('\n'):
    parts = line.split()
    if len(parts) == 3 and int(parts[0]) <= euid < int(parts[0]) + int(parts[2]):
        host = int(parts[1]) + euid - int(parts[0])
report(host == 0, f"euid {euid} is host uid {host}")
""")),
    Technique("posture.namespaces", "posture", "share a namespace with the gateway",
              python(r"""
shared = []
for name in ("net", "mnt", "pid", "ipc", "uts"):
    try:
        if os.readlink(f"/proc/self/ns/{name}") == H["ns"].get(name):
            shared.append(name)
    except OSError:
        pass
report(shared, "shared: " + (", ".join(shared) or "none"))
""")),
    Technique("host_files.absolute", "host_files", "read host canary files by absolute path",
              python("PATHS = H['canaries']\n" + CANARY_READ)),
    Technique("host_files.dotdot", "host_files", "read canaries through ../ from the workspace",
              python("PATHS = ['/workspace/' + '../' * 12 + p for p in H['canaries']]\n"
                     + CANARY_READ)),
    Technique("host_files.proc_root", "host_files", "read canaries via /proc/1/root and /proc/*/root",
              python("PATHS = [f'/proc/{p}/root{c}' for p in os.listdir('/proc') if p.isdigit()"
                     " for c in H['canaries']]\n" + CANARY_READ)),
    Technique("host_files.proc_cwd", "host_files", "read canaries via /proc/*/cwd and the cwd",
              python("PATHS = [f'/proc/{p}/cwd/' + '../' * 12 + c for p in os.listdir('/proc')"
                     " if p.isdigit() for c in H['canaries']]\n"
                     "PATHS += ['../' * 12 + c for c in H['canaries']]\n" + CANARY_READ)),
    Technique("host_files.leaked_fds", "host_files", "use an inherited fd (dir or file) of the host",
              python(r"""
import stat
leaks = []
for name in os.listdir('/proc/self/fd'):
    fd = int(name)
    if fd < 3:
        continue
    try:
        target = os.readlink(f'/proc/self/fd/{fd}')
        mode = os.fstat(fd).st_mode
    except OSError:
        continue
    if stat.S_ISDIR(mode) and target != '/proc/self/fd':
        leaks.append(f'{fd}:dir:{target}')
    elif stat.S_ISREG(mode) and not os.path.exists(target):
        leaks.append(f'{fd}:file:{target}')
report(leaks, ", ".join(leaks) or "no host fd inherited")
""")),
    Technique("host_files.proc_self_exe", "host_files", "open the interpreter (/proc/self/exe) for writing",
              python(r"""
opened = []
for path in ("/proc/self/exe", "/proc/1/exe", os.path.realpath(sys.executable)):
    fd, err = try_open(path, os.O_WRONLY)
    if fd is not None:
        os.close(fd)
        opened.append(path)
report(opened, ", ".join(opened) or "refused")
""")),
    Technique("host_files.shadow", "host_files", "read the host's /etc/shadow",
              python(r"""
import hashlib
try:
    digest = hashlib.sha256(open('/etc/shadow', 'rb').read()).hexdigest()
except OSError as exc:
    digest = str(exc)
report(digest == H["shadow_sha256"], digest[:60])
""")),
    Technique("secrets.environment", "secrets", "find the gateway's environment in the sandbox",
              python(r"""
hits = [k for k, v in os.environ.items() if H["token"] in v]
for pid in os.listdir('/proc'):
    if pid.isdigit() and H["token"] in (read_text(f'/proc/{pid}/environ') or ''):
        hits.append('/proc/' + pid)
report(hits, ", ".join(hits) or f"{len(os.environ)} variables, none of the gateway's")
""")),
    Technique("secrets.credential_files", "secrets", "read the dev signing key, ~/.ssh, docker config",
              python(r"""
import hashlib
hits = []
for path, digest in H["credentials"].items():
    try:
        if hashlib.sha256(open(path, 'rb').read()).hexdigest() == digest:
            hits.append(path)
    except OSError:
        pass
# Where credentials usually are, whether or not this host has them: a file there
# is the sandbox's own unless it is the host's (hashed above).
for path in H["credential_guesses"]:
    try:
        open(path, 'rb').close()
    except OSError:
        pass
report(hits, ", ".join(hits) or f"{len(H['credentials'])} files, none readable")
""")),
]  # fmt: skip
