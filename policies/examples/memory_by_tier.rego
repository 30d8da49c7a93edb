# Example: memory by the subject's tier claim (`tier` in the token).
#
# (The default policy does this from data: `tiers` in tenants/data.json.) To
# adopt it, in decision.rego: `import data.execgate.examples.memory_by_tier` and
# wrap the limit obligations: `memory_by_tier.obligations(v, limit_obligations(v))`.
package execgate.examples.memory_by_tier

import data.execgate
import rego.v1

memory_mb_by_tier := {"free": 128, "standard": 512, "pro": 2048}

# Lowers memory_mb to the tier's; a subject without a known tier gets the
# smallest. Never raises it: other ceilings still hold.
obligations(v, current) := object.union(current, {"memory_mb": execgate.lower_limit(object.get(current, "memory_mb", null), tier_memory_mb(v))})

tier_memory_mb(v) := memory_mb_by_tier[v.claims.tier] if {
	is_string(v.claims.tier)
	memory_mb_by_tier[v.claims.tier]
} else := memory_mb_by_tier.free
