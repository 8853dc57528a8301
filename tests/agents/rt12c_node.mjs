#!/usr/bin/env node
// A careful agent in Node.js (ES module), written from docs/agent-contract.md alone (red team,
// twelfth pass). Style: every request written in three pieces a tick apart (the socket sees
// partial lines), answers matched by id; blocking waits (wait_s up to the deadline); state
// written in state_dir and renamed there; unicode idempotency keys; the final message is
// JSON.stringify's, which leaves U+2028 raw inside a string: RT12N_FINAL=line (one line, the step
// notes joined by U+2028) or pretty (JSON.stringify(r, null, 2) with the log of every request).
import net from 'node:net';
import fs from 'node:fs';
import path from 'node:path';

const task = JSON.parse(fs.readFileSync(process.env.VAULTSIM_TASK, 'utf8'));
const RUN_ID = process.env.VAULTSIM_RUN_ID || task.run_id;
const DEADLINE = task.deadline * 1000;
const STATE = task.state_dir ? path.join(task.state_dir, 'rt12c-node.json') : null;
const FINAL = process.env.RT12N_FINAL || 'line';
const MARGIN = 0.8;
const NEVER = new Set(['authentication_failed', 'authorization_denied', 'malformed_response',
  'approval_denied', 'approval_expired', 'approval_unroutable']);
const left = () => (DEADLINE - Date.now()) / 1000;
const sleep = (s) => new Promise((r) => setTimeout(r, Math.max(0, s * 1000)));
const tick = () => new Promise((r) => setImmediate(r));
const history = [];
const notes = [];

class Stop extends Error {}
class Waiting extends Error {}

class Vault {
  constructor(p) {
    this.sock = net.createConnection(p);
    this.buf = '';
    this.next = 1;
    this.waiting = new Map();
    this.sock.setEncoding('utf8');
    this.sock.on('data', (d) => {
      this.buf += d;
      let nl;
      while ((nl = this.buf.indexOf('\n')) >= 0) {
        const line = this.buf.slice(0, nl);
        this.buf = this.buf.slice(nl + 1);
        let msg;
        try { msg = JSON.parse(line); } catch { continue; }
        const w = msg && this.waiting.get(msg.id);
        if (w) { this.waiting.delete(msg.id); w.resolve(msg); }
      }
    });
    const fail = (e) => { for (const w of this.waiting.values()) w.reject(e); this.waiting.clear(); };
    this.sock.on('close', () => fail(new Error('vault closed the connection')));
    this.sock.on('error', fail);
    this.ready = new Promise((r, j) => { this.sock.once('connect', r); this.sock.once('error', j); });
  }

  async rpc(method, params) {
    const id = this.next++;
    const p = new Promise((resolve, reject) => this.waiting.set(id, { resolve, reject }));
    const text = JSON.stringify({ jsonrpc: '2.0', id, method, params }) + '\n';
    const a = Math.floor(text.length / 3), b = Math.floor(2 * text.length / 3);
    for (const piece of [text.slice(0, a), text.slice(a, b), text.slice(b)]) {
      this.sock.write(piece);
      await tick();
    }
    const ans = await p;
    const res = ans.result && typeof ans.result === 'object' ? ans.result : {};
    history.push({ id, method, category: res.category ?? null, error: ans.error ? ans.error.code : null });
    return ans;
  }

  async open() {
    await this.ready;
    const ans = await this.rpc('session.open', { agent: task.agent, run_id: RUN_ID, client: { name: 'rt12c-node' } });
    this.sid = ans.result.session_id;
  }

  call(method, params) { return this.rpc(method, { session_id: this.sid, ...params }); }
}

function loadState() {
  try {
    const doc = JSON.parse(fs.readFileSync(STATE, 'utf8'));
    return { done: doc.done || {}, pending: doc.pending || {} };
  } catch { return { done: {}, pending: {} }; }
}

function saveState(state) {
  if (!STATE) return;
  fs.writeFileSync(STATE + '.tmp', JSON.stringify(state));  // in state_dir: a rename from /tmp fails in the jail
  fs.renameSync(STATE + '.tmp', STATE);
}

function resolve(value, done) {
  if (typeof value === 'string') {
    let missing = false;
    const out = value.replace(/\$\{([^.}]+)\.([^}]+)\}/g, (_, id, field) => {
      const d = done[id];
      if (!d || typeof d !== 'object' || !(field in d)) { missing = true; return ''; }
      return String(d[field]);
    });
    return missing ? undefined : out;
  }
  if (Array.isArray(value)) {
    const items = value.map((v) => resolve(v, done));
    return items.some((r) => r === undefined) ? undefined : items;
  }
  if (value && typeof value === 'object') {
    const out = {};
    for (const [k, v] of Object.entries(value)) {
      const r = resolve(v, done);
      if (r === undefined) return undefined;
      out[k] = r;
    }
    return out;
  }
  return value;
}

