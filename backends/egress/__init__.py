"""Network egress under the gateway's control, shared by every backend.

A sandbox's network namespace holds three things the gateway made and serves
from its own event loop (boundary.py): an HTTP proxy listener (proxy.py) on the
sandbox's loopback, the only way out; a resolver (resolver.py) that records
every name and answers nothing usable; and a TUN device as the default route
(recorder.py), through which every direct attempt arrives and stops. What was
tried is kept, bounded, in a per-execution record (record.py); destinations
are matched against the decision's egress list (rules.py).
"""
