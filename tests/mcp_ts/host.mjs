// A stand-in MCP host on the official TypeScript SDK client, remote-controlled by the test.
//
// The test (tests/test_mcp_ts.py) writes one JSON command per line on stdin; every answer and
// event is one JSON line on stdout, tagged with the command's id. Calls run concurrently, the
// way a host runs a model's parallel tool calls.
//
//   {"id", "do": "connect", "command", "args", "env", "name", "version"}   (stdio), or
//   {"id", "do": "connect", "url", "name", "version"}                      (Streamable HTTP)
//   {"id", "do": "list"}          tools, each input/output schema compiled with the SDK's ajv
//   {"id", "do": "call", "name", "arguments", "timeout"?, "reset"?, "progress"?}
//        -> {"id", "progress", "message"} while it waits (when "progress"), then
//           {"id", "result"} or {"id", "error": {"code", "message"}}
//   {"id", "do": "abort", "target"}  abort a running call (the SDK sends notifications/cancelled)
//   {"id", "do": "close"}
import readline from "node:readline";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { AjvJsonSchemaValidator } from "@modelcontextprotocol/sdk/validation/ajv";

let client = null;
let transport = null;
const running = new Map(); // call id -> AbortController
const say = (obj) => process.stdout.write(JSON.stringify(obj) + "\n");

async function handle(cmd) {
  const { id } = cmd;
  try {
    if (cmd.do === "connect") {
      client = new Client({ name: cmd.name, version: cmd.version });
      transport = cmd.url
        ? new StreamableHTTPClientTransport(new URL(cmd.url))
        : new StdioClientTransport({ command: cmd.command, args: cmd.args, env: cmd.env, stderr: "inherit" });
      await client.connect(transport);
      say({ id, server: client.getServerVersion(), capabilities: client.getServerCapabilities() });
    } else if (cmd.do === "list") {
      const { tools } = await client.listTools();
      const ajv = new AjvJsonSchemaValidator();
      const invalid = [];
      for (const t of tools) {
        for (const [which, schema] of [["input", t.inputSchema], ["output", t.outputSchema]]) {
          try { if (schema) ajv.getValidator(schema); } catch (e) { invalid.push(`${t.name} ${which}: ${e.message}`); }
        }
      }
      say({ id, tools, invalid });
    } else if (cmd.do === "call") {
      const controller = new AbortController();
      running.set(id, controller);
      const options = { signal: controller.signal };
      if (cmd.timeout !== undefined) options.timeout = cmd.timeout;
      if (cmd.reset) options.resetTimeoutOnProgress = true;
      if (cmd.progress) options.onprogress = (p) => say({ id, progress: p.progress, message: p.message });
      try {
        const result = await client.callTool({ name: cmd.name, arguments: cmd.arguments ?? {} }, undefined, options);
        say({ id, result });
      } finally {
        running.delete(id);
      }
    } else if (cmd.do === "abort") {
      running.get(cmd.target)?.abort("the host gave up");
      say({ id, aborted: running.has(cmd.target) });
    } else if (cmd.do === "close") {
      if (transport instanceof StreamableHTTPClientTransport) await transport.terminateSession();
      await client.close();
      say({ id, closed: true });
    } else {
      say({ id, error: { code: -1, message: `unknown command ${cmd.do}` } });
    }
  } catch (e) {
    say({ id, error: { code: e.code ?? null, message: String(e.message ?? e) } });
  }
}

const lines = readline.createInterface({ input: process.stdin });
lines.on("line", (line) => { if (line.trim()) handle(JSON.parse(line)); });
lines.on("close", async () => { if (client) await client.close(); });
