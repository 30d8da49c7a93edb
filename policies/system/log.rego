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

# What marks a claim's name as a secret: any of these inside it, in lower case. Plain
# substrings, not one regular expression: this rule runs for every claim of every
# kept decision, and a regex.match cost the Wasm engine ~0.2 ms per entry where
# these take a few microseconds (the same names match either way).
secret_name_parts := {
	"secret", "token", "passw", "apikey", "api_key", "api-key", "private",
	"credential", "cookie", "session", "auth",
}

secret_looking(key, _) if {
	name := lower(key)
	some part in secret_name_parts
	contains(name, part)
}

# A value that starts like a credential: a PEM block, an Authorization header value.
secret_looking(_, value) if {
	is_string(value)
	text := lower(value)
	some prefix in {"-----begin ", "bearer ", "basic "}
	startswith(text, prefix)
}

# A JWT: "eyJ" (base64url of `{"`), then a base64url segment and a dot. The regular
# expression only for a value that already starts that way. lower() rather than a
# (?i) flag: rego-cpp 1.5 regexes do not support flags.
secret_looking(_, value) if {
	is_string(value)
	text := lower(value)
	startswith(text, "eyj")
	regex.match(`^eyj[a-z0-9_-]+\.`, text)
}

# RFC 6901: "~" is "~0" and "/" is "~1" inside one reference token.
json_pointer_escape(key) := replace(replace(key, "~", "~0"), "/", "~1")
