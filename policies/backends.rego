# Where the code runs: the tenant's policy data may require a backend (for
# example a stronger sandbox for a tenant that runs untrusted agents).
package execgate

import rego.v1

backend_obligation(v) := {"backend": v.config.backend} if {
	is_string(v.config.backend)
	v.config.backend != ""
} else := {}
