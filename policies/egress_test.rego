package execgate_test

import data.execgate
import rego.v1

with_net := array.concat(base_input.subject.scopes, ["net:egress"])

test_no_egress_obligation_is_empty if {
	d := execgate.decide(base_input)
	d.obligations.egress == []
}

test_egress_without_scope_denied if {
	d := execgate.decide(patched({"execution": {"egress": ["api.example.com:443"]}}))
	not d.allow
	d.deny == ["network egress to api.example.com:443 needs scope net:egress"]
	d.obligations.egress == []
}

test_egress_with_scope_allowed if {
	d := execgate.decide(patched({
		"execution": {"egress": ["api.example.com:443", "10.0.0.1:8080", "[2001:db8::1]:53"]},
		"subject": {"scopes": with_net},
	}))
	d.allow
	d.obligations.egress == ["api.example.com:443", "10.0.0.1:8080", "[2001:db8::1]:53"]
}

test_each_destination_named if {
	d := execgate.decide(patched({"execution": {"egress": ["a.example:1", "b.example:2"]}}))
	d.deny == [
		"network egress to a.example:1 needs scope net:egress",
		"network egress to b.example:2 needs scope net:egress",
	]
}

test_malformed_destinations_denied if {
	d := execgate.decide(patched({
		"execution": {"egress": ["api.example.com", "h:0", "h:65536", "h:x", ":80", "a b:1", 443]},
		"subject": {"scopes": with_net},
	}))
	not d.allow
	d.deny == [
		"network egress destination 443 is not host:port",
		"network egress destination :80 is not host:port",
		"network egress destination a b:1 is not host:port",
		"network egress destination api.example.com is not host:port",
		"network egress destination h:0 is not host:port",
		"network egress destination h:65536 is not host:port",
		"network egress destination h:x is not host:port",
	]
	d.obligations.egress == []
}

test_port_bounds_accepted if {
	d := execgate.decide(patched({
		"execution": {"egress": ["h:1", "h:65535"]},
		"subject": {"scopes": with_net},
	}))
	d.allow
}
