package system.log_test

import data.system.log
import rego.v1

entry(claims) := {"input": {"execution": {"code": "print(1)"}, "subject": {"claims": claims}}}

test_code_always_masked if {
	log.masked_paths(entry({})) == {"/input/execution/code"}
}

test_secret_looking_claim_names_masked if {
	log.masked_paths(entry({"api_key": "x", "Session-ID": 1, "tier": "free", "sub": "a"})) == {
		"/input/execution/code",
		"/input/subject/claims/api_key",
		"/input/subject/claims/Session-ID",
	}
}

test_secret_looking_claim_values_masked if {
	log.masked_paths(entry({"note": "eyJhbGciOi.x.y", "pem": "-----BEGIN KEY", "h": "Bearer abc", "ok": "plain"})) == {
		"/input/execution/code",
		"/input/subject/claims/h",
		"/input/subject/claims/note",
		"/input/subject/claims/pem",
	}
}

test_pointer_escaping if {
	log.masked_paths(entry({"a/b~token": 1})) == {"/input/execution/code", "/input/subject/claims/a~1b~0token"}
}

test_entry_without_claims if {
	log.masked_paths({}) == {"/input/execution/code"}
	log.masked_paths({"input": {"subject": {"claims": "odd"}}}) == {"/input/execution/code"}
}
