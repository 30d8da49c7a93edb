# Per-tenant policy data (policies/tenants/data.json, at `data.tenants`).
#
# Each tenant's entry overrides the "default" entry key by key; a key missing
# from both takes the value in `config_defaults`. This is the security team's
# side of tenant configuration: it can only narrow what the gateway's own
# settings allow (languages, ceilings), never widen it.
package execgate

import rego.v1

# Per key: languages the policy allows (also bounded by the gateway's list),
# resource ceilings, ceilings by the subject's `tier` claim, egress
# destinations ("host:port", "*.domain:port", or "*" for any), what needs a
# human's approval, imports that are refused, the backend the code must run on
# ("" for the gateway's choice), analysis features reported by `monitor`, and the
# guarded upstream tools it may call and those needing approval (tools.rego).
config_defaults := {
	"languages": [],
	"ceilings": {},
	"tiers": {},
	"egress_allowlist": [],
	"approval": {"features": [], "languages": []},
	"blocked_imports": [],
	"backend": "",
	"monitor_features": [],
	"tools": ["*"],
	"tool_approval": [],
}

# Key by key, not object.union(default, entry): that merges nested objects in
# OPA and only the top level in rego-cpp 1.5.
tenant_config(tenants, tenant) := {key: value |
	some key in config_keys
	value := object.get(entry, key, object.get(base, key, config_defaults[key]))
} if {
	entry := as_object(object.get(tenants, tenant, {}))
	base := as_object(object.get(tenants, "default", {}))
}

config_keys := object.keys(config_defaults)
