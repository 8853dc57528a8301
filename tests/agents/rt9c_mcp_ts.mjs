// A careful agent as a TypeScript-SDK MCP host: the official @modelcontextprotocol/sdk Client
// starts `vaultsim mcp` over stdio (its environment passed on: the SDK's default passes only
// HOME/PATH/USER-like variables, and the bridge reads VAULTSIM_SOCKET, VAULTSIM_TASK and
// VAULTSIM_RUN_ID) and calls the tools the careful way. Written from the README's MCP section
// and docs/agent-contract.md. The SDK is found beside this file (node_modules), so the test
// copies it into a directory where `npm ci` installed the pinned SDK.
//   RT9C_PROGRESS=1  tool calls with a 3 s host timeout that progress notifications (every 1 s)
//                    reset, as hosts with a short timeout do
//   RT9C_VAULTSIM    the vaultsim program (default: `vaultsim` on PATH)
import { readFileSync, writeFileSync, renameSync } from "node:fs";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

const task = JSON.parse(readFileSync(process.env.VAULTSIM_TASK, "utf8"));
const deadline = task.deadline * 1000;
const runId = process.env.VAULTSIM_RUN_ID || task.run_id;
const statePath = task.state_dir ? `${task.state_dir}/rt9c-ts.json` : null;
const NEVER = new Set(["authentication_failed", "authorization_denied", "malformed_response",
  "approval_denied", "approval_expired", "approval_unroutable"]);
const left = () => deadline - Date.now();
const sleep = (ms) => new Promise((r) => setTimeout(r, Math.max(0, ms)));
const waitS = () => Math.max(0, Math.min(40, (left() - 2000) / 1000));

let state = { done: {}, pending: {} };
try { state = JSON.parse(readFileSync(statePath, "utf8")); } catch { /* a first process */ }
function save() {
  if (!statePath) return;
  writeFileSync(statePath + ".part", JSON.stringify(state)); // beside it: /tmp is another mount in the jail
  renameSync(statePath + ".part", statePath);
}
function subst(v) {
  if (typeof v === "string") {
    return v.replace(/\$\{([^.}]+)\.([^}]+)\}/g, (_, id, f) => {
      const d = state.done[id];
      if (!d || d[f] === undefined) throw new Error("missing");
      return String(d[f]);
    });
  }
  if (Array.isArray(v)) return v.map(subst);
  if (v && typeof v === "object") return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, subst(x)]));
  return v;
}
function resultOf(r) {
  if (r.structuredContent) return r.structuredContent;
  for (const c of r.content || []) { try { return JSON.parse(c.text); } catch { /* next */ } }
  return { ok: false, category: "malformed_response" };
}

const transport = new StdioClientTransport({
  command: process.env.RT9C_VAULTSIM || "vaultsim",
  args: process.env.RT9C_PROGRESS === "1" ? ["mcp", "--progress-every", "1"] : ["mcp"],
  // RT9C_ENV=sdk: the SDK's default environment (HOME, PATH, USER...: no VAULTSIM_* variables)
  env: process.env.RT9C_ENV === "sdk" ? undefined : { ...process.env }, stderr: process.env.RT9C_ENV === "sdk" ? "inherit" : "ignore",
});
const client = new Client({ name: "rt9c-ts-host ✓", version: "1.0.0" });
const progress = process.env.RT9C_PROGRESS === "1";
async function tool(name, args) {
  const opts = progress
    ? { timeout: 3000, resetTimeoutOnProgress: true, maxTotalTimeout: Math.max(1000, left() - 500), onprogress: () => {} }
    : { timeout: Math.max(1000, left() - 500) };
  return resultOf(await client.callTool({ name, arguments: args }, undefined, opts));
}

async function step(st) {
  const sid = String(st.id ?? ""), op = st.call, key = `${runId}:${task.agent}:${sid}`;
  let params;
  try { params = subst(st.params || {}); } catch { return ["stop", `${sid}: a value it needs is missing`]; }
  let res = null, attempts = 0;
  if (state.pending[sid]) {
    res = await tool("vault_resume", { resume_token: state.pending[sid], wait_s: waitS() });
  }
  for (;;) {
    if (res === null) {
      if (attempts >= 3 || left() < 1000) return ["stop", `${sid}: gave up`];
      attempts++;
      res = await tool(op, { ...params, idempotency_key: key, wait_s: waitS() });
    }
    const cat = res.category;
    console.log(`log: ${sid} ${op}: ${cat}`);
    if (cat === "success") {
      state.done[sid] = res.data || {}; delete state.pending[sid]; save();
      return ["done", sid];
    }
    if (cat === "approval_pending") {
      state.pending[sid] = res.resume_token; save();
      while (res.category === "approval_pending") {
        if (left() < 2500) return ["wait", `${op} needs approval from ${res.owner} (request ${res.request_id})`];
        res = await tool("vault_resume", { resume_token: state.pending[sid], wait_s: waitS() });
      }
      delete state.pending[sid]; save();
      continue;
    }
    if (cat === "local_failure" || cat === "confirmed_failure") { res = null; continue; }
    if (cat === "rate_limited") {
      const ms = 1000 * (res.retry_after_s ?? 1);
      if (left() - ms < 2000) return ["stop", `${sid}: rate limited past the deadline`];
      await sleep(ms); res = null; continue;
    }
    if (cat === "outcome_unknown") {
      let delay = 100, seen = "unknown";
      for (let i = 0; i < 4 && left() > 1500; i++) {
        const lk = await tool("vault_lookup", { correlation_id: res.correlation_id, operation: op });
        seen = lk.reconciled;
        if (seen === "found") {
          state.done[sid] = ((lk.data || {}).created || [{}])[0]; save();
          return ["done", sid];
        }
        if (seen === "not_found") break;
        await sleep(delay); delay *= 2;
      }
      if (seen !== "not_found") return ["stop", `${sid}: outcome unknown`];
      res = null; continue;
    }
    return ["stop", `${sid}: ${cat}`];
  }
}

let final;
try {
  await client.connect(transport);
  const names = new Set((await client.listTools()).tools.map((t) => t.name));
  final = "done: every step succeeded";
  for (const st of task.steps) {
    if (state.done[String(st.id ?? "")]) continue;
    if (!names.has(st.call)) { final = `not done: no tool ${st.call}`; break; }
    const [how, why] = await step(st);
    if (how === "stop") { final = `not done: ${why}`; break; }
    if (how === "wait") { final = `waiting: ${why}`; break; }
  }
} catch (e) {
  final = `not done: ${e && e.name}`;
  console.error(String(e && e.stack));
}
await client.close(); // ends the bridge (stdin closed) before this process exits
console.log(final);
