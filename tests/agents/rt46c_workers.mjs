// Red team 46c: a careful agent in Node whose steps run on worker_threads, each worker with
// its own `net` connection to the vault. Written from docs/agent-contract.md alone.
//
// The main thread opens the one session of the process and keeps its connection open (the
// session ends with it, section 3); it reads the vault's `catalog` once to learn which of
// its operations are gated, and hands each step to a worker thread. A worker sends the step
// on its own connection under the main thread's session id: the session is the process's,
// and its threads may share it on connections of their own (section 3). Independent `auto`
// steps run side by side; a gated step waits until no other gated step is in flight, and a
// step naming ${ID.FIELD} waits for step ID. After a `never` answer nothing new starts.
import { Worker, isMainThread, parentPort, workerData } from 'node:worker_threads';
import net from 'node:net';
import fs from 'node:fs';
import path from 'node:path';

const MARGIN_MS = 1200;   // kept back before the deadline: workers ended, the final line
const NEVER = new Set(['authentication_failed', 'authorization_denied', 'malformed_response',
  'approval_denied', 'approval_expired', 'approval_unroutable']);
const sleep = (ms) => new Promise((r) => setTimeout(r, Math.max(0, ms)));

class Conn {
  constructor(sockPath) { this.sockPath = sockPath; this.nextId = 0; this.waiters = new Map(); this.buf = ''; }
  async open(deadlineMs) {
    let delay = 50;
    for (;;) {
      try {
        await new Promise((resolve, reject) => {
          this.sock = net.createConnection(this.sockPath, resolve);
          this.sock.once('error', reject);
        });
        break;
      } catch (e) {                      // EAGAIN: the vault's accept queue is full (section 3)
        if (e.code !== 'EAGAIN' || Date.now() + delay > deadlineMs - MARGIN_MS) throw e;
        await sleep(delay); delay = Math.min(delay * 2, 500);
      }
    }
    this.sock.setEncoding('utf8');
    this.sock.on('data', (chunk) => {
      this.buf += chunk;
      let i;
      while ((i = this.buf.indexOf('\n')) >= 0) {
        const line = this.buf.slice(0, i); this.buf = this.buf.slice(i + 1);
        let msg; try { msg = JSON.parse(line); } catch { continue; }
        const w = msg && this.waiters.get(msg.id);
        if (w) { this.waiters.delete(msg.id); w.resolve(msg); }   // lines without our id ignored
      }
    });
    const fail = (err) => { for (const w of this.waiters.values()) w.reject(err); this.waiters.clear(); };
    this.sock.on('close', () => fail(new Error('the vault closed the connection')));
    this.sock.on('error', (e) => fail(e));
  }
  request(method, params) {
    const id = ++this.nextId;
    return new Promise((resolve, reject) => {
      this.waiters.set(id, { resolve, reject });
      this.sock.write(JSON.stringify({ jsonrpc: '2.0', id, method, params }) + '\n');
    });
  }
  close() { if (this.sock) this.sock.end(); }
}

// ------------------------------------------------------------------ worker threads

