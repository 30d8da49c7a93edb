# What needs a human's approval before it runs: the analysis features and the
# languages the tenant's policy data lists under `approval`.
package execgate

import rego.v1

approval_ttl_s := 900

# Modules through which code can load and call native code in-process, which
# sidesteps every interpreter-level guarantee and widens the syscall surface.
native_modules := {"ctypes", "_ctypes", "cffi", "_cffi_backend"}

approval_reasons(v) := ({msg |
	some feature in v.config.approval.features
	v.features[feature]
	msg := feature_reason(v, feature)
} | {msg |
	some language in v.config.approval.languages
	language == v.language
	msg := concat("", [text(v.language), " code for tenant ", text(v.tenant), " needs approval"])
}) | tool_approval_reasons(v)

feature_reason(v, "native_code") := native_code_reason(v, sorted(v.imports & native_modules))

feature_reason(v, feature) := concat("", [
	text(v.language), " code for tenant ", text(v.tenant), " uses ", text(feature),
]) if {
	feature != "native_code"
}

native_code_reason(v, found) := concat("", [
	text(v.language), " code for tenant ", text(v.tenant),
	" loads native code (", concat(", ", found), ")",
]) if {
	count(found) > 0
} else := concat("", [text(v.language), " code for tenant ", text(v.tenant), " loads native code"])

# An approval satisfies the policy only for the very request that was approved.
# The gateway has already verified the token's signature, expiry and single use,
# and refused any token whose binding (language, code, files, stdin, backend,
# tool, limits, egress, requester, tenant) differs; the policy only sees that
# it was presented and that it covers this code and this whole request.
approved(v) if {
	v.approval.present == true
	v.approval.code_sha256_match == true
	v.approval.request_match == true
}

pending_approval_reasons(v) := set() if {
	approved(v)
} else := approval_reasons(v)
