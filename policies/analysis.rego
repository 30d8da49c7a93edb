# What the code itself does, from the gateway's static analysis (`analysis`):
# imports the tenant's policy data refuses outright.
package execgate

import rego.v1

import_denials(v) := {msg |
	some module in v.config.blocked_imports
	v.imports[module]
	msg := concat("", [
		text(v.language), " code for tenant ", text(v.tenant),
		" imports ", text(module), ", which the tenant's policy blocks",
	])
}
