"""The escape-test suite: adversarial probes run inside real sandboxes.

technique.py   what a technique is (probe programs, verdicts) as data
prelude.py     the helpers every python probe starts with
catalog/       the techniques, one module per group of categories; catalog/index.py lists them
host.py        the host side: canaries, loopback servers, settings snapshots
residue.py     what a finished execution may not leave on the host, per backend
runner.py      runs the suite against one started backend, one probe at a time
report.py      the table, the JSON and the summary line
"""
