package execgate_test

import data.execgate
import rego.v1

tool_input := patched({
	"request": {"id": "req_test", "time": "2026-11-29T10:00:00Z", "ingress": "mcp", "tool_name": "send_email", "source_ip": "127.0.0.1"},
	"subject": {"sub": "svc:agent-7", "tenant": "acme", "scopes": ["tool:send_email"], "claims": {}},
	"execution": {
		"language": "tool", "code": "{\"to\":\"a@example.com\"}", "code_sha256": "ab12",
		"code_bytes": 22, "files": [], "limits": {}, "egress": [], "backend": null,
	},
	"analysis": {"parsed": false, "imports": [], "calls": [], "features": []},
	"tool": {"name": "send_email", "server": "upstream", "arguments": {"to": "a@example.com"}},
})

# tool_input with one section replaced whole (object.union would merge in OPA).
replaced(key, value) := object.union(object.remove(tool_input, [key]), {key: value})

tenants_with(entry) := {"default": {"languages": ["python"]}, "acme": entry}

test_tool_with_its_scope_allowed if {
	d := execgate.decide_with(tool_input, tenants_with({}))
	d.allow
	d.deny == []
}

test_tool_wildcard_scope_allowed if {
	inp := replaced("subject", {"sub": "s", "tenant": "acme", "scopes": ["tool:*"], "claims": {}})
	d := execgate.decide_with(inp, tenants_with({}))
	d.allow
}

test_tool_without_scope_denied if {
	inp := replaced("subject", {"sub": "s", "tenant": "acme", "scopes": ["exec:python", "tool:other"], "claims": {}})
	d := execgate.decide_with(inp, tenants_with({}))
	not d.allow
	d.deny == ["subject lacks scope tool:send_email"]
}

test_tool_not_listed_for_tenant_denied if {
	d := execgate.decide_with(tool_input, tenants_with({"tools": ["search"]}))
	d.deny == ["tool send_email is not allowed for tenant acme"]
}

test_tool_listed_by_name_allowed if {
	d := execgate.decide_with(tool_input, tenants_with({"tools": ["search", "send_email"]}))
	d.allow
}

test_tool_approval_by_name if {
	d := execgate.decide_with(tool_input, tenants_with({"tool_approval": ["send_email"]}))
	not d.allow
	d.deny == []
	d.require_approval
	d.approval.reason == "tool send_email for tenant acme needs approval"
}

test_tool_approval_satisfied_by_matching_token if {
	inp := replaced("approval", {"present": true, "id": "apr_1", "approver": "sec", "code_sha256_match": true, "request_match": true, "expires_at": "2026-11-29T11:00:00Z"})
	d := execgate.decide_with(inp, tenants_with({"tool_approval": ["*"]}))
	d.allow
}

test_tool_without_name_denied if {
	inp := replaced("tool", {"server": "upstream"})
	d := execgate.decide_with(inp, tenants_with({}))
	not d.allow
	d.deny == ["subject lacks scope tool:", "tool  is not allowed for tenant acme"]
}

test_code_scopes_do_not_cover_tools if {
	inp := replaced("subject", {"sub": "s", "tenant": "acme", "scopes": ["exec:python", "exec:tool", "exec:*"], "claims": {}})
	d := execgate.decide_with(inp, tenants_with({}))
	d.deny == ["subject lacks scope tool:send_email"]
}

test_tool_scope_does_not_cover_code if {
	d := execgate.decide(patched({"subject": {"sub": "s", "tenant": "acme", "scopes": ["tool:*", "tool:python"], "claims": {}}}))
	d.deny == ["subject lacks scope exec:python"]
}
