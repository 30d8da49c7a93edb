# Network egress: only with scope net:egress, only to well-formed destinations
# on the tenant's allowlist.
package execgate

import rego.v1

egress_denials(v) := ({msg |
	not v.scopes["net:egress"]
	some dest in v.egress
	msg := concat("", ["network egress to ", text(dest), " needs scope net:egress"])
} | {msg |
	some dest in v.egress
	not valid_destination(dest)
	msg := concat("", ["network egress destination ", text(dest), " is not host:port"])
}) | {msg |
	some dest in v.egress
	valid_destination(dest)
	not allowlisted(dest, v.config.egress_allowlist)
	msg := concat("", ["network egress to ", dest, " is not on the allowlist of tenant ", text(v.tenant)])
}

# host:port with a DNS name, an IPv4 address or CIDR range, or [v6 address or range];
# port 1-65535.
valid_destination(dest) if {
	is_string(dest)
	regex.match(`^([A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*|[0-9]{1,3}(\.[0-9]{1,3}){3}/[0-9]{1,2}|\[[0-9A-Fa-f:.]+(/[0-9]{1,3})?\]):[0-9]{1,5}$`, dest)
	parts := split(dest, ":")
	port := to_number(parts[count(parts) - 1])
	port >= 1
	port <= 65535
}

# "*" allows any name; "*.example.org:443" any name below example.org on port 443
# (not example.org itself); anything else must match exactly. An IP literal or CIDR
# destination only ever matches itself: the egress proxy lets names reach no internal
# address, so writing the literal on the allowlist is the deliberate way in.
# Destinations compare case-insensitively.
allowlisted(dest, allowlist) if {
	some entry in allowlist
	allowlist_match(lower(dest), entry)
}

allowlist_match(dest, entry) if {
	entry == "*"
	not literal_destination(dest)
}

allowlist_match(dest, entry) if {
	is_string(entry)
	dest == lower(entry)
}

allowlist_match(dest, entry) if {
	is_string(entry)
	startswith(entry, "*.")
	not literal_destination(dest)
	endswith(dest, lower(trim_prefix(entry, "*")))
}

literal_destination(dest) if regex.match(`^([0-9]{1,3}(\.[0-9]{1,3}){3}(/[0-9]{1,2})?|\[[0-9A-Fa-f:.]+(/[0-9]{1,3})?\]):[0-9]{1,5}$`, dest)

# Exactly what was asked for once it is allowed: the sandbox reaches these
# destinations through the gateway's path and nothing else. Otherwise none.
egress_obligation(v, deny) := v.egress if {
	count(deny) == 0
} else := []
