# The input document, normalised once per decision.
#
# Every rule of the default policy is a function of this view rather than a
# rule over `input`: rego-cpp 1.5 (the embedded engine) crashes or answers
# wrongly on `with input as ...`, so the unit tests call `decide(inp)` with
# literal inputs instead, and both engines run the same tests. Reading each
# field once here also keeps evaluation cheap in rego-cpp, where every
# builtin call costs tens of microseconds.
package execgate

import rego.v1

input_version := "execgate.input/v1"

view(inp) := {
	"version": object.get(inp, "version", null),
	"tenant": object.get(inp, ["tenant", "id"], "unknown"),
	"language": object.get(inp, ["execution", "language"], ""),
	"scopes": {s | some s in object.get(inp, ["subject", "scopes"], [])},
	"languages": {l | some l in object.get(inp, ["tenant", "languages"], [])},
	"requested": object.get(inp, ["execution", "limits"], {}),
	"ceilings": object.get(inp, ["tenant", "ceilings"], {}),
	"egress": object.get(inp, ["execution", "egress"], []),
	"parsed": object.get(inp, ["analysis", "parsed"], false),
	"features": {f | some f in object.get(inp, ["analysis", "features"], [])},
	"imports": {m | some m in object.get(inp, ["analysis", "imports"], [])},
	"approval": object.get(inp, "approval", {}),
}

# Reasons are assembled with concat, and only non-strings go through sprintf:
# rego-cpp 1.5 wraps some strings in quotes when they pass through sprintf,
# which would make the two engines' reasons differ.
text(value) := value if {
	is_string(value)
} else := sprintf("%v", [value])
