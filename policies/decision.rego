# Assembles `data.execgate.decision`, the one document the gateway asks for.
#
# Each concern lives in its own file and contributes a function of the
# normalised input and tenant data (see input.rego); a new concern adds its
# reasons here.
package execgate

import rego.v1

decision := decide(input)

decide(inp) := decide_with(inp, data.tenants)

# `tenants` is the per-tenant policy data (data.tenants in production); tests
# pass their own.
decide_with(inp, tenants) := assemble(v, denials(v), pending_approval_reasons(v)) if {
	v := view(inp, tenants)
}

denials(v) := (((((version_denials(v) | scope_denials(v)) | language_denials(v)) | limit_denials(v)) | egress_denials(v)) | import_denials(v)) | tool_denials(v)

assemble(v, deny, pending) := object.union(
	{
		"allow": (count(deny) + count(pending)) == 0,
		"deny": sorted(deny),
		"require_approval": count(pending) > 0,
		"obligations": object.union(
			object.union(limit_obligations(v), backend_obligation(v)),
			{"egress": egress_obligation(v, deny)},
		),
		"monitor": sorted(monitor_notes(v)),
	},
	approval_section(pending),
)

# A sorted array. Not just sort(): in rego-cpp 1.5 sort() of a set yields a
# set, which prints like an array but compares unequal to one in Rego.
# rego-cpp orders strings by their JSON-escaped text (a quote sorts as \"), so
# reasons holding quotes or control characters can come out in another order
# than OPA's; the gateway sorts `deny` and `monitor` itself.
sorted(s) := [x | some x in sort(s)]

approval_section(pending) := {"approval": {
	"reason": concat("; ", sort(pending)),
	"ttl_s": approval_ttl_s,
}} if {
	count(pending) > 0
} else := {}
