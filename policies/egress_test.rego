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
	d := execgate.decide(patched({"execution": {"egress": ["api.example.com:443", "x.example.org:443"]}}))
	d.deny == [
		"network egress to api.example.com:443 needs scope net:egress",
		"network egress to x.example.org:443 needs scope net:egress",
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
	d := execgate.decide_with(
		patched({"execution": {"egress": ["h:1", "h:65535"]}, "subject": {"scopes": with_net}}),
		{"acme": {"egress_allowlist": ["*"]}, "default": data.tenants["default"]},
	)
	d.allow
}

test_destination_not_on_allowlist_denied if {
	d := execgate.decide(patched({
		"execution": {"egress": ["api.example.com:443", "evil.example:443", "api.example.com:80"]},
		"subject": {"scopes": with_net},
	}))
	not d.allow
	d.deny == [
		"network egress to api.example.com:80 is not on the allowlist of tenant acme",
		"network egress to evil.example:443 is not on the allowlist of tenant acme",
	]
	d.obligations.egress == []
}

test_wildcard_entry_matches_subdomains_only if {
	allowlist := ["*.example.org:443"]
	execgate.allowlisted("a.example.org:443", allowlist)
	execgate.allowlisted("A.B.Example.ORG:443", allowlist)
	not execgate.allowlisted("example.org:443", allowlist)
	not execgate.allowlisted("badexample.org:443", allowlist)
	not execgate.allowlisted("a.example.org:4430", allowlist)
}

test_star_allows_anything_well_formed if {
	execgate.allowlisted("anything.example:1", ["*"])
	not execgate.allowlisted("anything.example:1", [])
	not execgate.allowlisted("anything.example:1", [7, null])
}

test_tenant_without_allowlist_gets_no_egress if {
	d := execgate.decide(patched({
		"tenant": {"id": "unlisted"},
		"execution": {"egress": ["api.example.com:443"]},
		"subject": {"scopes": with_net},
	}))
	d.deny == ["network egress to api.example.com:443 is not on the allowlist of tenant unlisted"]
}

test_names_patterns_never_allow_literals if {
	not execgate.allowlisted("127.0.0.1:8080", ["*"])
	not execgate.allowlisted("[::1]:8080", ["*"])
	not execgate.allowlisted("10.0.0.0/8:443", ["*"])
	not execgate.allowlisted("10.0.0.1:80", ["*.0.0.1:80"])
	execgate.allowlisted("10.0.0.1:8080", ["*", "10.0.0.1:8080"])
	execgate.allowlisted("10.0.0.0/8:443", ["10.0.0.0/8:443"])
	execgate.allowlisted("[fd00::/8]:443", ["[FD00::/8]:443"])
	not execgate.allowlisted("10.0.0.2:8080", ["10.0.0.1:8080", "10.0.0.0/8:8080"])
}

test_cidr_destinations_are_well_formed if {
	d := execgate.decide_with(
		patched({
			"execution": {"egress": ["10.0.0.0/8:443", "[fd00::/8]:443", "[::1]:8080"]},
			"subject": {"scopes": with_net},
		}),
		{
			"acme": {"egress_allowlist": ["10.0.0.0/8:443", "[fd00::/8]:443", "[::1]:8080"]},
			"default": data.tenants["default"],
		},
	)
	d.allow
	d.obligations.egress == ["10.0.0.0/8:443", "[fd00::/8]:443", "[::1]:8080"]
}
