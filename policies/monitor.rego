# Draft rules: reported in the decision's `monitor` list and the audit log,
# never enforced. A rule graduates to deny/approval once its hits are understood.
package execgate

import rego.v1

monitor_notes(v) := ({note |
	some feature in v.config.monitor_features
	v.features[feature]
	note := concat("", ["would deny under draft rule: ", text(feature)])
} | {note |
	v.parsed != true
	note := "code could not be analysed (analysis.parsed is false)"
}) | {note |
	v.features.network
	count(v.egress) == 0
	note := "code uses the network but asked for no egress: its connections will fail"
}
