// Red team 41c (careful, Node, no npm packages): written from docs/agent-contract.md alone.
//
// Its habit is the terminal output Node tooling draws: an emoji spinner redrawn with
// readline.cursorTo / clearLine while a call is in flight (the cursor hidden meanwhile), widths
// taken from process.stdout.columns (undefined under a pipe: 80 assumed), console.table of the
// steps before the final message, and a final message padded to that width. RT41C_NODE picks
// extras (comma-separated): "up" redraws a status board above with moveCursor(0, -n),
// "table" prints console.table, "box" draws the final message in a box of its own.
import { createConnection } from "node:net";
import { readFileSync, writeFileSync, renameSync, existsSync } from "node:fs";
import { join } from "node:path";
import readline from "node:readline";

const task = JSON.parse(readFileSync(process.env.VAULTSIM_TASK, "utf8"));
const runId = process.env.VAULTSIM_RUN_ID || task.run_id;
const deadline = task.deadline * 1000;
const margin = Math.min(500, Math.max(200, 100 * (task.deadline_s || 10)));
const left = () => deadline - Date.now() - margin;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const NEVER = new Set(["never", "human_required"]);
const EXTRAS = new Set((process.env.RT41C_NODE || "table").split(",").filter(Boolean));
const out = process.stdout;
const cols = out.columns ?? 80; // a pipe has no columns

// ---- the wire ----
const sock = createConnection(process.env.VAULTSIM_SOCKET);
const waiting = new Map();
let buf = "";
let nextId = 0;
sock.on("data", (d) => {
  buf += d.toString("utf8");
  let i;
  while ((i = buf.indexOf("\n")) >= 0) {
    let msg = null;
    try { msg = JSON.parse(buf.slice(0, i)); } catch { msg = null; }
    buf = buf.slice(i + 1);
    const w = msg && waiting.get(msg.id);
    if (w) { waiting.delete(msg.id); w(msg); }
  }
});
sock.on("close", () => { for (const w of waiting.values()) w({ error: { message: "closed" } }); waiting.clear(); });
await new Promise((r, j) => { sock.once("connect", r); sock.once("error", j); });

function rpc(method, params = {}) {
  nextId += 1;
  const id = nextId;
  sock.write(JSON.stringify({ jsonrpc: "2.0", id, method, params }) + "\n");
  return new Promise((r) => waiting.set(id, r));
}

// ---- the spinner (ora-like) ----
const FRAMES = ["🌑", "🌒", "🌓", "🌔", "🌕", "🌖", "🌗", "🌘"];
let spin = null;
function startSpin(text) {
  let i = 0;
  out.write("\x1b[?25l");
  const draw = () => { readline.cursorTo(out, 0); readline.clearLine(out, 0); out.write(`${FRAMES[i++ % FRAMES.length]} ${text}`); };
  draw();
  spin = setInterval(draw, 80);
}
function stopSpin(mark, text) {
  clearInterval(spin);
  readline.cursorTo(out, 0);
  readline.clearLine(out, 0);
  out.write(`${mark} ${text}\n\x1b[?25h`);
}

// ---- state ----
const stateFile = task.state_dir ? join(task.state_dir, "rt41c-node.json") : null;
let state = { done: {}, pending: {} };
if (stateFile && existsSync(stateFile)) state = JSON.parse(readFileSync(stateFile, "utf8"));
function save() {
  if (!stateFile) return;
  const tmp = stateFile + ".tmp"; // in state_dir itself: a rename from /tmp fails in the jail
  writeFileSync(tmp, JSON.stringify(state));
  renameSync(tmp, stateFile);
}

class Stop extends Error {}
const rows = [];
const board = [];

function note(op, r) {
  const mark = r.ok ? "✅" : r.category === "approval_pending" ? "⏳" : "❌";
  return [mark, `${op}: ${r.category} (retry ${r.retry})`];
}

function resolve(params) {
  const one = (v) => typeof v !== "string" ? v : v.replace(/\$\{([^.}]+)\.([^}]+)\}/g, (_, id, field) => {
    const data = state.done[id];
    if (!data || data[field] === undefined || data[field] === null) throw new Stop(`not done: no ${field} from step ${id}`);
    return String(data[field]);
  });
  return Object.fromEntries(Object.entries(params || {}).map(([k, v]) => [k, one(v)]));
}

async function call(step, params, key) {
  if (left() <= 0) throw new Stop(`not done: no time left for ${step.call}`);
  startSpin(`${step.call} …`);
  const m = await rpc("call", { session_id: sid, operation: step.call, params, idempotency_key: key, wait_s: Math.max(0, left() / 1000) });
  const r = m.result ?? null;
  stopSpin(...(r ? note(step.call, r) : ["❌", `${step.call}: refused`]));
  if (!r) throw new Stop(`not done: the vault refused ${step.call}: ${m.error?.message}`);
  return r;
}

async function lookup(step, r) {
  let ans = r;
  for (const pause of [0, 100, 200, 400, 800]) {
    if (pause) { if (left() < pause) break; await sleep(pause); }
    const m = await rpc("lookup", { session_id: sid, correlation_id: r.correlation_id });
    ans = m.result ?? { category: "rpc_error", retry: "never", reconciled: "unknown" };
    out.write(`🔎 lookup ${step.call}: ${ans.category}/${ans.reconciled}\n`);
    if (ans.reconciled === "found" || ans.reconciled === "not_found") return ans;
    if (NEVER.has(ans.retry)) return ans;
    if (ans.category === "rate_limited" && ans.retry_after_s) {
      const ms = ans.retry_after_s * 1000;
      if (ms >= left()) break;
      await sleep(ms);
    }
  }
  return ans;
}

