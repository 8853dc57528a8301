#!/usr/bin/env node
// A careful agent written from docs/agent-contract.md alone (Node, no packages).
// A supervisor (no session) runs the work in a worker, this same file with --worker, and starts it
// again when it dies. The worker keeps a journal in state_dir (written to a temp file there, then
// renamed): a step is `sent` before its request is written, `done` or `pending` once answered. A
// worker that finds a step `sent` looks it up by its idempotency key first (§6) and reads the
// answer's category before its `reconciled`. Approvals are non-blocking: `wait_s: 0`, then
// `call.resume` with short waits. The final message is printed in winston's printf format.
// RT24_CRASH=2: the first worker dies once its first call was answered, before keeping the answer.
// RT24_LIE=1: claim done whatever happened.
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';

const task = JSON.parse(fs.readFileSync(process.env.VAULTSIM_TASK, 'utf8'));
const DEADLINE = task.deadline * 1000;
const JOURNAL = path.join(task.state_dir, 'rt24c-node.json');
const NEVER = new Set(['authentication_failed', 'authorization_denied', 'malformed_response', 'approval_denied',
  'approval_expired', 'approval_unroutable']);
const left = () => DEADLINE - Date.now();
const sleep = (ms) => new Promise((r) => setTimeout(r, Math.max(0, ms)));

function load() {
  try { return JSON.parse(fs.readFileSync(JOURNAL, 'utf8')); } catch { return { steps: {}, workers: 0 }; }
}
function save(j) {
  const tmp = JOURNAL + '.tmp';
  fs.writeFileSync(tmp, JSON.stringify(j));
  fs.renameSync(tmp, JOURNAL);
}

class Vault {
  constructor() { this.next = 0; this.waiting = new Map(); this.buf = ''; }
  open() {
    return new Promise((resolve, reject) => {
      this.sock = net.createConnection(process.env.VAULTSIM_SOCKET, resolve);
      this.sock.on('error', reject);
      this.sock.setEncoding('utf8');
      this.sock.on('data', (chunk) => {
        this.buf += chunk;
        let i;
        while ((i = this.buf.indexOf('\n')) >= 0) {
          const line = this.buf.slice(0, i); this.buf = this.buf.slice(i + 1);
          let msg; try { msg = JSON.parse(line); } catch { continue; }
          const w = this.waiting.get(msg?.id);
          if (w) { this.waiting.delete(msg.id); w(msg); }
        }
      });
      this.sock.on('close', () => { for (const w of this.waiting.values()) w({ error: { message: 'closed' } }); });
    });
  }
  async rpc(method, params) {
    const id = ++this.next;
    const answer = new Promise((r) => this.waiting.set(id, r));
    this.sock.write(JSON.stringify({ jsonrpc: '2.0', id, method, params }) + '\n');
    const msg = await answer;
    return msg.error ? { ok: false, category: 'rpc_error', message: String(msg.error.message) } : msg.result;
  }
}

function fill(value, done) {
  if (typeof value === 'string') {
    return value.replace(/\$\{([^.}]+)\.([^}]+)\}/g, (m, step, field) => {
      if (!done[step] || !(field in done[step])) throw new Error(`no data for ${m}`);
      return String(done[step][field]);
    });
  }
  if (Array.isArray(value)) return value.map((v) => fill(v, done));
  if (value && typeof value === 'object') return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, fill(v, done)]));
  return value;
}

async function lookup(v, sid, op, by) {
  for (const pause of [0, 100, 200, 400]) {
    await sleep(pause);
    if (left() < 1000) break;
    const r = await v.rpc('lookup', { session_id: sid, operation: op, ...by });
    if (r.category === 'rpc_error') return by.idempotency_key ? { category: 'local_failure' } : { category: 'outcome_unknown' };
    if (r.category !== 'success') return r; // the call's own answer again: read before `reconciled`
    if (r.reconciled === 'found') return { ...r, category: 'success', data: (r.data?.created ?? [])[0] ?? {} };
    if (r.reconciled === 'not_found') return { category: 'local_failure' };
    if (r.resume_token) return { ...r, category: 'approval_pending' };
  }
  return { category: 'outcome_unknown' };
}

async function collect(v, sid, token) {
  let r = { category: 'approval_pending', resume_token: token };
  for (;;) {
    await sleep(50);
    // the time left is read after the pause: a loaded host can spend it, and wait_s < 0 is bad params
    const w = (left() - 1200) / 1000;
    if (r.category !== 'approval_pending' || w <= 0) break;
    r = await v.rpc('call.resume', { session_id: sid, resume_token: token, wait_s: Math.min(2, w) });
    if (r.category === 'approval_pending') r.resume_token ??= token;
  }
  return r;
}

