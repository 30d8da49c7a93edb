package execgate_test

import data.execgate
import rego.v1

test_scope_and_language_allow if {
	d := execgate.decide(base_input)
	d.allow
	d.deny == []
}

test_missing_exec_scope_denied if {
	d := execgate.decide(patched({"subject": {"scopes": ["exec:bash"]}}))
	not d.allow
	d.deny == ["subject lacks scope exec:python"]
}

test_scope_for_another_language_does_not_count if {
	d := execgate.decide(patched({"execution": {"language": "bash"}, "subject": {"scopes": ["exec:python"]}}))
	d.deny == ["subject lacks scope exec:bash"]
}

test_scope_must_match_exactly if {
	d := execgate.decide(patched({"subject": {"scopes": ["exec:python3", "exec:*", "EXEC:PYTHON"]}}))
	d.deny == ["subject lacks scope exec:python"]
}

test_missing_scopes_denied if {
	d := execgate.decide(without("subject", "scopes"))
	d.deny == ["subject lacks scope exec:python"]
}

test_language_not_allowed_for_tenant if {
	d := execgate.decide(patched({"tenant": {"languages": ["bash"]}}))
	d.deny == ["language python is not allowed for tenant acme"]
}

test_unknown_language_denied_twice_over if {
	d := execgate.decide(patched({"execution": {"language": "cobol"}}))
	d.deny == ["language cobol is not allowed for tenant acme", "subject lacks scope exec:cobol"]
}

test_tenant_without_languages_denies if {
	d := execgate.decide(without("tenant", "languages"))
	d.deny == ["language python is not allowed for tenant acme"]
}

test_missing_language_denied if {
	d := execgate.decide(without("execution", "language"))
	not d.allow
	"subject lacks scope exec:" in d.deny
}
