"""Reverse-proxy routes: what passes through to an upstream, and what is intercepted.

Owns the pass-through (`forward`: streamed both ways, framing checked, credentials
swapped), the header allowlists both ways (`headers`) and intercept rules as pure
functions (`intercept`: normalised path match, JSON pointers in, answer shape).
The routes themselves are registered by `gateway.ingress.proxy`.
May import: settings and gateway's plain modules.
"""
