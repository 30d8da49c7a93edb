# What OPA leaves out of its decision log (`decision_logs.mask_decision`).
#
# OPA evaluates `data.system.log.mask` for every decision-log entry, with the
# entry as `input` (the decision's input is `input.input`), and erases each JSON
# pointer it returns. Code is the caller's property and may embed secrets;
# claims whose name or value looks like a credential are erased too. The
# gateway's own audit log keeps the code's hash, never the code.
# OPA evaluates this package for its own decision log; the gateway evaluates it for
# decision-inputs.db (the Wasm engine in-process, otherwise rego-cpp).
package system.log

import rego.v1

mask := masked_paths(input)

masked_paths(entry) := {"/input/execution/code"} | {path |
	claims := object.get(entry, ["input", "subject", "claims"], {})
	is_object(claims)
	some key
	value := claims[key]
	secret_looking(key, value)
	path := concat("", ["/input/subject/claims/", json_pointer_escape(key)])
}

# lower() rather than a (?i) flag: rego-cpp 1.5 regexes do not support flags.
secret_looking(key, _) if {
	regex.match(`(secret|token|passw|api[_-]?key|private|credential|cookie|session|auth)`, lower(key))
}

secret_looking(_, value) if {
	is_string(value)
	regex.match(`^(eyj[a-z0-9_-]+\.|-----begin |bearer |basic )`, lower(value))
}

# RFC 6901: "~" is "~0" and "/" is "~1" inside one reference token.
json_pointer_escape(key) := replace(replace(key, "~", "~0"), "/", "~1")
