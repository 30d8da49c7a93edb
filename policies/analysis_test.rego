package execgate_test

import data.execgate
import rego.v1

test_blocked_import_denied_with_reason if {
	d := execgate.decide(patched({"tenant": {"id": "initech"}, "analysis": {"imports": ["os", "socket"]}}))
	not d.allow
	d.deny == ["python code for tenant initech imports socket, which the tenant's policy blocks"]
}

test_import_blocked_elsewhere_is_fine_here if {
	d := execgate.decide(patched({"analysis": {"imports": ["socket"]}}))
	d.allow
}