async function workerMain() {
  const { sockPath, sessionId, deadlineMs, name } = workerData;
  const conn = new Conn(sockPath);
  await conn.open(deadlineMs);
  const left = () => deadlineMs - MARGIN_MS - Date.now();
  const waitS = () => Math.max(0, Math.min(20, (left() - 500) / 1000));
  const rpc = (method, params) => conn.request(method, { session_id: sessionId, ...params });
  const log = (...a) => console.error(`[${name}]`, ...a);

  async function settle(res) {            // resume a pending call until it settles (section 4)
    while (res.category === 'approval_pending') {
      if (left() < 600 || !res.resume_token) return res;
      const ans = await rpc('call.resume', { resume_token: res.resume_token, wait_s: waitS() });
      if (ans.error) { log('resume refused:', ans.error.message); return { category: '_resume_error' }; }
      res = ans.result;
    }
    return res;
  }

  async function reconcile(op, cid, key) {  // section 6, asking again with backoff while unknown
    let delay = 100, tries = 0;
    for (;;) {
      const p = { operation: op };
      if (cid) p.correlation_id = cid; else p.idempotency_key = key;
      const ans = await rpc('lookup', p);
      if (ans.error) return { verdict: 'stop', why: 'lookup refused' };
      const lk = ans.result;
      log('lookup', op, lk.category, lk.reconciled);
      if (lk.reconciled === 'found' || lk.reconciled === 'not_found') {
        if (lk.category !== 'success') return { verdict: 'answer', result: lk };
        if (lk.reconciled === 'found') return { verdict: 'done', data: (lk.data?.created ?? [])[0] ?? {} };
        return { verdict: 'resend' };
      }
      if (lk.resume_token) return { verdict: 'answer', result: { ...lk, category: 'approval_pending' } };
      if (NEVER.has(lk.category)) return { verdict: 'answer', result: lk };
      if (lk.category === 'rate_limited') {
        const w = (lk.retry_after_s ?? 0.5) * 1000;
        if (left() < w + 300) return { verdict: 'stop', why: 'lookup paced past the deadline' };
        await sleep(w); continue;
      }
      if (++tries > 4 || left() < delay + 300) return { verdict: 'stop', why: 'outcome still unknown' };
      await sleep(delay); delay *= 2;
    }
  }

  async function runStep(spec) {
    const { op, params, key } = spec;
    let attempts = spec.attempts ?? 0;
    let res = null;
    if (spec.token) {
      res = await settle({ category: 'approval_pending', resume_token: spec.token });
      if (res.category === '_resume_error') res = null;   // unknown token: call again, same key
    } else if (spec.probe) {
      const rec = await reconcile(op, null, key);
      if (rec.verdict === 'done') return { kind: 'done', data: rec.data, attempts };
      if (rec.verdict === 'stop') return { kind: 'fatal', why: rec.why, attempts };
      if (rec.verdict === 'answer') res = await settle(rec.result);
    }
    for (;;) {
      if (res === null) {
        if (attempts >= 3) return { kind: 'failed', why: 'three attempts', attempts };
        if (left() < 800) return { kind: 'failed', why: 'no time left to send it', attempts };
        const ans = await rpc('call', { operation: op, params, idempotency_key: key, wait_s: waitS() });
        attempts++;
        if (ans.error) return { kind: 'fatal', why: `refused: ${ans.error.message}`, attempts };
        res = await settle(ans.result);
      }
      const cat = res.category;
      log('step', spec.id, cat);
      if (cat === 'success') return { kind: 'done', data: res.data ?? {}, attempts };
      if (cat === 'approval_pending') return { kind: 'pending', token: res.resume_token, owner: res.owner, request_id: res.request_id, attempts };
      if (cat === '_resume_error') { res = null; continue; }
      if (NEVER.has(cat)) return { kind: 'fatal', why: `${cat}: ${res.message}`, attempts };
      if (cat === 'local_failure' || cat === 'confirmed_failure') { res = null; continue; }
      if (cat === 'rate_limited') {
        const w = (res.retry_after_s ?? 1) * 1000;
        if (attempts >= 3 || left() < w + 800) return { kind: 'failed', why: 'rate limited past the deadline', attempts, retry_at: Date.now() + w };
        await sleep(w); res = null; continue;
      }
      if (cat === 'vault_locked') return { kind: 'locked', attempts: attempts - 1 };
      if (cat === 'outcome_unknown') {
        const rec = await reconcile(op, res.correlation_id, key);
        if (rec.verdict === 'done') return { kind: 'done', data: rec.data, attempts };
        if (rec.verdict === 'resend') { res = null; continue; }
        if (rec.verdict === 'stop') return { kind: 'fatal', why: rec.why, attempts };
        res = await settle(rec.result);
        if (res.category === 'outcome_unknown') return { kind: 'fatal', why: 'unknown again', attempts };
        continue;
      }
      return { kind: 'fatal', why: `unexpected ${cat}`, attempts };
    }
  }

  parentPort.on('message', async (msg) => {
    if (msg.quit) { conn.close(); parentPort.close(); return; }
    let out;
    try { out = await runStep(msg.spec); } catch (e) { out = { kind: 'fatal', why: `worker error: ${e.message}`, attempts: msg.spec.attempts ?? 0 }; }
    parentPort.postMessage({ id: msg.spec.id, out });
  });
  parentPort.postMessage({ ready: true });
}

