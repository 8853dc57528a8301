#!/usr/bin/env node
// A careful agent in Node.js, written from docs/agent-contract.md alone.
// Style: async/await over one multiplexed connection; reads `catalog` first and
// validates each step; non-blocking (wait_s: 0, then call.resume with short waits);
// looks up by idempotency_key; logs on stderr; final message a JSON object.
'use strict';
const net = require('net');
const fs = require('fs');
const path = require('path');

const task = JSON.parse(fs.readFileSync(process.env.VAULTSIM_TASK, 'utf8'));
const RUN_ID = process.env.VAULTSIM_RUN_ID || task.run_id;
const DEADLINE = task.deadline * 1000;
const STATE = path.join(task.state_dir, 'node-agent.json');
const NEVER = new Set(['authentication_failed', 'authorization_denied', 'malformed_response',
  'approval_denied', 'approval_expired', 'approval_unroutable']);
const left = () => (DEADLINE - Date.now()) / 1000;
const sleep = (s) => new Promise((r) => setTimeout(r, Math.max(0, s * 1000)));
const log = (...a) => console.error('[node-agent]', ...a);

class Stop extends Error { constructor(status, msg) { super(msg); this.status = status; } }

class Vault {
  constructor(p) {
    this.sock = net.createConnection(p);
    this.buf = '';
    this.next = 1;
    this.waiting = new Map();
    this.sock.setEncoding('utf8');
    this.sock.on('data', (d) => {
      this.buf += d;
      let i;
      while ((i = this.buf.indexOf('\n')) >= 0) {
        const line = this.buf.slice(0, i);
        this.buf = this.buf.slice(i + 1);
        let msg;
        try { msg = JSON.parse(line); } catch (e) { continue; }
        const w = this.waiting.get(msg.id);
        if (!w) continue;
        this.waiting.delete(msg.id);
        w(msg);
      }
    });
    const fail = (e) => { for (const w of this.waiting.values()) w({ error: { code: -1, message: String(e || 'closed') } }); this.waiting.clear(); };
    this.sock.on('error', fail);
    this.sock.on('close', () => fail('connection closed'));
    this.ready = new Promise((res, rej) => { this.sock.once('connect', res); this.sock.once('error', rej); });
  }
  rpc(method, params) {
    if (left() <= 0) return Promise.reject(new Stop('not_done', 'deadline reached'));
    const id = this.next++;
    return new Promise((res) => {
      this.waiting.set(id, res);
      this.sock.write(JSON.stringify({ jsonrpc: '2.0', id, method, params: params || {} }) + '\n');
    });
  }
  close() { this.sock.end(); }
}

function loadState() {
  try { return JSON.parse(fs.readFileSync(STATE, 'utf8')); } catch (e) { return { done: {}, pending: {} }; }
}
function saveState(st) {
  fs.writeFileSync(STATE + '.tmp', JSON.stringify(st));
  fs.renameSync(STATE + '.tmp', STATE);
}
function subst(v, done) {
  if (typeof v === 'string') {
    return v.replace(/\$\{([^.}]+)\.([^}]+)\}/g, (m, id, field) => {
      if (!(id in done) || done[id] == null || !(field in done[id])) throw new Stop('not_done', `no value for ${m}`);
      return String(done[id][field]);
    });
  }
  if (Array.isArray(v)) return v.map((x) => subst(x, done));
  if (v && typeof v === 'object') { const o = {}; for (const k of Object.keys(v)) o[k] = subst(v[k], done); return o; }
  return v;
}

async function main() {
  const st = loadState();
  const v = new Vault(process.env.VAULTSIM_SOCKET);
  await v.ready;
  // three requests in flight at once, answered in any order
  const [opened, catalog, status] = await Promise.all([
    v.rpc('session.open', { agent: task.agent, run_id: RUN_ID, client: { name: 'node-agent', version: '1' } }),
    v.rpc('catalog'),
    v.rpc('vault.status'),
  ]);
  if (opened.error) throw new Stop('not_done', `session.open refused: ${opened.error.message}`);
  const sid = opened.result.session_id;
  log('session', sid, 'locked:', status.result && status.result.locked);
  // `operations` is a list of entries, each with its `name`
  const ops = {};
  for (const e of (catalog.result && catalog.result.operations) || []) ops[e.name] = e;
  for (const step of task.steps) {
    if (!task.operations.includes(step.call)) throw new Stop('not_done', `${step.id}: ${step.call} is not one of my operations`);
    if (Object.keys(ops).length && !(step.call in ops)) throw new Stop('not_done', `${step.id}: ${step.call} unknown to the vault`);
  }
  try {
    for (const step of task.steps) {
      if (step.id in st.done) { log(step.id, 'already done'); continue; }
      await doStep(v, sid, st, step);
    }
  } finally {
    await v.rpc('session.close', { session_id: sid }).catch(() => {});
    v.close();
  }
  return { status: 'done', message: `all ${task.steps.length} steps succeeded` };
}

