# Non-code tools: an upstream MCP tool the gateway guards reaches the policy as
# `execution.language == "tool"`, with the call's arguments as canonical JSON in
# `execution.code` (so an approval binds to those very arguments) and a `tool`
# object {"name", "server", "arguments"}. It needs scope tool:<name> (or tool:*),
# the tenant's policy data must list it under `tools` ("*": any), and the tools
# under `tool_approval` ("*": all) wait for a person's approval.
package execgate

import rego.v1

tool_name(v) := object.get(v.tool, "name", "")

tool_scope(v) := concat("", ["tool:", text(tool_name(v))])

has_exec_scope(v) if {
	v.language == "tool"
	v.scopes[tool_scope(v)]
}

has_exec_scope(v) if {
	v.language == "tool"
	v.scopes["tool:*"]
}

# Tools are not languages: the tenant's `tools` list decides (tool_denials).
language_allowed(v) if {
	v.language == "tool"
}

tool_denials(v) := {msg |
	v.language == "tool"
	not tool_listed(v, v.config.tools)
	msg := concat("", ["tool ", text(tool_name(v)), " is not allowed for tenant ", text(v.tenant)])
}

tool_approval_reasons(v) := {msg |
	v.language == "tool"
	tool_listed(v, v.config.tool_approval)
	msg := concat("", ["tool ", text(tool_name(v)), " for tenant ", text(v.tenant), " needs approval"])
}

tool_listed(v, names) if {
	named_tool(v)
	some allowed in names
	allowed == "*"
}

tool_listed(v, names) if {
	named_tool(v)
	some allowed in names
	allowed == tool_name(v)
}

named_tool(v) if {
	is_string(tool_name(v))
	tool_name(v) != ""
}
