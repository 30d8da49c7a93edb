package execgate_test

import data.execgate
import rego.v1

review_input(behaviour, network) := {
	"version": "execgate.review/v1",
	"execution": {"id": "exe_1", "language": "python", "backend": "nsjail", "status": "ok", "exit_code": 0},
	"subject": {"sub": "agent", "tenant": "acme"},
	"behaviour": behaviour,
	"network": network,
}

empty_behaviour := {"capture": "on", "files": [], "programs": [], "signals": [], "syscalls_refused": {}, "dropped": 0}

rules_of(r) := [f.rule | some f in r.flags]

test_nothing_tried_nothing_flagged if {
	execgate.review_of(review_input(empty_behaviour, [])) == {"flags": []}
}

test_capture_off_nothing_flagged if {
	execgate.review_of(review_input({"capture": "off", "reason": "no tracer"}, [])) == {"flags": []}
}

test_credential_paths_flagged_high if {
	paths := ["/etc/shadow", "/root/.bashrc", "/home/u/.ssh/id_rsa", "/proc/1/environ", "/proc/self/environ", "/w/.aws/credentials", "/var/run/secrets/kubernetes.io/serviceaccount/token"]
	every path in paths {
		r := execgate.review_of(review_input(object.union(empty_behaviour, {"files": [{"op": "open", "path": path, "result": "ENOENT", "count": 1}]}), []))
		r.flags[0].rule == "credential_path"
		r.flags[0].severity == "high"
	}
}

test_ordinary_files_not_flagged if {
	b := object.union(empty_behaviour, {"files": [
		{"op": "create", "path": "/workspace/out.txt", "result": "ok", "count": 1},
		{"op": "open", "path": "missing.csv", "result": "ENOENT", "count": 1},
	]})
	execgate.review_of(review_input(b, [])) == {"flags": []}
}

test_privileged_syscalls_flagged if {
	b := object.union(empty_behaviour, {"syscalls_refused": {"mount": 2, "getrandom": 1}})
	r := execgate.review_of(review_input(b, []))
	r.flags == [{"rule": "privileged_syscall", "severity": "high", "detail": "refused mount x2"}]
}

test_signals_at_other_processes_flagged if {
	b := object.union(empty_behaviour, {"signals": [
		{"syscall": "kill", "target": 1, "signal": 9, "result": "EPERM", "count": 1},
		{"syscall": "ptrace", "target": 7, "signal": 16, "result": "ok", "count": 1},
		{"syscall": "process_vm_readv", "target": 8, "signal": 0, "result": "ok", "count": 1},
		{"syscall": "kill", "target": 12, "signal": 15, "result": "ESRCH", "count": 1},
		{"syscall": "kill", "target": 12, "signal": 15, "result": "ok", "count": 1},
	]})
	r := execgate.review_of(review_input(b, []))
	count(r.flags) == 4
	rules_of(r) == ["process_attack", "process_attack", "process_attack", "process_attack"]
}

test_shell_from_python_flagged_low_not_from_bash if {
	b := object.union(empty_behaviour, {"programs": [{"path": "/bin/sh", "argv": ["sh", "-c", "id"], "result": "ok", "count": 1}]})
	execgate.review_of(review_input(b, [])).flags == [{"rule": "shell_spawned", "severity": "low", "detail": "sh -c id"}]
	bash := object.union(review_input(b, []), {"execution": {"language": "bash"}})
	execgate.review_of(bash) == {"flags": []}
}

test_refused_program_flagged if {
	b := object.union(empty_behaviour, {"programs": [{"path": "/usr/bin/nmap", "argv": ["nmap"], "result": "ENOENT", "count": 1}]})
	rules_of(execgate.review_of(review_input(b, []))) == ["program_refused"]
}

test_blocked_egress_flagged_allowed_not if {
	network := [
		{"kind": "connect", "host": "10.0.0.1", "port": 80, "verdict": "blocked", "rule": "internal_address"},
		{"kind": "connect", "host": "pypi.org", "port": 443, "verdict": "allowed", "rule": "pypi.org:443"},
	]
	r := execgate.review_of(review_input(empty_behaviour, network))
	r.flags == [{"rule": "egress_blocked", "severity": "medium", "detail": "10.0.0.1:80 (internal_address)"}]
}

test_overflow_flagged if {
	b := object.union(empty_behaviour, {"dropped": 12})
	execgate.review_of(review_input(b, [])).flags[0].rule == "record_overflow"
}

test_flags_high_first if {
	b := object.union(empty_behaviour, {
		"programs": [{"path": "/bin/bash", "argv": ["bash"], "result": "ok", "count": 1}],
		"files": [{"op": "open", "path": "/etc/shadow", "result": "EACCES", "count": 1}],
		"dropped": 1,
	})
	rules_of(execgate.review_of(review_input(b, []))) == ["credential_path", "record_overflow", "shell_spawned"]
}

test_other_architectures_flagged if {
	b := object.union(empty_behaviour, {"syscalls_refused": {"x32 unshare": 1, "i386 open": 3, "getrandom": 1}})
	r := execgate.review_of(review_input(b, []))
	r.flags == [
		{"rule": "architecture_bypass", "severity": "high", "detail": "refused i386 open x3"},
		{"rule": "architecture_bypass", "severity": "high", "detail": "refused x32 unshare x1"},
	]
}

test_runtime_sockets_flagged if {
	b := object.union(empty_behaviour, {"files": [
		{"op": "connect", "path": "/var/run/docker.sock", "result": "ENOENT", "count": 1},
		{"op": "connect", "path": "/run/containerd/containerd.sock", "result": "ENOENT", "count": 1},
		{"op": "connect", "path": "/workspace/app.sock", "result": "ECONNREFUSED", "count": 1},
		{"op": "stat", "path": "/var/run/docker.sock", "result": "ENOENT", "count": 1},
	]})
	r := execgate.review_of(review_input(b, []))
	rules_of(r) == ["runtime_socket", "runtime_socket"]
	r.flags[0].detail == "connect /run/containerd/containerd.sock: ENOENT"
}

test_ipc_probes_flagged if {
	b := object.union(empty_behaviour, {"files": [
		{"op": "ipc", "path": "shm:0x0000c0de", "result": "ENOENT", "count": 1},
		{"op": "ipc", "path": "msg:0x0000c0df", "result": "EACCES", "count": 1},
		{"op": "ipc", "path": "sem:0x0000c0e0", "result": "ok", "count": 1},
	]})
	r := execgate.review_of(review_input(b, []))
	rules_of(r) == ["ipc_probe", "ipc_probe"]
	r.flags[0].severity == "medium"
}
