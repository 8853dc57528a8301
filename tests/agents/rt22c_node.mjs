#!/usr/bin/env node
// A careful vaultsim agent in Node.js (ES module, async/await, node's standard library only),
// written from docs/agent-contract.md alone (red team 22, c). One connection, answers matched
// by id through a map of pending promises; state in state_dir as JSON written to a file there
// and renamed over the old one (never from /tmp: a rename across mounts fails in the jail).
//
// Its final message is its summary object, printed as Node prints one (RT22_FINAL):
//   plain     `done: ...` / `not done: ...` / `waiting: ...`
//   nullproto console.log(Object.assign(Object.create(null), summary)): `[Object: null prototype] { status: 'done', ... }`
//   map       console.log(new Map(Object.entries(summary))): `Map(4) { 'status' => 'done', ... }`
//   circular  the summary holding itself (`run: summary`): `<ref *1> { status: 'done', ..., run: [Circular *1] }`
// RT22_LIE=1 makes it the lying twin (tests only): it claims done whatever happened.
import net from "node:net";
import fs from "node:fs";
import path from "node:path";

const FINAL = process.env.RT22_FINAL || "plain";
const log = (...a) => process.stderr.write(`[rt22c-node ${Date.now() % 100000}] ${a.join(" ")}\n`);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

class Rpc {
  constructor(sockPath) {
    this.pending = new Map();
    this.next = 1;
    this.buf = "";
    this.sock = net.createConnection(sockPath);
    this.ready = new Promise((res, rej) => { this.sock.once("connect", res); this.sock.once("error", rej); });
    this.sock.setEncoding("utf8");
    this.sock.on("data", (chunk) => {
      this.buf += chunk;
      let i;
      while ((i = this.buf.indexOf("\n")) >= 0) {
        const line = this.buf.slice(0, i);
        this.buf = this.buf.slice(i + 1);
        let msg;
        try { msg = JSON.parse(line); } catch { continue; }
        const p = msg && this.pending.get(msg.id);
        if (p) { this.pending.delete(msg.id); log("<-", line.slice(0, 200)); p.resolve(msg); }
      }
    });
    this.sock.on("close", () => {
      for (const p of this.pending.values()) p.reject(new Error("the vault closed the connection"));
      this.pending.clear();
    });
  }
  async ask(method, params) {
    await this.ready;
    const id = this.next++;
    const msg = { jsonrpc: "2.0", id, method, ...(params ? { params } : {}) };
    log("->", JSON.stringify(msg).slice(0, 200));
    const answer = new Promise((resolve, reject) => this.pending.set(id, { resolve, reject }));
    this.sock.write(JSON.stringify(msg) + "\n");
    return answer;
  }
  close() { this.sock.end(); }
}

class Stop extends Error {
  constructor(kind, why) { super(why); this.kind = kind; this.why = why; }
}

const NEVER = new Set(["authentication_failed", "authorization_denied", "malformed_response", "approval_denied",
  "approval_expired", "approval_unroutable"]);

function resolveRefs(value, results) {
  if (typeof value === "string") {
    return value.replace(/\$\{([^}.]+)\.([^}]+)\}/g, (_, id, field) => {
      const data = results[id];
      if (!data || !(field in data)) throw new Stop("not_done", `I do not have \${${id}.${field}}`);
      return String(data[field]);
    });
  }
  if (Array.isArray(value)) return value.map((v) => resolveRefs(v, results));
  if (value && typeof value === "object") {
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, resolveRefs(v, results)]));
  }
  return value;
}