async function doStep(v, sid, st, step) {
  const op = step.call;
  const params = subst(step.params || {}, st.done);
  const key = `${RUN_ID}:${task.agent}:${step.id}`;
  let attempts = 0;
  let token = st.pending[step.id];
  for (;;) {
    let ans;
    if (token) {
      ans = await v.rpc('call.resume', { session_id: sid, resume_token: token, wait_s: Math.max(0, Math.min(1, left() - 3)) });
      if (ans.error) { log(step.id, 'token unknown to the vault; calling again'); token = null; delete st.pending[step.id]; saveState(st); continue; }
    } else {
      if (attempts >= 3) throw new Stop('not_done', `${step.id}: ${op} failed 3 times`);
      attempts++;
      ans = await v.rpc('call', { session_id: sid, operation: op, params, idempotency_key: key, wait_s: 0 });
      if (ans.error) throw new Stop('not_done', `${step.id}: refused: ${ans.error.message}`);
    }
    const r = ans.result;
    log(step.id, op, '->', r.category);
    if (r.category === 'success') { st.done[step.id] = r.data || {}; delete st.pending[step.id]; saveState(st); return; }
    if (NEVER.has(r.category)) { delete st.pending[step.id]; saveState(st); throw new Stop('not_done', `${step.id}: ${r.category}: ${r.message}`); }
    token = null;
    switch (r.category) {
      case 'local_failure':
      case 'confirmed_failure':
        continue;
      case 'rate_limited': {
        const d = Number(r.retry_after_s || 1);
        if (attempts >= 3 || left() < d + 1) throw new Stop('not_done', `${step.id}: rate limited`);
        await sleep(d);
        continue;
      }
      case 'vault_locked':
        for (;;) {
          if (left() < 1.5) throw new Stop('not_done', `${step.id}: the vault stayed locked`);
          const s = await v.rpc('vault.status');
          if (s.result && s.result.locked === false) break;
          await sleep(0.25);
        }
        continue;
      case 'outcome_unknown': {
        const got = await reconcile(v, sid, op, key);
        if (got) { st.done[step.id] = got; saveState(st); return; }
        continue;
      }
      case 'approval_pending':
        token = r.resume_token;
        st.pending[step.id] = token;
        saveState(st);
        if (left() < 3.5) throw new Stop('waiting', `${step.id}: ${op} awaits ${r.owner} until ${r.deadline} (request ${r.request_id})`);
        continue;
      default:
        throw new Stop('not_done', `${step.id}: unexpected ${r.category}`);
    }
  }
}

async function reconcile(v, sid, op, key) {
  for (const pause of [0, 0.1, 0.2, 0.4]) {
    await sleep(pause);
    if (left() < 1) break;
    const ans = await v.rpc('lookup', { session_id: sid, idempotency_key: key, operation: op });
    if (ans.error) throw new Stop('not_done', `lookup refused: ${ans.error.message}`);
    const r = ans.result;
    log('lookup', r.reconciled);
    if (r.reconciled === 'found') return ((r.data && r.data.created) || [{}])[0] || {};
    if (r.reconciled === 'not_found') return null;
  }
  throw new Stop('not_done', 'outcome unknown after lookups; a person must inspect it');
}

main().then(
  (fin) => { console.log(JSON.stringify(fin)); },
  (e) => {
    const status = e instanceof Stop ? e.status : 'not_done';
    if (!(e instanceof Stop)) log('error', e && e.stack);
    console.log(JSON.stringify({ status, message: String(e.message || e) }));
  },
).finally(() => process.exit(0));
