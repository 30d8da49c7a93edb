package execgate_test

import data.execgate
import rego.v1

test_no_backend_obligation_by_default if {
	d := execgate.decide(base_input)
	not d.obligations.backend
}

test_tenant_backend_becomes_obligation if {
	d := execgate.decide_with(base_input, {"default": data.tenants["default"], "acme": {"backend": "docker-gvisor"}})
	d.obligations.backend == "docker-gvisor"
}

test_malformed_backend_ignored if {
	d := execgate.decide_with(base_input, {"default": data.tenants["default"], "acme": {"backend": 7}})
	not d.obligations.backend
}
