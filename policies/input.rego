# The input document and the tenant's policy data, normalised once per decision.
#
# Every rule of the default policy is a function of this view rather than a
# rule over `input` and `data`: rego-cpp 1.5 (the embedded engine) crashes or
# answers wrongly on `with input as ...` (and `with data...`), so the unit tests
# call `decide_with(inp, tenants)` with literal inputs and tenant data instead,
# and both engines run the same tests. Reading each field once here also keeps
# evaluation cheap in rego-cpp, where every builtin call costs tens of
# microseconds.
package execgate

import rego.v1

input_version := "execgate.input/v1"

view(inp, tenants) := {
	"version": object.get(inp, "version", null),
	"tenant": tenant,
	"language": object.get(inp, ["execution", "language"], ""),
	"scopes": {s | some s in object.get(inp, ["subject", "scopes"], [])},
	"claims": as_object(object.get(inp, ["subject", "claims"], {})),
	"languages": {l | some l in object.get(inp, ["tenant", "languages"], [])},
	"limits": object.get(inp, ["execution", "limits"], {}),
	"requested": as_object(object.get(inp, ["execution", "limits"], {})),
	"ceilings": as_object(object.get(inp, ["tenant", "ceilings"], {})),
	"egress": object.get(inp, ["execution", "egress"], []),
	"parsed": object.get(inp, ["analysis", "parsed"], false),
	"features": {f | some f in object.get(inp, ["analysis", "features"], [])},
	"imports": {m | some m in object.get(inp, ["analysis", "imports"], [])},
	"approval": object.get(inp, "approval", {}),
	"tool": as_object(object.get(inp, "tool", {})),
	"config": tenant_config(tenants, tenant),
} if {
	tenant := object.get(inp, ["tenant", "id"], "unknown")
}

# A value as reasons show it. Reasons are assembled with concat, and no string
# goes through sprintf: rego-cpp 1.5 wraps some strings in quotes there.
# Numbers are shown only as whole numbers within 32 bits (format_int), since the
# engines print other numbers differently (1e+06 and 1000000), OPA's Wasm
# format_int aborts beyond 32 bits and rego-cpp's sprintf %d wraps there;
# composite values are named, not printed.
text(value) := value if {
	is_string(value)
} else := format_int(value, 10) if {
	is_number(value)
	value < 2147483648
	value > -2147483648
	value == floor(value)
} else := "a non-integral or out-of-range number" if {
	is_number(value)
} else := sprintf("%v", [value]) if {
	is_boolean(value)
} else := "null" if {
	is_null(value)
} else := "an array" if {
	is_array(value)
} else := "an object" if {
	is_object(value)
} else := "a set"

as_object(value) := value if {
	is_object(value)
} else := {}
