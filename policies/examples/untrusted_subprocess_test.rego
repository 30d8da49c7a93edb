package execgate.examples.untrusted_subprocess_test

import data.execgate
import data.execgate.examples.untrusted_subprocess
import data.execgate_test.patched
import rego.v1

view(claims, analysis) := execgate.view(patched({"subject": {"claims": claims}, "analysis": analysis}), data.tenants)

untrusted := {"sub": "agent-9", "trust": "untrusted"}

test_untrusted_subprocess_feature_denied if {
	untrusted_subprocess.denials(view(untrusted, {"features": ["subprocess"]})) == {"untrusted agent agent-9 may not start subprocesses"}
}

test_untrusted_subprocess_import_denied if {
	untrusted_subprocess.denials(view(untrusted, {"imports": ["subprocess"], "features": []})) == {"untrusted agent agent-9 may not start subprocesses"}
}

test_untrusted_plain_code_fine if {
	untrusted_subprocess.denials(view(untrusted, {"imports": ["os"], "features": []})) == set()
}

test_trusted_or_unmarked_agents_fine if {
	untrusted_subprocess.denials(view({"trust": "trusted"}, {"features": ["subprocess"]})) == set()
	untrusted_subprocess.denials(view({}, {"features": ["subprocess"]})) == set()
}

test_as_drop_in if {
	v := view(untrusted, {"features": ["subprocess"]})
	d := execgate.assemble(v, execgate.denials(v) | untrusted_subprocess.denials(v), execgate.pending_approval_reasons(v))
	d.deny == ["untrusted agent agent-9 may not start subprocesses"]
}
