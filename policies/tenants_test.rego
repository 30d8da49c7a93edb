package execgate_test

import data.execgate
import rego.v1

test_tenant_entry_overrides_default_key_by_key if {
	cfg := execgate.tenant_config({"default": {"languages": ["python"], "backend": "a"}, "t": {"backend": "b"}}, "t")
	cfg.languages == ["python"]
	cfg.backend == "b"
	cfg.egress_allowlist == []
	cfg.approval == {"features": [], "languages": []}
}

test_unlisted_tenant_takes_default if {
	cfg := execgate.tenant_config({"default": {"blocked_imports": ["socket"]}}, "nobody")
	cfg.blocked_imports == ["socket"]
}

test_no_data_at_all_is_most_restrictive if {
	d := execgate.decide_with(base_input, {})
	d.deny == ["language python is not allowed for tenant acme"]
}

test_shipped_data_narrows_initech if {
	d := execgate.decide(patched({
		"tenant": {"id": "initech"},
		"execution": {"limits": {"timeout_s": 25, "memory_mb": 512}},
	}))
	d.allow
	d.obligations.timeout_s == 20
	d.obligations.memory_mb == 256
	d.obligations.backend == "docker-gvisor"
}

test_policy_languages_narrow_the_gateways if {
	d := execgate.decide(patched({
		"tenant": {"id": "initech", "languages": ["python", "bash", "javascript"]},
		"execution": {"language": "javascript"},
		"subject": {"scopes": ["exec:javascript"]},
	}))
	d.deny == ["language javascript is not allowed for tenant initech"]
}
