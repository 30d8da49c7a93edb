"""The escape-test techniques, by category, in the order the runner tries them.

`index.techniques()` lists them all; `posture` (privileges and identity), `kernel`
(system calls and kernel surfaces), `neighbours` (the host, other sandboxes, the
network) and `resources` (limits, output, residue) each hold one category's probes.
May import: `gateway.escape.technique`, `gateway.escape.prelude`, backends' constants.
"""
