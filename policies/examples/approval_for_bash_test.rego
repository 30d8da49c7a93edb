package execgate.examples.approval_for_bash_test

import data.execgate
import data.execgate.examples.approval_for_bash
import data.execgate_test.patched
import rego.v1

view(patch) := execgate.view(patched(patch), data.tenants)

test_bash_needs_approval if {
	approval_for_bash.approval_reasons(view({"execution": {"language": "bash"}})) == {"bash code for tenant acme needs a human's approval"}
}

test_python_does_not if {
	approval_for_bash.approval_reasons(view({})) == set()
}

test_as_drop_in if {
	v := view({"execution": {"language": "bash"}})
	d := execgate.assemble(v, execgate.denials(v), execgate.pending_approval_reasons(v) | approval_for_bash.approval_reasons(v))
	not d.allow
	d.require_approval
	d.approval == {"reason": "bash code for tenant acme needs a human's approval", "ttl_s": 900}
}
