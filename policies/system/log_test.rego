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

# Every spelling the name rule stands for, in any case, anywhere in the name.
test_secret_name_parts_in_any_case_and_place if {
	claims := {
		"APIKEY": 1, "x-api-key": 1, "Api_Key_2": 1, "password": 1, "db_passwd": 1,
		"refresh_token": 1, "client_secret": 1, "private_key": 1, "Credentials": 1,
		"cookie": 1, "session": 1, "authorization": 1, "oauth": 1,
		"api key": 1, "apkey": 1, "tier": 1, "sub": 1,
	}
	masked := log.masked_paths(entry(claims))
	count(masked) == 14
	not "/input/subject/claims/api key" in masked
	not "/input/subject/claims/apkey" in masked
	not "/input/subject/claims/tier" in masked
}

# A JWT-looking value needs a non-empty base64url segment before its dot; the other
# prefixes only at the start, and only with their space.
test_secret_value_edges if {
	claims := {
		"a": "eyJ.x", "b": "eyJab!c.d", "c": "EYJAB-_9.x", "d": "xeyJab.c",
		"e": "basic dXNlcg==", "f": "Basic", "g": " bearer x", "h": "-----BEGIN-",
		"i": 7,
	}
	log.masked_paths(entry(claims)) == {
		"/input/execution/code",
		"/input/subject/claims/c",
		"/input/subject/claims/e",
	}
}
