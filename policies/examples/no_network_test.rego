package execgate.examples.no_network_test

import data.execgate
import data.execgate.examples.no_network
import data.execgate_test.base_input
import data.execgate_test.patched
import rego.v1

umbrella(patch) := execgate.view(patched(object.union({"tenant": {"id": "umbrella"}}, patch)), data.tenants)

test_offline_tenant_egress_refused if {
	no_network.denials(umbrella({"execution": {"egress": ["api.example.com:443"]}})) == {"tenant umbrella runs without network: egress to api.example.com:443 refused"}
}

test_offline_tenant_network_code_refused if {
	no_network.denials(umbrella({"analysis": {"features": ["network"]}})) == {"tenant umbrella runs without network: code that uses the network is refused"}
}

test_offline_tenant_plain_code_fine if {
	no_network.denials(umbrella({})) == set()
}

test_other_tenants_unaffected if {
	no_network.denials(execgate.view(patched({"analysis": {"features": ["network"]}}), data.tenants)) == set()
}

# Adopted as in the comment at the top of no_network.rego.
test_as_drop_in if {
	v := umbrella({"analysis": {"features": ["network"]}})
	d := execgate.assemble(v, execgate.denials(v) | no_network.denials(v), execgate.pending_approval_reasons(v))
	not d.allow
	d.deny == ["tenant umbrella runs without network: code that uses the network is refused"]
	execgate.decide(base_input).allow
}
