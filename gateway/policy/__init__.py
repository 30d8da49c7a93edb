"""Policy engines: who decides `data.execgate.decision`, and how fast and how safely.

Owns the engine interface (`base.PolicyEngine`, `EngineAnswer`), the default embedded
engine (`wasm`: the policy compiled by OPA to Wasm, run in-process under an enforced
deadline; `wasm_builtins`; `compiler` finds OPA and builds), the rego-cpp engine
(`embedded`, `rego`, `preflight`), the OPA server engine (`opa`), the policy files and
their revision (`sources`), hot reload (`reload`), the decision as the gateway
understands it (`decision`), OPA bundles (`bundle`, `bundle_server`), a local OPA for
tests and benchmarks (`local_opa`), and the decision inputs kept for replay (`inputs`,
`mask`, `replay`).
May import: settings and gateway's plain modules.
"""
