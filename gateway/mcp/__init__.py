"""MCP over Streamable HTTP: the protocol, the tools, the sessions, the upstream.

Owns the wire rules of both revisions (`protocol`), the code tools and their results
(`tools`), 2025-11-25 sessions (`sessions`), the client of the upstream MCP server
(`upstream`) and what `tools/list` and `tools/call` do (`server.McpServer`, which runs
code tools through the pipeline). The HTTP endpoint itself is `gateway.ingress.mcp`.
May import: the pipeline, stages, concepts and gateway's plain modules (edge layer).
"""
