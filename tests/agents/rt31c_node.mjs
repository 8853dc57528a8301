// Red team 31 (careful, reconciliation, Node): written from docs/agent-contract.md alone.
//
// Its habit: an idempotency key per step that is long and not ASCII (the run, agent and step id,
// then a note in Cyrillic with a check mark, 200 characters: section 5 says any text goes, sent
// percent-encoded or as its SHA-256, the same on every resend and lookup), and an
// unknown outcome reconciled by a lookup *by that key* (with its operation), not the correlation
// id. A 429's retry_after_s is waited out with setTimeout; 3 attempts in all per step.
import { createConnection } from "node:net";
import { readFileSync } from "node:fs";

const task = JSON.parse(readFileSync(process.env.VAULTSIM_TASK, "utf8"));
const deadline = task.deadline * 1000;
const left = () => deadline - Date.now();
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const NEVER = new Set(["never", "human_required"]);

const sock = createConnection(process.env.VAULTSIM_SOCKET);
const waiting = new Map();
let buf = "";
let n = 0;
let sid = null;
sock.on("data", (d) => {
  buf += d.toString("utf8");
  let i;
  while ((i = buf.indexOf("\n")) >= 0) {
    const msg = JSON.parse(buf.slice(0, i));
    buf = buf.slice(i + 1);
    const w = waiting.get(msg.id);
    if (w) { waiting.delete(msg.id); w(msg); }
  }
});
await new Promise((r) => sock.once("connect", r));

function rpc(method, params = {}) {
  n += 1;
  const id = n;
  const p = sid ? { session_id: sid, ...params } : params;
  sock.write(JSON.stringify({ jsonrpc: "2.0", id, method, params: p }) + "\n");
  return new Promise((r) => waiting.set(id, r)).then((m) =>
    m.result ?? { ok: false, category: "rpc_error", retry: "never", message: String(m.error?.message) });
}

const waitS = () => Math.max(0, Math.min(30, left() / 1000 - 1.5));
const fill = (v, done) => typeof v !== "string" ? v
  : v.replace(/\$\{([^.}]+)\.([^}]+)\}/g, (_, id, f) => String(done[id][f]));
// at most 200 characters on the wire (section 3); percent-encoded, far past 255 (section 5)
const keyOf = (step) => Array.from(`${task.run_id}:${task.agent}:${step.id}:`
  + " — проверка выполнена ✓".repeat(12)).slice(0, 200).join("");

async function settle(r) {
  while (r.category === "approval_pending" && left() > 2000) {
    r = await rpc("call.resume", { resume_token: r.resume_token, wait_s: waitS() });
  }
  return r;
}

async function lookupByKey(op, key) {
  let lk = {};
  for (const pause of [0, 100, 200, 400]) {
    await sleep(pause);
    lk = await rpc("lookup", { idempotency_key: key, operation: op });
    if (lk.reconciled !== "unknown") break;
  }
  return lk;
}

async function runStep(step, done) {
  const op = step.call;
  const params = Object.fromEntries(Object.entries(step.params ?? {}).map(([k, v]) => [k, fill(v, done)]));
  const key = keyOf(step);
  const send = async () => settle(await rpc("call", { operation: op, params, idempotency_key: key, wait_s: waitS() }));
  let r = await send();
  let attempts = 1;
  for (;;) {
    if (r.category === "success") { done[step.id] = r.data ?? {}; return ""; }
    if (r.category === "approval_pending") return `WAITING ${op} request ${r.request_id}`;
    let pause;
    if (r.category === "outcome_unknown") {
      const lk = await lookupByKey(op, key);
      if (NEVER.has(lk.retry)) return `${step.id}: ${lk.category}`;
      if (lk.category === "success" && lk.reconciled === "found") {
        done[step.id] = (lk.data?.created ?? [{}])[0];
        return "";
      }
      if (lk.reconciled !== "not_found") return `${step.id}: outcome unknown, a person must inspect it`;
      pause = (lk.retry_after_s ?? 0) * 1000;
    } else if (NEVER.has(r.retry) || !["bounded", "after_delay"].includes(r.retry)) {
      return `${step.id}: ${r.category}`;
    } else {
      pause = r.category === "rate_limited" ? (r.retry_after_s ?? 1) * 1000 + 20 : 200;
    }
    if (attempts >= 3 || left() < pause + 2500) return `${step.id}: ${r.category}`;
    await sleep(pause);
    attempts += 1;
    r = await send();
  }
}

sid = (await rpc("session.open", { agent: task.agent, run_id: task.run_id })).session_id;
const done = {};
let why = "";
for (const step of task.steps) {
  why = await runStep(step, done);
  if (why) break;
}
console.log(!why ? `done: ${task.steps.length} steps` : why.startsWith("WAITING") ? `waiting: ${why.slice(8)}` : `not done: ${why}`);
sock.end();