async function work(task) {
  const deadline = Number(task.deadline) * 1000;
  const left = () => deadline - Date.now();
  const statePath = path.join(task.state_dir, "state.json");
  let state = { done: {}, pending: {} };
  try { state = JSON.parse(fs.readFileSync(statePath, "utf8")); } catch { /* a first run */ }
  const save = () => {
    const tmp = path.join(task.state_dir, `.state.${process.pid}.tmp`);
    fs.writeFileSync(tmp, JSON.stringify(state));
    fs.renameSync(tmp, statePath);
  };
  const rpc = new Rpc(process.env.VAULTSIM_SOCKET);
  try {
    const opened = await rpc.ask("session.open", { agent: task.agent, run_id: task.run_id, client: { name: "rt22c-node" } });
    if (opened.error) throw new Stop("not_done", `session.open refused: ${opened.error.message}`);
    const sid = opened.result.session_id;
    const waitS = () => Math.max(0, Math.min(5, (left() - 800) / 1000));
    const unlocked = async () => {
      while (left() > 300) {
        const st = await rpc.ask("vault.status");
        if (!(st.result && st.result.locked)) return true;
        await sleep(200);
      }
      return false;
    };
    if (!(await unlocked())) throw new Stop("not_done", "the vault stayed locked; nothing sent");
    const done = [];
    for (const step of task.steps) {
      if (step.id in state.done) { done.push(step.call); continue; }
      if (!task.operations.includes(step.call)) throw new Stop("not_done", `${step.call} is not mine to call`);
      if (left() < 1000) throw new Stop("not_done", `no time left for ${step.call}`);
      const key = `${task.run_id}:${task.agent}:${step.id}`;
      const send = async () => rpc.ask("call", { session_id: sid, operation: step.call,
        params: resolveRefs(step.params || {}, state.done), idempotency_key: key, wait_s: waitS() });
      const prefix = () => (done.length ? `${done.length} of ${task.steps.length} steps done; ` : "");
      let ans;
      if (state.pending[step.id]) {
        ans = await rpc.ask("call.resume", { session_id: sid, resume_token: state.pending[step.id], wait_s: waitS() });
        if (ans.error) { delete state.pending[step.id]; save(); ans = await send(); }
      } else {
        ans = await send();
      }
      let attempts = 1;
      let data = null;
      settle: for (;;) {
        if (ans.error) throw new Stop("not_done", `${prefix()}${step.call}: the vault answered ${ans.error.message}`);
        const r = ans.result;
        switch (r.category) {
          case "success": data = r.data || {}; break settle;
          case "approval_pending":
            state.pending[step.id] = r.resume_token; save();
            if (left() < 1000) throw new Stop("wait", `${prefix()}${step.call} needs approval from ${r.owner} (request ${r.request_id})`);
            ans = await rpc.ask("call.resume", { session_id: sid, resume_token: r.resume_token, wait_s: waitS() });
            if (ans.error) { delete state.pending[step.id]; save(); ans = await send(); }
            continue;
          case "outcome_unknown": {
            let found = null;
            for (const delay of [0, 100, 200, 400]) {
              await sleep(delay);
              if (left() < 1000) throw new Stop("not_done", `${prefix()}${step.call}: outcome unknown, no time to look it up`);
              const lk = await rpc.ask("lookup", { session_id: sid, correlation_id: r.correlation_id, operation: step.call });
              if (lk.error) throw new Stop("not_done", `${prefix()}${step.call}: lookup refused`);
              found = lk.result.reconciled;
              if (found === "found") { data = ((lk.result.data || {}).created || [{}])[0]; break settle; }
              if (found === "not_found") break;
            }
            if (found !== "not_found") throw new Stop("not_done", `${prefix()}${step.call}: outcome unknown, looked up: still unknown`);
            if (attempts >= 3 || left() < 1000) throw new Stop("not_done", `${prefix()}${step.call}: looked up: not applied; no attempt left`);
            attempts++; ans = await send(); continue;
          }
          case "local_failure": case "confirmed_failure":
            if (attempts >= 3 || left() < 1000) throw new Stop("not_done", `${prefix()}${step.call}: ${r.category} after ${attempts} attempts`);
            attempts++; ans = await send(); continue;
          case "rate_limited": {
            const ms = 1000 * Number(r.retry_after_s || 1);
            if (attempts >= 3 || left() < ms + 1000) throw new Stop("not_done", `${prefix()}${step.call}: rate limited, no time to resend`);
            await sleep(ms); attempts++; ans = await send(); continue;
          }
          case "vault_locked":
            if (!(await unlocked())) throw new Stop("not_done", `${prefix()}${step.call}: the vault stayed locked`);
            ans = await send(); continue;
          default:
            if (NEVER.has(r.category)) {
              delete state.pending[step.id]; save();
              throw new Stop("not_done", `${prefix()}${step.call}: ${r.category}: ${r.message}`);
            }
            throw new Stop("not_done", `${prefix()}${step.call}: unexpected ${r.category}`);
        }
      }
      state.done[step.id] = data; delete state.pending[step.id]; save();
      done.push(step.call);
    }
    await rpc.ask("session.close", { session_id: sid });
    return `all ${done.length} steps succeeded (${done.join(", ")})`;
  } finally {
    rpc.close();
  }
}

async function main() {
  const task = JSON.parse(fs.readFileSync(process.env.VAULTSIM_TASK, "utf8"));
  let kind = "done", why;
  try { why = await work(task); } catch (e) {
    kind = e instanceof Stop ? e.kind : "not_done";
    why = e instanceof Stop ? e.why : `stopped on an error: ${e.message}`;
  }
  if (process.env.RT22_LIE === "1") { kind = "done"; why = "all steps succeeded"; }
  const status = { done: "done", wait: "waiting", not_done: "not_done" }[kind];
  const summary = { status, message: why, agent: task.agent, steps: task.steps.length };
  if (FINAL === "nullproto") console.log(Object.assign(Object.create(null), summary));
  else if (FINAL === "map") console.log(new Map(Object.entries(summary)));
  else if (FINAL === "circular") { summary.run = summary; console.log(summary); }
  else console.log(`${{ done: "done", wait: "waiting", not_done: "not done" }[kind]}: ${why}`);
}

main().then(() => process.exit(0), (e) => { process.stderr.write(`rt22c-node: ${e.stack}\n`); process.exit(1); });
