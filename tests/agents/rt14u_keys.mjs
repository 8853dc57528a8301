// Red team, fourteenth pass (unsafe): an agent in Node.js (no npm package), written from
// docs/agent-contract.md and the README alone, as an outside author would.
//
// `node rt14u_keys.mjs MODE`: it does its task as a careful agent does (rt13u_x.mjs's core: one
// session, ${ID.FIELD} filled from results, wait_s inside the deadline, resumes, a lookup after an
// unknown outcome, a final word that says what happened), but its idempotency keys:
//
//   careful   a key per step: RUN_ID:AGENT:STEP_ID (the control)
//   onekey    one key for every step of its task: RUN_ID:AGENT (the contract: never the same for
//             two different steps)
import net from "node:net";
import fs from "node:fs";

const MODE = process.argv[2] || "careful";
const TASK = JSON.parse(fs.readFileSync(process.env.VAULTSIM_TASK, "utf8"));
const RUN_ID = process.env.VAULTSIM_RUN_ID || TASK.run_id;
const DEADLINE = Number(TASK.deadline);
const left = () => DEADLINE - Date.now() / 1000;
const sleep = (s) => new Promise((r) => setTimeout(r, Math.max(0, s) * 1000));
const log = (...a) => process.stderr.write("log: " + a.join(" ") + "\n");

// ---- the wire: one connection, JSON lines, answers matched by id ----
let conn, buf = "", nextId = 1;
const waiting = new Map();
function connect() {
  return new Promise((resolve, reject) => {
    conn = net.createConnection(process.env.VAULTSIM_SOCKET, resolve);
    conn.on("error", reject);
    conn.setEncoding("utf8");
    conn.on("data", (d) => {
      buf += d;
      let i;
      while ((i = buf.indexOf("\n")) >= 0) {
        const line = buf.slice(0, i); buf = buf.slice(i + 1);
        if (!line.trim()) continue;
        let msg; try { msg = JSON.parse(line); } catch { continue; }
        const w = waiting.get(msg.id);
        if (w) { waiting.delete(msg.id); w(msg); }
      }
    });
  });
}
function rpc(method, params) {
  const id = nextId++;
  return new Promise((resolve) => {
    waiting.set(id, resolve);
    conn.write(JSON.stringify({ jsonrpc: "2.0", id, method, params }) + "\n");
  });
}

// ---- the task ----
const results = {};
function fill(v) {
  if (typeof v !== "string") return v;
  return v.replace(/\$\{([^.}]+)\.([^}]+)\}/g, (m, id, field) => {
    const d = results[id];
    if (!d || d[field] === undefined) throw new Error(`no ${field} from ${id}`);
    return String(d[field]);
  });
}

let session;
async function doStep(step) {
  const params = {};
  for (const [k, v] of Object.entries(step.params || {})) params[k] = fill(v);
  const key = MODE === "onekey" ? `${RUN_ID}:${TASK.agent}` : `${RUN_ID}:${TASK.agent}:${step.id}`;
  let attempts = 0;
  for (;;) {
    attempts++;
    const wait = Math.max(0, Math.min(30, left() - 2));
    let r = (await rpc("call", { session_id: session, operation: step.call, params, idempotency_key: key, wait_s: wait })).result;
    if (!r) return { stop: true, why: `${step.call}: refused by the vault` };
    while (r.category === "approval_pending") {
      if (left() < 2) return { stop: true, waiting: true, why: `${step.call} needs approval from ${r.owner}` };
      const w = Math.max(0, Math.min(30, left() - 2));
      r = (await rpc("call.resume", { session_id: session, resume_token: r.resume_token, wait_s: w })).result;
      if (!r) return { stop: true, why: `${step.call}: resume refused` };
    }
    if (r.category === "success") { results[step.id] = r.data || {}; return { ok: true }; }
    if (r.category === "outcome_unknown") {
      for (const pause of [0, 0.1, 0.2, 0.4]) {
        await sleep(pause);
        const l = (await rpc("lookup", { session_id: session, correlation_id: r.correlation_id })).result;
        if (l && l.reconciled === "found") {
          results[step.id] = (l.data && l.data.created && l.data.created[0]) || {};
          return { ok: true };
        }
        if (l && l.reconciled === "not_found") break;
        if (pause === 0.4) return { stop: true, why: `${step.call}: outcome still unknown` };
      }
      if (attempts < 3 && left() > 3) continue;
      return { stop: true, why: `${step.call}: not done` };
    }
    if (r.category === "rate_limited" && attempts < 3 && left() > (r.retry_after_s || 1) + 2) {
      await sleep((r.retry_after_s || 1) + 0.2); continue;
    }
    if ((r.category === "local_failure" || r.category === "confirmed_failure") && attempts < 3 && left() > 3) continue;
    if (r.category === "vault_locked") return { stop: true, why: "the vault is locked" };
    return { stop: true, why: `${step.call}: ${r.category}`, soft: r.retry === "bounded" || r.retry === "after_delay" };
  }
}

async function main() {
  await connect();
  const open = await rpc("session.open", { agent: TASK.agent, run_id: RUN_ID });
  session = open.result.session_id;
  let outcome = { ok: true };
  for (const step of TASK.steps) {
    try { outcome = await doStep(step); } catch (e) { outcome = { stop: true, why: String(e.message) }; }
    if (!outcome.ok) break;
  }
  await rpc("session.close", { session_id: session });
  conn.end();
  let final;
  if (outcome.ok) final = `done: ${TASK.steps.length} step(s)`;
  else if (outcome.waiting) final = `waiting: ${outcome.why}`;
  else final = `not done: ${outcome.why}`;
  fs.writeSync(1, final + "\n");
  process.exit(0);
}
main().catch((e) => { log(e.stack); fs.writeSync(1, `not done: ${e.message}\n`); process.exit(0); });
