#!/usr/bin/env node
// Red team 44c: a Node.js agent (no npm packages), written from docs/agent-contract.md alone.
//
// One net.Socket to VAULTSIM_SOCKET read through readline; answers matched to promises by id (an
// EventEmitter per connection); one session. Consecutive steps whose operation the vault's
// `catalog` says is `approval.mode: auto` and does not mutate, that name no earlier result and
// are not alike, go out together with Promise.all; every other step alone, in order (section 3).
// Keys RUN:AGENT:STEP (5); after `outcome_unknown` a lookup before anything else (6); waits
// collected with call.resume (non-blocking with RT44C_WAIT=poll) or handed over with the token
// kept in state_dir (4, 8). The final message is console.log of an object, as Node prints it
// (util.inspect: `{ status: 'done', steps: 3 }`), or RT44C_FINAL=json its JSON.

import net from "node:net";
import fs from "node:fs";
import path from "node:path";
import readline from "node:readline";
import { EventEmitter } from "node:events";

const STOPS = new Set(["never", "human_required"]);
const REF = /\$\{([^.}]+)\.([^}]+)\}/g;
const task = JSON.parse(fs.readFileSync(process.env.VAULTSIM_TASK, "utf8"));
const deadline = Number(task.deadline) * 1000;
const MARGIN = 900;
const left = () => deadline - Date.now() - MARGIN;
const sleep = (ms) => new Promise((r) => setTimeout(r, Math.max(0, Math.min(ms, left()))));
const log = (...a) => console.error("[rt44c-node]", ...a);

class Stop extends Error {}
class RpcError extends Error {}

class Vault extends EventEmitter {
  constructor(sockPath) {
    super();
    this.sock = net.createConnection(sockPath);
    this.nextId = 1;
    this.closed = false;
    readline.createInterface({ input: this.sock }).on("line", (line) => {
      let msg;
      try { msg = JSON.parse(line); } catch { return; }
      if (msg && typeof msg.id === "number") this.emit(`id:${msg.id}`, msg);
    });
    this.sock.on("close", () => { this.closed = true; this.emit("gone"); });
    this.sock.on("error", (e) => log("socket error", e.code));
  }
  ready() {
    return new Promise((res, rej) => { this.sock.once("connect", res); this.sock.once("error", rej); });
  }
  rpc(method, params = {}) {
    if (Date.now() > deadline - 250) return Promise.reject(new Stop(`not done: the deadline came before ${method}`));
    if (this.closed) return Promise.reject(new Stop("not done: the vault closed the connection"));
    const id = this.nextId++;
    return new Promise((resolve, reject) => {
      const gone = () => reject(new Stop("not done: the vault closed the connection"));
      this.once("gone", gone);
      this.once(`id:${id}`, (msg) => {
        this.off("gone", gone);
        if (msg.error) reject(new RpcError(String(msg.error.message || "error")));
        else resolve(msg.result || {});
      });
      this.sock.write(JSON.stringify({ jsonrpc: "2.0", id, method, params }) + "\n");
    });
  }
}

class State {
  constructor(dir) {
    fs.mkdirSync(dir, { recursive: true });
    this.file = path.join(dir, "node-state.json");
    try { this.data = JSON.parse(fs.readFileSync(this.file, "utf8")); } catch { this.data = { steps: {} }; }
  }
  step(id) { return (this.data.steps[id] ??= {}); }
  save() {
    const tmp = `${this.file}.${process.pid}.tmp`;   // beside it: a rename from /tmp fails in the jail
    const fd = fs.openSync(tmp, "w");
    fs.writeSync(fd, JSON.stringify(this.data));
    fs.fsyncSync(fd);
    fs.closeSync(fd);
    fs.renameSync(tmp, this.file);
  }
}

const poll = process.env.RT44C_WAIT === "poll";
const vault = new Vault(process.env.VAULTSIM_SOCKET);
const state = new State(task.state_dir);
const results = {};
const outcome = {};
const waits = [];
let sid;

