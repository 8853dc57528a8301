#!/usr/bin/env node
// A careful agent in Node, written from docs/agent-contract.md alone: `net` over the Unix socket,
// a promise queue (one step at a time; independent `auto` reads may share a turn), every wait and
// sleep bounded by AbortSignals (the task's deadline less a margin, and a per-request timer), and
// state kept in state_dir so a restart resumes instead of asking again.
//
// Flags: --final counter|german|json (default counter: `done: 3/3`, `not done: 1/3 ...`),
//        --parallel-reads (independent auto steps go out together on the one session).
import net from 'node:net';
import fs from 'node:fs';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';

const args = process.argv.slice(2);
const shape = args.includes('--final') ? args[args.indexOf('--final') + 1] : 'counter';
const parallelReads = args.includes('--parallel-reads');
const task = JSON.parse(fs.readFileSync(process.env.VAULTSIM_TASK, 'utf8'));
const deadline = task.deadline * 1000;
const MARGIN = 1500;  // ms before the deadline by which every request has been answered
const NEVER = new Set(['never', 'human_required']);
const REF = /\$\{([^.}]+)\.([^}]+)\}/g;
const left = () => deadline - Date.now();

// aborted when the task's time is up (less the margin): sleeps and queue turns stop on it
const stopAll = new AbortController();
const stopTimer = setTimeout(() => stopAll.abort(new Error('deadline')), Math.max(0, left() - MARGIN));

const statePath = path.join(task.state_dir, 'node-state.json');
let state = {};
try { state = JSON.parse(fs.readFileSync(statePath, 'utf8')); } catch { state = {}; }
function keep(stepId, entry) {
  state[stepId] = entry;
  const tmp = `${statePath}.${process.pid}.tmp`;  // beside it: a rename from /tmp fails in the jail
  const fd = fs.openSync(tmp, 'w');
  fs.writeSync(fd, JSON.stringify(state));
  fs.fsyncSync(fd);
  fs.closeSync(fd);
  fs.renameSync(tmp, statePath);
}

// ---- the connection: one socket, answers matched by id
class Vault {
  constructor(sock) {
    this.sock = sock; this.nextId = 1; this.pending = new Map(); this.buf = '';
    sock.setEncoding('utf8');
    sock.on('data', (d) => {
      this.buf += d;
      let nl;
      while ((nl = this.buf.indexOf('\n')) >= 0) {
        const line = this.buf.slice(0, nl); this.buf = this.buf.slice(nl + 1);
        let msg; try { msg = JSON.parse(line); } catch { continue; }
        const p = msg && this.pending.get(msg.id);  // a line without our id is ignored
        if (p) { this.pending.delete(msg.id); p.resolve(msg); }
      }
    });
    const fail = () => { for (const p of this.pending.values()) p.resolve({ error: { code: -1, message: 'connection closed' } }); this.pending.clear(); };
    sock.on('close', fail); sock.on('error', fail);
  }
  static connect(file) {
    return new Promise((resolve, reject) => {
      const attempt = (delay) => {
        const s = net.createConnection(file);
        s.once('connect', () => { s.removeAllListeners('error'); resolve(new Vault(s)); });
        s.once('error', (e) => {
          // EAGAIN: the vault's accept queue is full; back off and try again until the deadline
          if (e.code === 'EAGAIN' && left() > MARGIN + delay) setTimeout(() => attempt(Math.min(delay * 2, 500)), delay);
          else reject(e);
        });
      };
      attempt(50);
    });
  }
  // the request's answer; the signal only stops our waiting (it never un-sends a request), so
  // every wait_s is chosen to end before the margin and this is a guard, not the plan
  rpc(method, params = {}, ms = 40000) {
    const id = this.nextId++;
    const timeout = AbortSignal.timeout(ms);
    return new Promise((resolve) => {
      this.pending.set(id, { resolve });
      timeout.addEventListener('abort', () => {
        if (this.pending.delete(id)) resolve({ error: { code: -2, message: `no answer to ${method}` } });
      });
      this.sock.write(JSON.stringify({ jsonrpc: '2.0', id, method, params }) + '\n');
    });
  }
}

// ---- the promise queue: one turn at a time
class Queue {
  constructor() { this.tail = Promise.resolve(); }
  push(fn) { const run = this.tail.then(() => { stopAll.signal.throwIfAborted(); return fn(); }); this.tail = run.catch(() => {}); return run; }
}

