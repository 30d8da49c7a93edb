# Example: every bash script needs a human's approval, for every tenant.
#
# (Per tenant, the default policy does this from data: `approval.languages` in
# tenants/data.json.) To adopt it, in decision.rego:
# `import data.execgate.examples.approval_for_bash` and pass
# `pending_approval_reasons(v) | approval_for_bash.approval_reasons(v)` to
# `assemble`, unless `execgate.approved(v)`.
package execgate.examples.approval_for_bash

import data.execgate
import rego.v1

approval_reasons(v) := {msg |
	v.language == "bash"
	msg := concat("", ["bash code for tenant ", execgate.text(v.tenant), " needs a human's approval"])
}
