# Who may run which language.
package execgate

import rego.v1

# The gateway checks `exec:<language>` at the edge as well; checking it here too
# keeps the decision self-contained and auditable.
scope_denials(v) := {msg |
	not v.scopes[concat("", ["exec:", text(v.language)])]
	msg := concat("", ["subject lacks scope exec:", text(v.language)])
}

language_denials(v) := {msg |
	not v.languages[v.language]
	msg := concat("", ["language ", text(v.language), " is not allowed for tenant ", text(v.tenant)])
}

version_denials(v) := {msg |
	v.version != input_version
	msg := concat("", ["unsupported input version ", text(v.version), " (expected ", input_version, ")"])
}
