package execgate_test

import data.execgate
import rego.v1

test_typical_allow_is_complete if {
	execgate.decide(base_input) == {
		"allow": true,
		"deny": [],
		"require_approval": false,
		"obligations": {
			"timeout_s": 5, "memory_mb": 256, "cpus": 1.5, "pids": 64,
			"disk_mb": 64, "output_bytes": 1048576, "egress": [],
		},
		"monitor": [],
	}
}

test_deny_reasons_are_sorted_and_complete if {
	d := execgate.decide(patched({"execution": {"language": "ruby", "egress": ["x.example:1"], "limits": {"pids": 0}}}))
	d.allow == false
	d.deny == [
		"language ruby is not allowed for tenant acme",
		"limit pids must be a positive number, got 0",
		"network egress to x.example:1 is not on the allowlist of tenant acme",
		"network egress to x.example:1 needs scope net:egress",
		"subject lacks scope exec:ruby",
	]
}

test_wrong_input_version_denied if {
	d := execgate.decide(object.union(base_input, {"version": "execgate.input/v2"}))
	d.deny == ["unsupported input version execgate.input/v2 (expected execgate.input/v1)"]
}

test_missing_input_version_denied if {
	d := execgate.decide(object.remove(base_input, ["version"]))
	d.deny == ["unsupported input version null (expected execgate.input/v1)"]
}

test_empty_input_denied_not_undefined if {
	d := execgate.decide({})
	d.allow == false
	count(d.deny) > 0
	d.obligations == {"egress": []}
}

test_decision_keys_without_approval if {
	object.keys(execgate.decide(base_input)) == {"allow", "deny", "require_approval", "obligations", "monitor"}
}

test_decision_keys_with_approval if {
	d := execgate.decide(patched({"analysis": {"features": ["native_code"]}}))
	object.keys(d) == {"allow", "deny", "require_approval", "approval", "obligations", "monitor"}
}
