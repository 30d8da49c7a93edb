# Who may run which language.
package execgate

import rego.v1

# The gateway checks `exec:<language>` at the edge as well; checking it here too
# keeps the decision self-contained and auditable.
scope_denials(v) := {msg |
	not has_exec_scope(v)
	msg := concat("", ["subject lacks scope ", needed_scope(v)])
}

# A non-code tool (language "tool", see tools.rego) needs tool:<name> instead.
needed_scope(v) := tool_scope(v) if {
	v.language == "tool"
} else := concat("", ["exec:", text(v.language)])

has_exec_scope(v) if {
	v.language != "tool"
	is_string(v.language)
	v.scopes[concat("", ["exec:", v.language])]
}

# Both the gateway's settings (input.tenant.languages) and the tenant's policy
# data must allow the language.
language_denials(v) := {msg |
	not language_allowed(v)
	msg := concat("", ["language ", text(v.language), " is not allowed for tenant ", text(v.tenant)])
}

language_allowed(v) if {
	v.languages[v.language]
	some allowed in v.config.languages
	allowed == v.language
}

version_denials(v) := {msg |
	v.version != input_version
	msg := concat("", ["unsupported input version ", text(v.version), " (expected ", input_version, ")"])
}
