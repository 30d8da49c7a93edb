// Drives execgate's /mcp with the official MCP TypeScript SDK (the client most MCP
// hosts embed). Reads a plan as JSON on stdin: {url, token, calls: [{name, arguments,
// meta}]}; lists the tools (which makes the SDK cache each tool's outputSchema
// validator), calls each tool, and prints one JSON document: the negotiated protocol
// version, the tools with their output schemas, and per call either the result or the error the SDK raised
// (an SDK error here is what a host would show its user: a protocol failure).
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const plan = JSON.parse(Buffer.concat(chunks).toString("utf8"));

const transport = new StreamableHTTPClientTransport(new URL(plan.url), {
  requestInit: { headers: { Authorization: `Bearer ${plan.token}` } },
});
const client = new Client({ name: "execgate-tests", version: "1.0.0" });
await client.connect(transport);
const tools = await client.listTools();
const results = [];
for (const call of plan.calls) {
  try {
    const params = { name: call.name, arguments: call.arguments };
    if (call.meta) params._meta = call.meta;
    const progress = [];
    const options = call.progress ? { onprogress: (p) => progress.push(p) } : undefined;
    const result = await client.callTool(params, undefined, options);
    results.push({ ok: true, result, progress });
  } catch (error) {
    results.push({ ok: false, error: String(error?.message ?? error), code: error?.code ?? null });
  }
}
const out = {
  protocol: transport.protocolVersion ?? null,
  tools: tools.tools.map((t) => ({ name: t.name, outputSchema: t.outputSchema ?? null })),
  results,
};
await client.close();
process.stdout.write(JSON.stringify(out));