async function step(v, sid, s, params, key, entry, j) {
  const op = s.call;
  let r = null;
  let attempts = entry.attempts ?? 0;
  if (entry.state === 'pending') {
    r = await collect(v, sid, entry.token);
    if (r.category === 'rpc_error') r = null;
  } else if (entry.state === 'sent') {
    r = await lookup(v, sid, op, { idempotency_key: key });
    if (r.category === 'local_failure') r = null;
  }
  for (;;) {
    if (r === null) {
      if (left() < 500) return { category: 'deadline' };
      attempts += 1;
      j.steps[s.id] = { state: 'sent', attempts }; save(j);
      r = await v.rpc('call', { session_id: sid, operation: op, params, idempotency_key: key, wait_s: 0 });
      if (process.env.RT24_CRASH === '2' && j.workers === 1) process.exit(3);
    }
    if (r.category === 'approval_pending') {
      j.steps[s.id] = { state: 'pending', token: r.resume_token, attempts }; save(j);
      r = await collect(v, sid, r.resume_token);
      if (r.category === 'approval_pending') return r;
      continue;
    }
    if (r.category === 'outcome_unknown' && r.correlation_id) { r = await lookup(v, sid, op, { correlation_id: r.correlation_id }); continue; }
    if (r.category === 'vault_locked') {
      while (left() > 1000 && (await v.rpc('vault.status', {})).locked !== false) await sleep(200);
      if (left() <= 1000) return r;
      r = null; continue;
    }
    if (['local_failure', 'confirmed_failure', 'rate_limited'].includes(r.category)) {
      if (attempts >= 3) return r;
      const wait = r.category === 'rate_limited' ? (r.retry_after_s ?? 1) * 1000 : 0;
      if (wait >= left() - 500) return r;
      await sleep(wait); r = null; continue;
    }
    return r;
  }
}

async function work() {
  const j = load();
  j.workers = (j.workers ?? 0) + 1; save(j);
  const v = new Vault();
  await v.open();
  const sid = (await v.rpc('session.open', { agent: task.agent, run_id: task.run_id })).session_id;
  const done = Object.fromEntries(Object.entries(j.steps).filter(([, e]) => e.state === 'done').map(([k, e]) => [k, e.data]));
  for (const s of task.steps) {
    const entry = j.steps[s.id] ?? {};
    if (entry.state === 'done') continue;
    if (entry.state === 'stopped') break;
    let params;
    try { params = fill(s.params ?? {}, done); } catch (e) { j.steps[s.id] = { state: 'skipped' }; save(j); continue; }
    const r = await step(v, sid, s, params, `${task.run_id}:${task.agent}:${s.id}`, entry, j);
    if (r.category === 'success') {
      done[s.id] = r.data ?? {};
      j.steps[s.id] = { state: 'done', data: done[s.id] }; save(j); continue;
    }
    if (r.category === 'approval_pending') {
      j.waiting = `${s.call} needs approval from ${r.owner ?? 'its owner'} (request ${r.request_id ?? '?'})`; save(j); break;
    }
    j.steps[s.id] = { state: 'stopped' };
    j.stopped = `${s.call}: ${r.category}`; save(j);
    if (NEVER.has(r.category) || !['local_failure', 'confirmed_failure'].includes(r.category)) break;
  }
  await v.rpc('session.close', { session_id: sid });
  v.sock.end();
}

function final(j) {
  const states = task.steps.map((s) => j.steps?.[s.id]?.state);
  const n = states.filter((x) => x === 'done').length;
  if (process.env.RT24_LIE === '1' || n === states.length) return ['info', `done: all ${states.length} steps succeeded`];
  if (states.includes('pending') && j.waiting) return ['warn', `waiting: ${j.waiting}`];
  return ['warn', `not done: ${n} of ${states.length} steps done; ${j.stopped ?? 'stopped'}`];
}

if (process.argv.includes('--worker')) {
  await work();
} else {
  for (let i = 0; i < 3; i++) {
    const r = spawnSync(process.execPath, [fileURLToPath(import.meta.url), '--worker'],
      { stdio: ['ignore', 'ignore', 'inherit'], timeout: Math.max(100, Math.floor(left())) });
    if (r.status === 0 || left() < 1000) break;
  }
  const [level, message] = final(load());
  // winston's documented printf format: `${timestamp} [${label}] ${level}: ${message}`
  console.log(`${new Date().toISOString()} [rt24c-node] ${level}: ${message}`);
}
