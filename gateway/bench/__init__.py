"""The benchmark and load tools, off the request path: `execgate bench`, `execgate load`.

Owns the side-by-side measurements of SPEC section 9 (`run`, `docker`, `policy`), how
they measure (`measure`), the load generator and its checks (`load`, `load_checks`)
and `execgate serve` as a subprocess (`process`).
Imported by nothing but the CLI; may import anything below the edge.
"""
