#!/usr/bin/env bash
# Start a Docker engine fit for execgate's `docker` and `docker-gvisor` backends, as root.
#
#   deploy/docker/start-dockerd.sh          # idempotent: reuses a running engine
#
# - registers gVisor's runsc as the runtime "runsc" (and "runsc-egress", runsc's own
#   netstack on links the gateway provides), with --network=none in its runtime
#   args (runsc refuses Docker's `none` network otherwise) and --oci-seccomp (without
#   it runsc ignores the container's seccomp profile: found by the escape suite), merged into
#   /etc/docker/daemon.json without touching the other keys; both run runsc through
#   deploy/docker/runsc-safe (runsc's `delete` would SIGKILL reused pids); and the two
#   again with gVisor's strace as "runsc-capture" and "runsc-egress-capture" (behaviour
#   capture: deploy/docker/runsc-capture; each container's trace under
#   $EXECGATE_GVISOR_TRACE_DIR of the engine's environment, default
#   /run/execgate-gvisor-trace);
# - starts dockerd in the background with no bridge and no iptables rules: sandboxes
#   have no network at all, so the engine needs none, and the host firewall is left as
#   it is; its log goes to $EXECGATE_DOCKERD_LOG (default /var/log/execgate-dockerd.log);
# - waits until `docker info` answers (at most $EXECGATE_DOCKERD_WAIT_S, default 60 s).
#
# An engine that is already running only has its configuration reloaded (SIGHUP:
# runtimes are reloadable), so a developer's own dockerd keeps its other settings.
set -euo pipefail

LOG=${EXECGATE_DOCKERD_LOG:-/var/log/execgate-dockerd.log}
WAIT_S=${EXECGATE_DOCKERD_WAIT_S:-60}
CONFIG=${EXECGATE_DOCKERD_CONFIG:-/etc/docker/daemon.json}

command -v dockerd >/dev/null || { echo "dockerd not found: apt-get install docker.io" >&2; exit 1; }
RUNSC=$(command -v runsc || true)

changed=0
if [ -n "$RUNSC" ]; then
  mkdir -p "$(dirname "$CONFIG")"
  # Merge: keep every key the file has, set only our runtimes (runsc, runsc-egress and
  # their capture variants).
  HERE="$(cd "$(dirname "$0")" && pwd)"
  changed=$(python3 - "$CONFIG" "$HERE/runsc-safe" "$HERE/runsc-egress" "$HERE/runsc-capture" \
    "$HERE/runsc-egress-capture" <<'EOF'
import json, os, sys
path, runsc, wrapper, capture, egress_capture = sys.argv[1:6]
# Behaviour capture (backends/capture/gvisor.py): the Sentry's strace of these calls,
# into a debug log per container (runsc-capture); the list is the backend's TRACED.
STRACE = [
    "--strace",
    "--strace-syscalls=open,openat,creat,rename,renameat,renameat2,unlink,unlinkat,mkdir,"
    "mkdirat,rmdir,link,linkat,symlink,symlinkat,truncate,execve,execveat,kill,tkill,"
    "tgkill,ptrace,process_vm_readv,process_vm_writev,pidfd_send_signal,"
    "rt_sigqueueinfo,rt_tgsigqueueinfo,chdir,fchdir,stat,lstat,newfstatat,statx,access,"
    "faccessat,readlink,readlinkat,connect,chmod,fchmodat,chown,lchown,fchownat,mknod,mknodat,"
    "shmget,msgget,semget",
    "--strace-log-size=64",
    "--debug",
]
try:
    with open(path) as f:
        config = json.load(f)
except FileNotFoundError:
    config = {}
want = {
    # runsc-safe runs the installed runsc (EXECGATE_RUNSC, default /usr/bin/runsc).
    "runsc": {"path": runsc, "runtimeArgs": ["--network=none", "--oci-seccomp"]},
    # Controlled egress (backends/egress/veth.py): runsc's netstack takes over the
    # links of a namespace the gateway made (deploy/docker/runsc-netns puts it in the spec).
    "runsc-egress": {"path": wrapper, "runtimeArgs": ["--oci-seccomp"]},
    # The same two with capture (backends/docker/gvisor.py uses them when it records).
    "runsc-capture": {"path": capture, "runtimeArgs": ["--network=none", "--oci-seccomp", *STRACE]},
    "runsc-egress-capture": {"path": egress_capture, "runtimeArgs": ["--oci-seccomp", *STRACE]},
}
runtimes = config.get("runtimes", {})
if all(runtimes.get(name) == value for name, value in want.items()):
    print(0)
else:
    config.setdefault("runtimes", {}).update(want)
    tmp = path + ".execgate-tmp"
    with open(tmp, "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)
    print(1)
EOF
)
else
  echo "runsc not found (apt-get install runsc): the docker-gvisor backend will refuse to start" >&2
fi

if docker info >/dev/null 2>&1; then
  if [ "$changed" = 1 ]; then
    echo "dockerd is running: reloading its configuration ($CONFIG)"
    kill -HUP "$(cat /var/run/docker.pid)"
    sleep 1
  fi
else
  echo "starting dockerd (log: $LOG)"
  mkdir -p "$(dirname "$LOG")"
  # setsid + nohup: the engine outlives this script (and CI's shell).
  setsid nohup dockerd --bridge=none --iptables=false --ip-masq=false \
    --config-file "$CONFIG" >>"$LOG" 2>&1 </dev/null &
  for _ in $(seq "$((WAIT_S * 4))"); do
    docker info >/dev/null 2>&1 && break
    sleep 0.25
  done
  if ! docker info >/dev/null 2>&1; then
    echo "dockerd did not answer within ${WAIT_S}s; last lines of $LOG:" >&2
    tail -20 "$LOG" >&2
    exit 1
  fi
fi
docker info --format 'docker {{.ServerVersion}}, runtimes: {{range $k, $v := .Runtimes}}{{$k}} {{end}}, cgroup v{{.CgroupVersion}}'