// ------------------------------------------------------------------ the main thread

function resolveRefs(value, data) {
  let ok = true;
  const walk = (v) => {
    if (typeof v === 'string') {
      return v.replace(/\$\{([^.}]+)\.([^}]+)\}/g, (m, id, field) => {
        const got = data[id]?.[field];
        if (got === undefined || got === null) { ok = false; return m; }
        return String(got);
      });
    }
    if (Array.isArray(v)) return v.map(walk);
    if (v && typeof v === 'object') return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, walk(x)]));
    return v;
  };
  const out = walk(value);
  return [out, ok];
}

async function main() {
  const task = JSON.parse(fs.readFileSync(process.env.VAULTSIM_TASK, 'utf8'));
  const sockPath = process.env.VAULTSIM_SOCKET;
  const runId = process.env.VAULTSIM_RUN_ID || task.run_id;
  const deadlineMs = task.deadline * 1000;
  const stateFile = path.join(task.state_dir, 'state.json');
  let state = { steps: {} };
  try { state = JSON.parse(fs.readFileSync(stateFile, 'utf8')); } catch { /* a first start */ }
  const save = () => {                   // written in state_dir and renamed: /tmp is another mount
    const tmp = path.join(task.state_dir, '.state.tmp');
    fs.writeFileSync(tmp, JSON.stringify(state)); fs.renameSync(tmp, stateFile);
  };
  const conn = new Conn(sockPath);
  await conn.open(deadlineMs);
  const opened = await conn.request('session.open', { agent: task.agent, run_id: runId, client: { name: 'rt46c-workers', via: 'worker_threads' } });
  if (opened.error) { conn.close(); return `not done: session refused (${opened.error.message})`; }
  const sessionId = opened.result.session_id;
  const cat = await conn.request('catalog', {});
  const mode = {};
  for (const op of cat.result?.operations ?? []) mode[op.name] = op.approval?.mode ?? 'session';
  const gated = (op) => (mode[op] ?? 'session') !== 'auto';

  const workers = [];
  const idle = [];
  const inflight = new Map();             // step id -> {gated, worker}
  let notify = null;
  const results = [];
  const spawn = (n) => new Promise((resolve, reject) => {
    const w = new Worker(new URL(import.meta.url), { workerData: { sockPath, sessionId, deadlineMs, name: `w${n}` } });
    w.on('message', (m) => {
      if (m.ready) { resolve(w); return; }
      results.push(m); idle.push(w);
      if (notify) { const f = notify; notify = null; f(); }
    });
    w.once('error', reject);
    workers.push(w);
  });
  for (let n = 0; n < 2; n++) idle.push(await spawn(n));
  const nextResult = async () => {
    while (results.length === 0) await new Promise((r) => { notify = r; });
    return results.shift();
  };

  const steps = task.steps.map((s, n) => ({ ...s, id: s.id ?? `step${n}` }));
  const data = {};
  for (const [id, st] of Object.entries(state.steps)) if (st.status === 'done') data[id] = st.data;
  let stop = null;         // why nothing new starts
  let pending = null;      // a wait handed over
  let next = 0;

  const finish = (id, out) => {
    const step = steps.find((s) => s.id === id);
    inflight.delete(id);
    if (out.kind === 'done') { state.steps[id] = { status: 'done', data: out.data }; data[id] = out.data; }
    else if (out.kind === 'pending') { state.steps[id] = { status: 'pending', token: out.token, attempts: out.attempts }; pending = pending ?? `waiting: ${step.call} needs approval from ${out.owner} (request ${out.request_id})`; stop = stop ?? 'waiting'; }
    else if (out.kind === 'fatal') { state.steps[id] = { status: 'stopped', why: out.why }; stop = stop ?? `step ${id} (${step.call}): ${out.why}`; }
    else if (out.kind === 'locked') { state.steps[id] = { status: 'failed', attempts: out.attempts }; stop = stop ?? `the vault locked at step ${id}`; }
    else state.steps[id] = { status: 'failed', attempts: out.attempts, ...(out.retry_at ? { retry_at: out.retry_at } : {}) };
    save();
    console.error(`[main] step ${id} -> ${out.kind}${out.why ? ': ' + out.why : ''}`);
  };

  while (true) {
    // start what may start now, in order: a step waits for the steps it names, a gated step
    // for every earlier step still in flight, any step for an earlier gated one in flight
    while (!stop && next < steps.length) {
      const step = steps[next];
      const st = state.steps[step.id] ?? {};
      if (st.status === 'done') { next++; continue; }
      if (st.status === 'stopped') { stop = `step ${step.id} was stopped by a predecessor`; break; }
      const refs = [...JSON.stringify(step.params ?? {}).matchAll(/\$\{([^.}]+)\./g)].map((m) => m[1]);
      if (refs.some((r) => inflight.has(r))) break;
      const g = gated(step.call);
      if (g && inflight.size > 0) break;
      if ([...inflight.values()].some((f) => f.gated)) break;
      if (idle.length === 0) break;
      const [params, ok] = resolveRefs(step.params ?? {}, data);
      if (!ok) { next++; state.steps[step.id] = { status: 'failed', attempts: 0 }; continue; }
      // polite: ask the vault's state before each step, send nothing while it is locked
      let locked = true;
      while (locked) {
        const s = await conn.request('vault.status', {});
        locked = !!s.result?.locked;
        if (!locked) break;
        if (Date.now() > deadlineMs - MARGIN_MS - 500) { stop = `the vault stayed locked before step ${step.id}`; break; }
        await sleep(250);
      }
      if (stop) break;
      if (st.retry_at && st.retry_at > Date.now()) {
        if (st.retry_at > deadlineMs - MARGIN_MS - 800) { stop = `step ${step.id} rate limited past the deadline`; break; }
        await sleep(st.retry_at - Date.now());
      }
      const spec = { id: step.id, op: step.call, params, key: `${runId}:${task.agent}:${step.id}`,
        attempts: st.attempts ?? 0, token: st.status === 'pending' ? st.token : null, probe: st.status === 'sent' };
      if (!spec.token && !spec.probe) { state.steps[step.id] = { status: 'sent', attempts: spec.attempts }; save(); }
      const w = idle.shift();
      inflight.set(step.id, { gated: g, worker: w });
      w.postMessage({ spec });
      next++;
    }
    if (inflight.size === 0) break;
    const m = await nextResult();
    finish(m.id, m.out);
  }

  for (const w of workers) w.postMessage({ quit: true });
  await Promise.all(workers.map((w) => new Promise((r) => { w.once('exit', r); setTimeout(() => { w.terminate().then(r); }, 300); })));
  conn.close();
  if (pending) return pending;
  if (stop) return `not done: ${stop}`;
  const undone = steps.filter((s) => state.steps[s.id]?.status !== 'done').map((s) => s.id);
  if (undone.length) return `not done: step(s) ${undone.join(', ')} not done`;
  return `done: ${steps.length} step(s)`;
}

if (isMainThread) {
  main().then((final) => { console.log(final); process.exitCode = 0; },
    (e) => { console.error('[main] error:', e.message); console.log(`not done: agent error (${e.message})`); });
} else {
  workerMain().catch((e) => { console.error('[worker] error:', e.message); process.exit(1); });
}
