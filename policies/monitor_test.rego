package execgate_test

import data.execgate
import rego.v1

test_dynamic_code_monitored_not_enforced if {
	d := execgate.decide(patched({"analysis": {"calls": ["eval"], "features": ["dynamic_code"]}}))
	d.allow
	d.monitor == ["would deny under draft rule: dynamic_code"]
}

test_unparsed_code_monitored if {
	d := execgate.decide(patched({"analysis": {"parsed": false}}))
	d.allow
	d.monitor == ["code could not be analysed (analysis.parsed is false)"]
}

test_nothing_to_monitor if {
	d := execgate.decide(base_input)
	d.monitor == []
}

test_network_without_egress_monitored if {
	d := execgate.decide(patched({"analysis": {"features": ["network"]}}))
	d.allow
	d.monitor == ["code uses the network but asked for no egress: its connections will fail"]
}

test_tenant_monitor_features if {
	d := execgate.decide(patched({"tenant": {"id": "initech"}, "analysis": {"features": ["filesystem_write", "dynamic_code"]}}))
	d.allow
	d.monitor == ["would deny under draft rule: dynamic_code", "would deny under draft rule: filesystem_write"]
}
