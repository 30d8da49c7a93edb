package execgate_test

import data.execgate
import rego.v1

test_request_within_ceiling_kept if {
	d := execgate.decide(base_input)
	d.obligations.timeout_s == 5
	d.obligations.memory_mb == 256
}

test_ceiling_applies_when_not_requested if {
	d := execgate.decide(base_input)
	d.obligations.cpus == 1.5
	d.obligations.pids == 64
	d.obligations.disk_mb == 64
	d.obligations.output_bytes == 1048576
}

test_request_above_ceiling_clamped_not_denied if {
	d := execgate.decide(patched({"execution": {"limits": {
		"timeout_s": 300, "memory_mb": 4096, "cpus": 8,
		"pids": 1000, "disk_mb": 1000, "output_bytes": 1073741824,
	}}}))
	d.allow
	d.obligations == {
		"timeout_s": 30, "memory_mb": 512, "cpus": 1.5, "pids": 64,
		"disk_mb": 64, "output_bytes": 1048576, "egress": [],
	}
}

# rego-cpp 1.5 orders numbers as text in min(); 9 < 10 must still win.
test_clamp_compares_numbers_not_text if {
	d := execgate.decide(patched({"execution": {"limits": {"pids": 9}}, "tenant": {"ceilings": {"pids": 10}}}))
	d.obligations.pids == 9
	e := execgate.decide(patched({"execution": {"limits": {"pids": 10}}, "tenant": {"ceilings": {"pids": 9}}}))
	e.obligations.pids == 9
}

test_fractional_limits_kept if {
	d := execgate.decide(patched({"execution": {"limits": {"cpus": 0.25, "timeout_s": 0.5}}}))
	d.obligations.cpus == 0.25
	d.obligations.timeout_s == 0.5
}

test_request_without_ceiling_kept if {
	d := execgate.decide(patched({"execution": {"limits": {"timeout_s": 7}}, "tenant": {"ceilings": {}}}))
	d.obligations == {"timeout_s": 7, "egress": []}
}

test_no_request_no_ceiling_no_obligation if {
	d := execgate.decide(patched({"execution": {"limits": {}}, "tenant": {"ceilings": {}}}))
	d.obligations == {"egress": []}
}

test_zero_limit_denied if {
	d := execgate.decide(patched({"execution": {"limits": {"timeout_s": 0}}}))
	not d.allow
	d.deny == ["limit timeout_s must be a positive number, got 0"]
	d.obligations.timeout_s == 30
}

test_negative_limit_denied if {
	d := execgate.decide(patched({"execution": {"limits": {"memory_mb": -1}}}))
	d.deny == ["limit memory_mb must be a positive number, got -1"]
}

test_non_numeric_limits_denied if {
	d := execgate.decide(patched({"execution": {"limits": {"pids": "64", "cpus": true, "disk_mb": null}}}))
	d.deny == [
		"limit cpus must be a positive number, got true",
		"limit disk_mb must be a positive number, got null",
		"limit pids must be a positive number, got 64",
	]
}

test_unknown_limit_denied if {
	d := execgate.decide(patched({"execution": {"limits": {"gpus": 1}}}))
	d.deny == ["unknown limit gpus"]
}

test_nonsensical_ceiling_ignored if {
	d := execgate.decide(patched({"execution": {"limits": {"timeout_s": 5}}, "tenant": {"ceilings": {"timeout_s": 0, "pids": "x"}}}))
	d.obligations == {"timeout_s": 5, "egress": []}
}

test_tier_ceiling_applies if {
	d := execgate.decide(patched({
		"subject": {"claims": {"tier": "free"}},
		"execution": {"limits": {"timeout_s": 25, "memory_mb": 256}},
	}))
	d.allow
	d.obligations.timeout_s == 10
	d.obligations.memory_mb == 128
}

test_tier_cannot_raise_the_gateway_ceiling if {
	d := execgate.decide(patched({"subject": {"claims": {"tier": "pro"}}, "execution": {"limits": {"memory_mb": 4096}}}))
	d.obligations.memory_mb == 512
}

test_unknown_or_odd_tier_has_no_ceiling if {
	d := execgate.decide(patched({"subject": {"claims": {"tier": "platinum"}}}))
	d.obligations.memory_mb == 256
	e := execgate.decide(patched({"subject": {"claims": {"tier": 3}}}))
	e.obligations.memory_mb == 256
	f := execgate.decide(patched({"subject": {"claims": "free"}}))
	f.obligations.memory_mb == 256
}

test_lowest_of_three_ceilings_wins if {
	tenants := {"default": data.tenants["default"], "acme": {"ceilings": {"pids": 32, "cpus": 2}, "tiers": {"t": {"pids": 16, "disk_mb": 100}}}}
	d := execgate.decide_with(patched({"subject": {"claims": {"tier": "t"}}, "execution": {"limits": {}}}), tenants)
	d.obligations.pids == 16
	d.obligations.cpus == 1.5
	d.obligations.disk_mb == 64
}

test_limits_not_an_object_denied if {
	d := execgate.decide(object.union(object.remove(base_input, ["execution"]), {"execution": object.union(object.remove(base_input.execution, ["limits"]), {"limits": "lots"})}))
	d.deny == ["limits must be an object, got lots"]
}
