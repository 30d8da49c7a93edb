# The second question, asked after an execution: `data.execgate.review` over what
# the code tried (its behaviour record and network attempts). It decides nothing
# (the code has run); what it flags goes to the audit log, the console and the
# review webhook, for a person to look at now rather than in a later audit.
#
# Input (built by gateway/stages/review.py): `version` ("execgate.review/v1"),
# `execution` {id, language, backend, status, exit_code}, `subject` {sub,
# tenant}, `behaviour` (the result's record: files, programs, signals,
# syscalls_refused, dropped, capture) and `network` (the result's attempts).
# Each flag is {"rule", "severity" (high, medium, low), "detail"}.
package execgate

import rego.v1

review := review_of(input)

review_of(inp) := {"flags": sort_flags(review_flags(inp))}

review_flags(inp) := (((((((credential_flags(inp) | privilege_flags(inp)) | architecture_flags(inp)) | socket_flags(inp)) | ipc_flags(inp)) | process_flags(inp)) | program_flags(inp)) | network_flags(inp)) | overflow_flags(inp)

# Paths whose reading is a credential grab, wherever the code found them.
credential_prefixes := [
	"/etc/shadow", "/etc/gshadow", "/etc/sudoers", "/root/", "/var/run/secrets/",
	"/run/secrets/", "/proc/1/", "/etc/ssh/",
]

credential_parts := [
	"/.ssh/", "id_rsa", "id_ed25519", "id_ecdsa", "/.aws/", "/.kube/", "/.docker/config",
	"/.gnupg/", "/.netrc", "/.git-credentials", "/.pgpass", "/environ",
]

credential_path(path) if {
	some prefix in credential_prefixes
	startswith(path, prefix)
}

credential_path(path) if {
	some part in credential_parts
	contains(path, part)
}

credential_flags(inp) := {flag |
	some f in object.get(inp, ["behaviour", "files"], [])
	credential_path(f.path)
	flag := {"rule": "credential_path", "severity": "high", "detail": concat("", [f.op, " ", f.path, ": ", f.result])}
}

# System calls that only an escape attempt or a privilege grab would make.
privileged_syscalls := {
	"mount", "umount2", "pivot_root", "chroot", "unshare", "setns", "ptrace", "bpf",
	"init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load",
	"keyctl", "add_key", "request_key", "open_by_handle_at", "perf_event_open",
	"process_vm_readv", "process_vm_writev", "userfaultfd", "reboot", "swapon",
	"swapoff", "setuid", "setgid", "setreuid", "setregid", "setresuid", "setresgid",
	"capset", "iopl", "ioperm", "syslog", "acct", "settimeofday", "clock_settime",
	"sethostname", "setdomainname", "fsopen", "fsmount", "move_mount", "open_tree",
}

privilege_flags(inp) := {flag |
	refused := object.get(inp, ["behaviour", "syscalls_refused"], {})
	some name in object.keys(refused)
	privileged_syscalls[name]
	n := refused[name]
	flag := {"rule": "privileged_syscall", "severity": "high", "detail": concat("", ["refused ", name, " x", format_int(n, 10)])}
}

# A call through another architecture's numbers (x32, or int 0x80's i386 table):
# ordinary code never does it; filter bypasses do.
architecture_flags(inp) := {flag |
	refused := object.get(inp, ["behaviour", "syscalls_refused"], {})
	some name in object.keys(refused)
	other_architecture(name)
	flag := {"rule": "architecture_bypass", "severity": "high", "detail": concat("", ["refused ", name, " x", format_int(refused[name], 10)])}
}

other_architecture(name) if startswith(name, "x32 ")

other_architecture(name) if startswith(name, "i386 ")

# A container runtime's or the gateway's own control socket: the way out of any
# container that can reach one.
runtime_sockets := ["docker.sock", "containerd.sock", "containerd/", "crio.sock", "podman.sock", "execgate/", "dockershim.sock"]

socket_flags(inp) := {flag |
	some f in object.get(inp, ["behaviour", "files"], [])
	f.op == "connect"
	some name in runtime_sockets
	contains(f.path, name)
	flag := {"rule": "runtime_socket", "severity": "high", "detail": concat("", ["connect ", f.path, ": ", f.result])}
}

# A SysV IPC object asked for by a key the code did not make (the get failed):
# looking for a neighbour's shared memory, queue or semaphores.
ipc_flags(inp) := {flag |
	some f in object.get(inp, ["behaviour", "files"], [])
	f.op == "ipc"
	f.result != "ok"
	flag := {"rule": "ipc_probe", "severity": "medium", "detail": concat("", ["ipc ", f.path, ": ", f.result])}
}

# Signals or tracing aimed at a process the code did not start (pid 1, or a
# refused attempt at any other).
process_flags(inp) := {flag |
	some s in object.get(inp, ["behaviour", "signals"], [])
	aimed_elsewhere(s)
	flag := {"rule": "process_attack", "severity": "high", "detail": concat("", [s.syscall, " pid ", format_int(s.target, 10), ": ", s.result])}
}

aimed_elsewhere(s) if s.syscall == "ptrace"

aimed_elsewhere(s) if startswith(s.syscall, "process_vm_")

aimed_elsewhere(s) if s.target == 1

aimed_elsewhere(s) if s.result != "ok"

shells := {"sh", "bash", "dash", "zsh", "ash", "ksh", "busybox"}

program_name(path) := name if {
	parts := split(path, "/")
	name := parts[count(parts) - 1]
}

# A shell or a program the runtime could not find: worth a look, rarely harmful.
program_flags(inp) := {flag |
	some p in object.get(inp, ["behaviour", "programs"], [])
	shells[program_name(p.path)]
	object.get(inp, ["execution", "language"], "") != "bash"
	flag := {"rule": "shell_spawned", "severity": "low", "detail": concat(" ", p.argv)}
} | {flag |
	some p in object.get(inp, ["behaviour", "programs"], [])
	p.result != "ok"
	flag := {"rule": "program_refused", "severity": "medium", "detail": concat("", [p.path, ": ", p.result])}
}

network_flags(inp) := {flag |
	some a in object.get(inp, "network", [])
	a.verdict == "blocked"
	flag := {"rule": "egress_blocked", "severity": "medium", "detail": concat("", [a.host, ":", format_int(a.port, 10), " (", a.rule, ")"])}
}

# A record that overflowed: the code made more attempts than the record keeps.
overflow_flags(inp) := {flag |
	n := object.get(inp, ["behaviour", "dropped"], 0)
	n > 0
	flag := {"rule": "record_overflow", "severity": "medium", "detail": concat("", [format_int(n, 10), " attempts beyond the record's caps"])}
}

severity_rank := {"high": 0, "medium": 1, "low": 2}

# High first, then by rule and detail: the order the console shows.
sort_flags(flags) := [f |
	some key in sort([[severity_rank[f.severity], f.rule, f.detail] | some f in flags])
	some f in flags
	[severity_rank[f.severity], f.rule, f.detail] == key
]