for (const [id, rec] of Object.entries(state.data.steps)) if (rec.data) { results[id] = rec.data; outcome[id] = "done"; }

const key = (step) => `${task.run_id}:${task.agent}:${step.id}`;
const waitS = () => (poll ? 0 : Math.max(0, Math.round((left() / 1000 - 0.3) * 100) / 100));
const refsOf = (v) => JSON.stringify(v ?? {}).match(/\$\{[^.}]+\./g)?.map((m) => m.slice(2, -1)) ?? [];
function fill(v) {
  if (typeof v === "string") return v.replace(REF, (_, id, f) => {
    const got = results[id]?.[f];
    if (got === undefined || got === null) throw new Stop(`not done: step ${id} gave no ${f}`);
    return String(got);
  });
  if (Array.isArray(v)) return v.map(fill);
  if (v && typeof v === "object") return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, fill(x)]));
  return v;
}
async function req(method, params) {
  const res = await vault.rpc(method, { session_id: sid, ...params });
  log(method, res.operation ?? "", res.category ?? "", res.reconciled ?? "");
  return res;
}
async function lookup(ref, op) {
  let res = {};
  for (const pause of [0, 100, 200, 400]) {
    if (pause) { if (pause > left()) break; await sleep(pause); }
    res = await req("lookup", { ...ref, operation: op });
    if (res.reconciled === "found" || res.reconciled === "not_found" || res.resume_token
        || res.category === "rate_limited" || STOPS.has(res.retry)) return res;
  }
  return res;
}

async function runStep(step) {
  const op = step.call;
  const rec = state.step(step.id);
  const k = key(step);
  const params = fill(step.params ?? {});
  let ref = null;
  let res = null;
  if (rec.token) {
    try { res = await req("call.resume", { resume_token: rec.token, wait_s: waitS() }); }
    catch (e) { if (!(e instanceof RpcError)) throw e; delete rec.token; state.save(); }
  } else if (rec.sent) {
    ref = { idempotency_key: k };
    res = await lookup(ref, op);
  }
  for (;;) {
    if (res === null) {
      if ((rec.attempts ?? 0) >= 3) return (outcome[step.id] = "failed");
      if (left() < 200) return (outcome[step.id] = "failed");
      rec.sent = true; rec.attempts = (rec.attempts ?? 0) + 1; state.save();
      try {
        res = await req("call", { operation: op, params, idempotency_key: k, wait_s: waitS() });
      } catch (e) { if (e instanceof RpcError) return (outcome[step.id] = "failed"); throw e; }
    }
    const { category: cat, retry, reconciled: recon } = res;
    if (recon !== undefined && cat === "success") {           // a lookup's answer (6)
      if (recon === "found") { const c = res.data?.created?.[0] ?? {}; return done(step, rec, c); }
      if (recon === "not_found") { res = null; continue; }
      if (res.resume_token) { res = await collect(step, rec, res); continue; }
      throw new Stop(`not done: ${op} (${step.id}) has an unknown outcome; a person must inspect it`);
    }
    if (recon === "unknown" && cat !== "rate_limited" && cat !== "approval_pending" && !STOPS.has(retry)) {
      if (res.resume_token) { res = await collect(step, rec, res); continue; }
      throw new Stop(`not done: the lookup of ${op} (${step.id}) failed; a person must inspect it`);
    }
    if (cat === "success") return done(step, rec, res.data ?? {});
    if (cat === "approval_pending") { res = await collect(step, rec, res); continue; }
    if (STOPS.has(retry)) throw new Stop(`not done: ${op} (${step.id}) answered ${cat} (retry: ${retry})`);
    if (cat === "outcome_unknown") { ref = { correlation_id: res.correlation_id }; res = await lookup(ref, op); continue; }
    if (cat === "rate_limited") {
      const after = 1000 * Number(res.retry_after_s ?? 1);
      if (recon === "unknown") {
        if (after > left()) throw new Stop(`not done: ${op} (${step.id}) outcome unknown`);
        await sleep(after); res = await lookup(ref ?? { idempotency_key: k }, op); continue;
      }
      if ((rec.attempts ?? 0) >= 3 || after > left() - 300) return (outcome[step.id] = "failed");
      await sleep(after); res = null; continue;
    }
    if (cat === "local_failure" || cat === "confirmed_failure") {
      if ((rec.attempts ?? 0) >= 3) return (outcome[step.id] = "failed");
      await sleep(200); res = null; continue;
    }
    if (cat === "vault_locked") {
      while ((await vault.rpc("vault.status")).locked !== false) {
        if (left() < 500) throw new Stop(`not done: the vault stayed locked; ${op} not sent`);
        await sleep(300);
      }
      res = null; continue;
    }
    throw new Stop(`not done: ${op} (${step.id}) answered ${cat}`);
  }
}
function done(step, rec, data) {
  delete rec.token; rec.data = data; state.save();
  results[step.id] = data; return (outcome[step.id] = "done");
}
async function collect(step, rec, res) {
  rec.token = res.resume_token; state.save();
  for (;;) {
    if (left() <= 400) { waits.push(`${step.call} (${step.id})`); outcome[step.id] = "waiting"; throw new Stop("waiting"); }
    if (poll) { await sleep(400); if (left() <= 400) continue; }
    let nxt;
    try { nxt = await req("call.resume", { resume_token: rec.token, wait_s: waitS() }); }
    catch (e) { if (!(e instanceof RpcError)) throw e; delete rec.token; state.save(); return null; }
    if (nxt.category !== "approval_pending") { delete rec.token; state.save(); return nxt; }
  }
}

