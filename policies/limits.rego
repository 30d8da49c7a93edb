# Resource limits against the tenant's ceilings.
#
# A request above a ceiling is clamped, not denied: callers (often models) ask
# for generous limits without knowing the tenant's configuration, and running
# the code under the ceiling is what the operator configured. The obligation
# carries the limit that applies and the response reports it. Only values that
# make no sense (not a positive number, or an unknown limit) are denied.
package execgate

import rego.v1

limit_keys := {"timeout_s", "memory_mb", "cpus", "pids", "disk_mb", "output_bytes"}

limit_denials(v) := {msg |
	some key in (object.keys(v.requested) - limit_keys)
	msg := concat("", ["unknown limit ", text(key)])
} | {msg |
	some key in limit_keys
	value := v.requested[key]
	not positive_number(value)
	msg := concat("", ["limit ", key, " must be a positive number, got ", text(value)])
}

positive_number(value) if {
	is_number(value)
	value > 0
}

# Each sane ceiling applies; a sane request replaces it when lower, and stands
# alone when there is no ceiling. Absent from both means no obligation.
# (Iterating `limit_keys` rather than looking keys up in it: a lookup into a
# set rule costs rego-cpp tens of microseconds each time.)
limit_obligations(v) := object.union(
	{key: ceiling |
		some key in limit_keys
		ceiling := v.ceilings[key]
		positive_number(ceiling)
	},
	{key: value |
		some key in limit_keys
		requested := v.requested[key]
		positive_number(requested)
		value := clamp(requested, object.get(v.ceilings, key, null))
	},
)

# Not `min([a, b])`: rego-cpp 1.5 orders numbers as text in min/max/sort
# (min([9, 10]) is 10 there), while comparison operators are numeric.
clamp(requested, ceiling) := ceiling if {
	positive_number(ceiling)
	ceiling < requested
} else := requested