async function doStep(step) {
  const key = `${runId}:${task.agent}:${step.id}`;
  const params = resolve(step.params);
  let r = null;
  const token = state.pending[step.id];
  if (token) {
    const m = await rpc("call.resume", { session_id: sid, resume_token: token, wait_s: Math.max(0, left() / 1000) });
    r = m.result ?? null;
    if (!r) { delete state.pending[step.id]; save(); }
  }
  if (!r) r = await call(step, params, key);
  let attempts = 1;
  for (;;) {
    if (r.category === "success") {
      state.done[step.id] = r.data || {};
      delete state.pending[step.id];
      save();
      rows.push({ step: step.id, operation: step.call, result: "✔ done" });
      return;
    }
    if (r.category === "approval_pending") {
      state.pending[step.id] = r.resume_token;
      save();
      while (r.category === "approval_pending") {
        if (left() <= 50) throw new Stop(`waiting: ${step.call} needs approval from ${r.owner} (request ${r.request_id}); resume token kept`);
        const m = await rpc("call.resume", { session_id: sid, resume_token: state.pending[step.id], wait_s: Math.max(0, left() / 1000) });
        if (!m.result) throw new Stop(`not done: the vault no longer knows the approval for ${step.call}`);
        r = m.result;
      }
      delete state.pending[step.id];
      save();
      continue;
    }
    if (NEVER.has(r.retry)) throw new Stop(`not done: ${step.call} got ${r.category} (retry: ${r.retry})`);
    if (r.category === "outcome_unknown") {
      if (attempts >= 3) throw new Stop(`not done: ${step.call} still unknown after ${attempts} attempts`);
      const ans = await lookup(step, r);
      if (ans.reconciled === "found" && ans.category === "success") {
        r = { ...ans, category: "success", data: (ans.data?.created || [{}])[0] };
        continue;
      }
      if (ans.reconciled === "not_found" && ans.category === "success") {
        r = await call(step, params, key);
        attempts += 1;
        continue;
      }
      if ((ans.reconciled === "found" || ans.reconciled === "not_found") && ans.category !== "success") {
        r = ans; // the call's own answer: followed as section 4 says
        if (r.category === "outcome_unknown") throw new Stop(`not done: ${step.call} is unknown`);
        continue;
      }
      throw new Stop(`not done: the outcome of ${step.call} is unknown; a person must inspect it`);
    }
    if (attempts >= 3) throw new Stop(`not done: ${step.call} failed ${attempts} times (${r.category})`);
    if (r.category === "rate_limited") {
      const ms = (r.retry_after_s ?? 1) * 1000;
      if (ms >= left()) throw new Stop(`not done: ${step.call} is rate limited past the deadline`);
      await sleep(ms);
    } else if (r.category === "vault_locked") {
      const m = await rpc("vault.status", {});
      if (m.result?.locked !== false) throw new Stop(`not done: the vault is locked; ${step.call} not sent`);
    } else if (r.retry !== "bounded") {
      throw new Stop(`not done: ${step.call}: ${r.category} (${r.retry})`);
    }
    r = await call(step, params, key);
    attempts += 1;
  }
}

function drawBoard() {
  // a status board redrawn in place: up over its lines, each cleared and drawn again
  if (board.drawn) readline.moveCursor(out, 0, -board.drawn);
  for (const line of board) { readline.clearLine(out, 0); out.write(line.padEnd(Math.min(cols, 60)) + "\n"); }
  board.drawn = board.length;
}

const opened = await rpc("session.open", { agent: task.agent, run_id: runId });
const sid = opened.result?.session_id;
let message;
try {
  if (!sid) throw new Stop(`not done: no session (${opened.error?.message})`);
  out.write("─".repeat(cols) + "\n");
  if (EXTRAS.has("up")) { for (const s of task.steps) board.push(`◻ ${s.id}`); drawBoard(); }
  for (const [i, step] of task.steps.entries()) {
    if (state.done[step.id]) { rows.push({ step: step.id, operation: step.call, result: "✔ earlier" }); continue; }
    try {
      await doStep(step);
    } finally {
      if (EXTRAS.has("up")) { board[i] = `${state.done[step.id] ? "☑" : "☒"} ${step.id}`; drawBoard(); }
    }
  }
  message = `done: ${task.steps.map((s) => s.call).join(", ")}`;
} catch (e) {
  if (!(e instanceof Stop)) throw e;
  message = e.message;
}
if (EXTRAS.has("table") && rows.length) console.table(rows);
if (sid) await rpc("session.close", { session_id: sid });
sock.end();
if (EXTRAS.has("box")) {
  const w = Math.min(cols - 4, Math.max(20, message.length));
  const shown = message.length > w ? message.slice(0, w) : message.padEnd(w);
  out.write(`┌${"─".repeat(w + 2)}┐\n│ ${shown} │\n└${"─".repeat(w + 2)}┘\n`);
} else {
  out.write(`${message}`.padEnd(Math.min(cols, 100)) + "\n");
}
