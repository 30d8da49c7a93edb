package execgate_test

import data.execgate
import rego.v1

native := patched({"analysis": {"imports": ["ctypes", "os"], "features": ["native_code"]}})

test_native_code_requires_approval if {
	d := execgate.decide(native)
	not d.allow
	d.deny == []
	d.require_approval
	d.approval == {"reason": "python code for tenant acme loads native code (ctypes)", "ttl_s": 900}
}

test_reason_lists_each_native_module if {
	d := execgate.decide(patched({"analysis": {"imports": ["cffi", "_ctypes", "ctypes"], "features": ["native_code"]}}))
	d.approval.reason == "python code for tenant acme loads native code (_ctypes, cffi, ctypes)"
}

test_reason_without_a_native_import if {
	d := execgate.decide(patched({"analysis": {"imports": [], "features": ["native_code"]}}))
	d.approval.reason == "python code for tenant acme loads native code"
}

test_matching_approval_allows if {
	d := execgate.decide(object.union(object.remove(native, ["approval"]), {"approval": {
		"present": true, "id": "apr_1", "approver": "alice",
		"code_sha256_match": true, "request_match": true, "expires_at": "2026-11-29T10:15:00Z",
	}}))
	d.allow
	not d.require_approval
	not d.approval
}

test_mismatched_approval_still_required if {
	d := execgate.decide(object.union(object.remove(native, ["approval"]), {"approval": {"present": true, "id": "apr_1", "code_sha256_match": false}}))
	not d.allow
	d.require_approval
}

test_approval_flag_must_be_true_not_truthy if {
	d := execgate.decide(object.union(object.remove(native, ["approval"]), {"approval": {"present": "yes", "code_sha256_match": "yes"}}))
	d.require_approval
}

test_no_native_code_no_approval if {
	d := execgate.decide(patched({"analysis": {"imports": ["ctypes"], "features": ["subprocess", "network"]}}))
	d.allow
	not d.require_approval
	not d.approval
}

test_deny_and_approval_both_reported if {
	d := execgate.decide(patched({
		"analysis": {"imports": ["ctypes"], "features": ["native_code"]},
		"subject": {"scopes": []},
	}))
	not d.allow
	d.deny == ["subject lacks scope exec:python"]
	d.require_approval
}

test_tenant_features_need_approval if {
	d := execgate.decide(patched({"tenant": {"id": "initech"}, "analysis": {"features": ["subprocess", "network"]}}))
	not d.allow
	d.require_approval
	d.approval.reason == "python code for tenant initech uses subprocess"
}

test_tenant_language_needs_approval if {
	d := execgate.decide(patched({"tenant": {"id": "initech"}, "execution": {"language": "bash"}}))
	d.require_approval
	d.approval.reason == "bash code for tenant initech needs approval"
}

test_every_approval_reason_joined if {
	d := execgate.decide(patched({
		"tenant": {"id": "initech"},
		"execution": {"language": "bash"},
		"analysis": {"features": ["subprocess", "native_code"]},
	}))
	d.approval.reason == "bash code for tenant initech loads native code; bash code for tenant initech needs approval; bash code for tenant initech uses subprocess"
}
