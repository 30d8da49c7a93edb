package execgate.examples.memory_by_tier_test

import data.execgate
import data.execgate.examples.memory_by_tier
import data.execgate_test.patched
import rego.v1

memory(claims, limits) := memory_by_tier.obligations(v, execgate.limit_obligations(v)).memory_mb if {
	v := execgate.view(patched({"subject": {"claims": claims}, "execution": {"limits": limits}}), {"default": data.tenants["default"]})
}

test_tier_lowers_memory if {
	memory({"tier": "free"}, {"memory_mb": 256}) == 128
}

test_tier_never_raises_memory if {
	memory({"tier": "pro"}, {"memory_mb": 256}) == 256
	memory({"tier": "pro"}, {}) == 512
}

test_unknown_tier_gets_the_smallest if {
	memory({"tier": "gold"}, {}) == 128
	memory({}, {}) == 128
	memory({"tier": 5}, {}) == 128
}

test_other_obligations_kept if {
	v := execgate.view(patched({}), {"default": data.tenants["default"]})
	o := memory_by_tier.obligations(v, execgate.limit_obligations(v))
	o.timeout_s == 5
	o.pids == 64
}