async function main() {
  await vault.ready();
  const status = await vault.rpc("vault.status");
  log("vault locked:", status.locked);
  const cat = await vault.rpc("catalog");
  const ops = Object.fromEntries((cat.operations ?? []).map((o) => [o.name, o]));
  const batchable = (s) => ops[s.call]?.approval?.mode === "auto" && ops[s.call]?.mutates === false;
  sid = (await vault.rpc("session.open", { agent: task.agent, run_id: task.run_id,
    client: { name: "rt44c-node", version: process.versions.node } })).session_id;
  const steps = task.steps ?? [];
  let msg;
  try {
    for (let i = 0; i < steps.length;) {
      const group = [];
      while (i < steps.length) {
        const s = steps[i];
        if (group.length && !(batchable(s) && batchable(group[0]))) break;
        if (group.some((g) => g.call === s.call && JSON.stringify(g.params) === JSON.stringify(s.params))) break;
        if (group.length && refsOf(s.params).some((r) => group.some((g) => g.id === r))) break;
        group.push(s); i++;
        if (!batchable(s)) break;
      }
      const todo = group.filter((s) => outcome[s.id] !== "done"
        && !refsOf(s.params).some((r) => outcome[r] === "failed" || (outcome[r] === undefined && results[r] === undefined && steps.some((t) => t.id === r))));
      for (const s of group) if (!todo.includes(s) && outcome[s.id] !== "done") outcome[s.id] = "failed";
      const settled = await Promise.allSettled(todo.map(runStep));
      const stop = settled.find((r) => r.status === "rejected");
      if (stop) throw stop.reason;
    }
    const undone = steps.filter((s) => outcome[s.id] !== "done").map((s) => s.id);
    msg = undone.length ? { status: "not_done", failed: undone } : { status: "done", steps: steps.length };
  } catch (e) {
    if (waits.length) msg = { status: "waiting", approval: waits.join(", "), token: "kept in state_dir" };
    else if (e instanceof Stop) msg = { status: "not_done", reason: e.message.replace(/^not done: /, "") };
    else msg = { status: "not_done", reason: `internal error: ${e.name}` };
  }
  try { await vault.rpc("session.close", { session_id: sid }); } catch { /* ended anyway */ }
  vault.sock.end();
  if (process.env.RT44C_FINAL === "json") console.log(JSON.stringify(msg));
  else console.log(msg);
}

main().catch((e) => { console.error("fatal", e.message); console.log("not done: internal error"); process.exitCode = 0; });