function resolveRefs(v, results) {
  if (typeof v === 'string') return v.replace(REF, (_, id, field) => String(results[id][field]));
  if (Array.isArray(v)) return v.map((x) => resolveRefs(x, results));
  if (v && typeof v === 'object') return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, resolveRefs(x, results)]));
  return v;
}
const refsOf = (v) => new Set([...JSON.stringify(v ?? {}).matchAll(REF)].map((m) => m[1]));

async function main() {
  const vault = await Vault.connect(process.env.VAULTSIM_SOCKET);
  const opened = await vault.rpc('session.open', { agent: task.agent, run_id: task.run_id, client: { name: 'rt48c-queue' } });
  const sid = opened.result.session_id;
  const cat = await vault.rpc('catalog');
  const modes = Object.fromEntries((cat.result?.operations ?? []).map((o) => [o.name, o.approval?.mode]));
  const waitFor = () => Math.max(0, Math.min(10, (left() - MARGIN - 500) / 1000));

  async function lookup(what, op) {
    for (let unknowns = 0; ;) {
      if (left() < MARGIN) return { stop: 'outcome unknown, no time left to reconcile' };
      const lk = await vault.rpc('lookup', { session_id: sid, ...what, operation: op });
      if (lk.error) return { stop: `lookup refused: ${lk.error.message}` };
      const r = lk.result;
      if ((r.reconciled === 'found' || r.reconciled === 'not_found') && r.category !== 'success') return { answer: r };
      if (r.reconciled === 'found') return { done: (r.data?.created ?? [])[0] ?? {} };
      if (r.reconciled === 'not_found') return { resend: true };
      if (r.resume_token) return { answer: { ...r, category: 'approval_pending' } };
      if (NEVER.has(r.retry)) return { stop: `${r.category}: refused for good` };
      if (r.category === 'rate_limited') { await sleep((r.retry_after_s ?? 0.5) * 1000, null, { signal: stopAll.signal }); continue; }
      if (++unknowns > 4) return { stop: 'outcome still unknown: a person must inspect it' };
      await sleep(100 * 2 ** (unknowns - 1), null, { signal: stopAll.signal });
    }
  }

  async function doStep(step, params) {
    const key = `${task.run_id}:${task.agent}:${step.id}`;
    const saved = state[step.id] ?? {};
    if (saved.done) return { outcome: 'done', data: saved.data };
    if (saved.ended) return { outcome: 'stop', why: `a predecessor ended it: ${saved.ended}` };
    let attempts = saved.attempts ?? 0;
    let r = null;
    if (saved.token) {
      const m = await vault.rpc('call.resume', { session_id: sid, resume_token: saved.token, wait_s: waitFor() });
      if (!m.error) r = m.result;  // an error: the vault forgot the token; call again with the key
    } else if (saved.intent) {
      const l = await lookup({ idempotency_key: key }, step.call);
      if (l.done) return { outcome: 'done', data: l.done };
      if (l.stop) return { outcome: 'stop', why: l.stop };
      if (l.answer) r = l.answer;
    }
    for (;;) {
      if (!r) {
        if (attempts >= 3) return { outcome: 'failed', why: 'three attempts' };
        if (left() < MARGIN + 500) return { outcome: 'stop', why: 'no time left to send it' };
        attempts++;
        keep(step.id, { intent: true, attempts });
        const m = await vault.rpc('call', { session_id: sid, operation: step.call, params, idempotency_key: key, wait_s: waitFor() });
        if (m.error) return { outcome: 'stop', why: `vault refused: ${m.error.message}` };
        r = m.result;
      }
      const c = r.category;
      if (c === 'success') return { outcome: 'done', data: r.data ?? {} };
      if (c === 'approval_pending') {
        keep(step.id, { token: r.resume_token, attempts });
        let settled = null;
        while (left() - MARGIN > 300) {
          const m = await vault.rpc('call.resume', { session_id: sid, resume_token: r.resume_token, wait_s: Math.min(10, (left() - MARGIN - 200) / 1000) });
          if (m.error) return { outcome: 'stop', why: `resume refused: ${m.error.message}` };
          if (m.result.category !== 'approval_pending') { settled = m.result; break; }
        }
        if (!settled) return { outcome: 'waiting', owner: r.owner, request: r.request_id };
        keep(step.id, { intent: true, attempts });
        r = settled; continue;
      }
      if (c === 'outcome_unknown') {
        const l = await lookup({ correlation_id: r.correlation_id }, step.call);
        if (l.done) return { outcome: 'done', data: l.done };
        if (l.stop) return { outcome: 'stop', why: l.stop };
        r = l.answer ?? null; continue;
      }
      if (c === 'local_failure' || c === 'confirmed_failure') { r = null; continue; }
      if (c === 'rate_limited') {
        const wait = (r.retry_after_s ?? 1) * 1000;
        if (Date.now() + wait > deadline - MARGIN - 500 || attempts >= 3) return { outcome: 'stop', why: 'rate limited past the deadline' };
        await sleep(wait, null, { signal: stopAll.signal }); r = null; continue;
      }
      if (c === 'vault_locked') {
        let open = false;
        while (left() > MARGIN + 1000) {
          const st = await vault.rpc('vault.status');
          if (st.result?.locked === false) { open = true; break; }
          await sleep(500, null, { signal: stopAll.signal });
        }
        if (!open) return { outcome: 'stop', why: 'vault locked until the deadline' };
        r = null; continue;
      }
      return { outcome: 'stop', why: `${c} (${r.retry})` };
    }
  }

  const queue = new Queue();
  const results = {};
  const reports = [];
  let stopped = false;
  const steps = task.steps;
  for (let i = 0; i < steps.length && !stopped;) {
    const turn = [steps[i++]];
    if (parallelReads && modes[turn[0].call] === 'auto') {
      while (i < steps.length && modes[steps[i].call] === 'auto'
             && ![...refsOf(steps[i].params)].some((id) => turn.some((t) => t.id === id))
             && !turn.some((t) => t.call === steps[i].call && JSON.stringify(t.params) === JSON.stringify(steps[i].params))) turn.push(steps[i++]);
    }
    const missing = turn.flatMap((s) => [...refsOf(s.params)].filter((id) => !(id in results)));
    if (missing.length) { reports.push({ step: turn[0].id, outcome: 'stop', why: `needs ${missing.join(', ')}` }); break; }
    let outs;
    try {
      outs = await queue.push(() => Promise.all(turn.map((s) => doStep(s, resolveRefs(s.params ?? {}, results)))));
    } catch (e) {
      if (e?.name === 'AbortError' || stopAll.signal.aborted) { reports.push({ step: turn[0].id, outcome: 'stop', why: 'deadline' }); break; }
      throw e;
    }
    turn.forEach((s, n) => {
      const o = { step: s.id, call: s.call, ...outs[n] };
      reports.push(o);
      if (o.outcome === 'done') { results[s.id] = o.data ?? {}; keep(s.id, { done: true, data: o.data ?? {} }); }
      else if (o.outcome === 'waiting') stopped = true;
      else if (o.outcome === 'stop') { stopped = true; if (!o.why.startsWith('a predecessor') && !o.why.startsWith('no time')) keep(s.id, { ended: o.why }); }
      else if (o.outcome === 'failed') keep(s.id, { ended: o.why });
    });
  }
  await vault.rpc('session.close', { session_id: sid }, 2000);
  vault.sock.end();
  clearTimeout(stopTimer);

  const done = reports.filter((r) => r.outcome === 'done').length;
  const waiting = reports.filter((r) => r.outcome === 'waiting');
  const bad = reports.filter((r) => r.outcome === 'stop' || r.outcome === 'failed');
  const claim = done === steps.length ? 'done' : (waiting.length && !bad.length ? 'waiting' : 'not done');
  for (const r of reports) console.log(`# ${r.step} ${r.call ?? ''}: ${r.outcome}${r.why ? ` (${r.why})` : ''}`);
  if (shape === 'json') console.log(JSON.stringify({ status: claim.replace(' ', '_'), done, of: steps.length }));
  else if (shape === 'german') {
    const w = waiting[0];
    console.log(claim === 'done' ? `done — alle ${steps.length} Schritte erledigt`
      : claim === 'waiting' ? `waiting — ${w.call} wartet auf Freigabe durch ${w.owner} (Anfrage ${w.request})`
      : `not done — ${done} von ${steps.length} Schritten erledigt`);
  } else {
    const tail = claim === 'waiting' ? ` (${waiting[0].call} awaits ${waiting[0].owner}, request ${waiting[0].request})` : '';
    console.log(`${claim}: ${done}/${steps.length}${tail}`);
  }
}

main().then(() => process.exit(0), (e) => { console.error(`rt48c-queue: ${e?.stack ?? e}`); console.log('not done: the agent failed'); process.exit(0); });
