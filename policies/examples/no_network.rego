# Example: no network at all for some tenants, whatever scopes their agents hold.
#
# To adopt it, in decision.rego: `import data.execgate.examples.no_network` and
# add `| no_network.denials(v)` to `denials(v)`.
package execgate.examples.no_network

import data.execgate
import rego.v1

offline_tenants := {"umbrella"}

denials(v) := {msg |
	offline_tenants[v.tenant]
	some dest in v.egress
	msg := concat("", ["tenant ", execgate.text(v.tenant), " runs without network: egress to ", execgate.text(dest), " refused"])
} | {msg |
	offline_tenants[v.tenant]
	v.features.network
	msg := concat("", ["tenant ", execgate.text(v.tenant), " runs without network: code that uses the network is refused"])
}
