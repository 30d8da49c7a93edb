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
