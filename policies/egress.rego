# Network egress: only with scope net:egress, only to well-formed destinations.
package execgate

import rego.v1

egress_denials(v) := {msg |
	not v.scopes["net:egress"]
	some dest in v.egress
	msg := concat("", ["network egress to ", text(dest), " needs scope net:egress"])
} | {msg |
	some dest in v.egress
	not valid_destination(dest)
	msg := concat("", ["network egress destination ", text(dest), " is not host:port"])
}

# host:port with a DNS name or IPv4 host, or [v6]:port; port 1-65535.
valid_destination(dest) if {
	is_string(dest)
	regex.match(`^([A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*|\[[0-9A-Fa-f:.]+\]):[0-9]{1,5}$`, dest)
	parts := split(dest, ":")
	port := to_number(parts[count(parts) - 1])
	port >= 1
	port <= 65535
}

# Exactly what was asked for once it is allowed: the sandbox reaches these
# destinations through the gateway's path and nothing else. Otherwise none.
egress_obligation(v, deny) := v.egress if {
	count(deny) == 0
} else := []
