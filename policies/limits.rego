# Resource limits against the ceilings that apply.
#
# Three ceilings can apply to each limit, and the lowest wins: the gateway's
# (input.tenant.ceilings, from its settings), the tenant's policy data
# (`ceilings`), and the subject's tier (`tiers[claims.tier]`). A request above
# the ceiling is clamped, not denied: callers (often models) ask for generous
# limits without knowing the tenant's configuration, and running the code under
# the ceiling is what the operator configured. The obligation carries the limit
# that applies and the response reports it. Only values that make no sense (not
# a positive number, or an unknown limit) are denied.
package execgate

import rego.v1

limit_keys := {"timeout_s", "memory_mb", "cpus", "pids", "disk_mb", "output_bytes"}

limit_denials(v) := ({msg |
	not is_object(v.limits)
	msg := concat("", ["limits must be an object, got ", text(v.limits)])
} | {msg |
	some key in (object.keys(v.requested) - limit_keys)
	msg := concat("", ["unknown limit ", text(key)])
}) | {msg |
	some key in limit_keys
	value := v.requested[key]
	not positive_number(value)
	msg := concat("", ["limit ", key, " must be a positive number, got ", text(value)])
}

positive_number(value) if {
	is_number(value)
	value > 0
}

# The ceilings of the subject's tier; a tier the data does not name has none.
tier_ceilings(v) := object.get(v.config.tiers, [object.get(v.claims, "tier", "")], {})

# Each sane ceiling applies; a sane request replaces it when lower, and stands
# alone when there is no ceiling. Absent from all means no obligation.
# (Iterating `limit_keys` rather than looking keys up in it: a lookup into a
# set rule costs rego-cpp tens of microseconds each time.)
limit_obligations(v) := object.union(ceilings, {key: value |
	some key in limit_keys
	requested := v.requested[key]
	positive_number(requested)
	value := lower_limit(requested, object.get(ceilings, key, null))
}) if {
	ceilings := effective_ceilings(v, tier_ceilings(v))
}

# Fast path (most tenants): no policy or tier ceilings, only the gateway's.
effective_ceilings(v, tier) := {key: ceiling |
	some key in limit_keys
	ceiling := v.ceilings[key]
	positive_number(ceiling)
} if {
	count(v.config.ceilings) == 0
	count(tier) == 0
} else := {key: ceiling |
	some key in limit_keys
	ceiling := lower_limit(lower_limit(object.get(v.ceilings, key, null), object.get(v.config.ceilings, key, null)), object.get(tier, key, null))
	positive_number(ceiling)
}

# The lower of two limits, ignoring one that is not a positive number. Not
# `min([a, b])`: rego-cpp 1.5 orders numbers as text in min/max/sort
# (min([9, 10]) is 10 there), while comparison operators are numeric.
lower_limit(a, b) := b if {
	positive_number(b)
	not positive_number(a)
} else := b if {
	positive_number(b)
	b < a
} else := a
