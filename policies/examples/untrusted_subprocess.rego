# Example: agents whose token says `"trust": "untrusted"` may not start
# subprocesses (by the analysis of their code).
#
# To adopt it, in decision.rego: `import data.execgate.examples.untrusted_subprocess`
# and add `| untrusted_subprocess.denials(v)` to `denials(v)`.
package execgate.examples.untrusted_subprocess

import data.execgate
import rego.v1

denials(v) := {msg |
	untrusted(v)
	starts_processes(v)
	msg := concat("", ["untrusted agent ", execgate.text(object.get(v.claims, "sub", "")), " may not start subprocesses"])
}

# Absent or unknown trust counts as untrusted only when the claim says so:
# tighten to `v.claims.trust != "trusted"` to default the other way.
untrusted(v) if v.claims.trust == "untrusted"

starts_processes(v) if v.features.subprocess

starts_processes(v) if v.imports.subprocess
