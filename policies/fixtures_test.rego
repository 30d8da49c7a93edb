# Inputs shared by the unit tests. No tests here.
#
# Tests call `execgate.decide(inp)` with literal inputs rather than evaluating
# `decision with input as ...`: rego-cpp 1.5 (the embedded engine) crashes or
# answers wrongly on `with input as`. They also patch inputs one level deep
# with `patched` rather than relying on object.union, which merges nested
# objects recursively in OPA but not in rego-cpp.
package execgate_test

import rego.v1

base_input := {
	"version": "execgate.input/v1",
	"request": {
		"id": "req_test",
		"time": "2026-11-29T10:00:00Z",
		"ingress": "rest",
		"tool_name": "run_code",
		"source_ip": "127.0.0.1",
	},
	"subject": {"sub": "svc:agent-7", "tenant": "acme", "scopes": ["exec:python", "exec:bash"], "claims": {}},
	"tenant": {
		"id": "acme",
		"ceilings": {
			"timeout_s": 30, "memory_mb": 512, "cpus": 1.5,
			"pids": 64, "disk_mb": 64, "output_bytes": 1048576,
		},
		"usage": {"concurrent": 1, "cpu_s_last_hour": 12.5},
		"languages": ["python", "bash"],
	},
	"execution": {
		"language": "python",
		"code": "print(sum(range(10)))",
		"code_sha256": "0f1e",
		"code_bytes": 21,
		"files": [],
		"limits": {"timeout_s": 5, "memory_mb": 256},
		"egress": [],
		"backend": "nsjail",
	},
	"analysis": {"parsed": true, "imports": [], "calls": ["print", "range", "sum"], "features": []},
	"approval": {"present": false},
}

# base_input with each section of `patch` merged into the same section of the
# base, one level deep: a key in the patch replaces that key of the section
# whole. (Keys are removed before each union so that no nested objects meet.)
patched(patch) := object.union(object.remove(base_input, object.keys(patch)), {section: merged |
	some section in object.keys(patch)
	merged := merge_section(object.get(base_input, section, null), patch[section])
})

merge_section(base, patch) := object.union(object.remove(base, object.keys(patch)), patch) if {
	is_object(base)
	is_object(patch)
} else := patch

# base_input without `key` in `section`.
without(section, key) := object.union(
	object.remove(base_input, [section]),
	{section: object.remove(base_input[section], [key])},
)
