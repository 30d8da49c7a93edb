"""Who is calling: bearer JWT verification and development tokens.

Owns the keys (`keys`: HS256 dev secret, PEM, JWKS entries, each pinned to one
algorithm), the JWKS cache (`jwks.JwksCache`), the strict compact-JWS half
(`jws`: parsing, claim checks) and the verifier (`tokens.TokenVerifier`,
`tokens.Principal`, `tokens.mint_token`).
May import: gateway's plain modules and `gateway.settings`.
"""