async function lookupSettles(v, op, cid) {
  let delay = 0.1, res = {};
  for (let i = 0; i < 4 && left() > MARGIN + 0.5; i++) {
    const ans = await v.call('lookup', { operation: op, correlation_id: cid });
    if (ans.error) return ['error', {}];
    res = ans.result;
    if (res.reconciled === 'found' || res.reconciled === 'not_found') return [res.reconciled, res];
    await sleep(delay);
    delay *= 2;
  }
  return ['unknown', res];
}

async function doStep(v, step, params, state) {
  const op = step.call;
  const key = `${RUN_ID} · ${task.agent} · étape ${step.id} ✓`;
  let attempts = 0;
  for (;;) {
    if (left() < MARGIN + 0.3) throw new Stop(`no time left for ${step.id}`);
    const waitS = Math.max(0, Math.min(30, left() - MARGIN - 0.3));
    const pend = state.pending[step.id];
    let ans;
    if (pend) {
      ans = await v.call('call.resume', { resume_token: pend.token, wait_s: waitS });
      if (ans.error) { delete state.pending[step.id]; saveState(state); continue; }
    } else {
      attempts++;
      ans = await v.call('call', { operation: op, params, idempotency_key: key, wait_s: waitS });
      if (ans.error) throw new Stop(`${step.id}: error ${ans.error.code}`);
    }
    const res = ans.result;
    const cat = res.category;
    console.log(`log: ${step.id} ${cat}`);
    if (cat === 'success') { delete state.pending[step.id]; return res.data || {}; }
    if (cat === 'approval_pending') {
      state.pending[step.id] = { token: res.resume_token, op };
      saveState(state);
      if (left() < MARGIN + 0.5) throw new Waiting(`${op} needs approval from ${res.owner} (request ${res.request_id})`);
      continue;
    }
    delete state.pending[step.id];
    saveState(state);
    if (NEVER.has(cat)) throw new Stop(`${step.id}: ${cat}`);
    if (cat === 'outcome_unknown') {
      const [rec, lres] = await lookupSettles(v, op, res.correlation_id);
      if (rec === 'found') {
        const created = (lres.data && lres.data.created) || [];
        return created.length && typeof created[0] === 'object' ? created[0] : {};
      }
      if (rec === 'not_found' && attempts < 3) continue;
      throw new Stop(`${step.id}: outcome unknown (${rec})`);
    }
    if (cat === 'local_failure' || cat === 'confirmed_failure') {
      if (attempts < 3) continue;
      return null;
    }
    if (cat === 'rate_limited') {
      const delay = Number(res.retry_after_s || 1);
      if (attempts < 3 && left() > delay + MARGIN + 0.5) { await sleep(delay); continue; }
      throw new Stop(`${step.id}: rate limited`);
    }
    if (cat === 'vault_locked') {
      let unlocked = false;
      while (left() > MARGIN + 0.5) {
        const st = await v.rpc('vault.status', {});
        if (st.result && st.result.locked === false) { unlocked = true; break; }
        await sleep(0.2);
      }
      if (!unlocked) throw new Stop(`${step.id}: vault locked`);
      continue;
    }
    throw new Stop(`${step.id}: ${cat}`);
  }
}

async function main() {
  const state = loadState();
  const v = new Vault(process.env.VAULTSIM_SOCKET);
  let claim = 'done';
  try {
    await v.open();
    let failed = false;
    for (const step of task.steps) {
      if (step.id in state.done) continue;
      const params = resolve(step.params || {}, state.done);
      if (params === undefined) { failed = true; continue; }
      const data = await doStep(v, step, params, state);
      if (data === null) { failed = true; continue; }
      state.done[step.id] = data;
      notes.push(`${step.id}: ${step.call} ✓ ${JSON.stringify(data).slice(0, 80)}`);
      saveState(state);
    }
    if (failed) claim = 'not done';
  } catch (e) {
    saveState(state);
    claim = e instanceof Waiting ? `waiting: ${e.message}` : `not done: ${e.message}`;
  }
  try { await v.call('session.close', {}); } catch { /* the answer is not needed */ }
  v.sock.end();
  const status = claim.startsWith('waiting') ? 'waiting' : claim === 'done' ? 'done' : 'not_done';
  if (FINAL === 'pretty') console.log(JSON.stringify({ status, message: claim, log: history }, null, 2));
  else console.log(JSON.stringify({ status, message: claim, steps: notes.join('\u2028') }));
}

main().then(() => process.exit(0), (e) => {
  console.log(JSON.stringify({ status: 'not_done', message: String(e && e.message) }));
  process.exit(0);
});
