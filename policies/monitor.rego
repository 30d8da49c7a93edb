# Draft rules: reported in the decision's `monitor` list and the audit log,
# never enforced. A rule graduates to deny/approval once its hits are understood.
package execgate

import rego.v1

monitor_notes(v) := {note |
	v.features.dynamic_code
	note := "would deny under draft rule: dynamic_code"
} | {note |
	v.parsed != true
	note := "code could not be analysed (analysis.parsed is false)"
}
