"""Typed settings: one TOML file plus `EXECGATE_<SECTION>_<KEY>` overrides.

Owns every section's model (`model`: `Settings`, `load_settings`, `SettingsError`;
unknown keys and wrong types are start-up errors naming the key) and the drop-in
ingresses' sections (`ingress`: `[ingress.mcp]`, `[[ingress.routes]]`).
May import: `backends` (each backend's own settings model), nothing of the gateway.
"""
