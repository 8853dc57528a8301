// A careful agent in Rust, standard library only, written from docs/agent-contract.md alone.
//
// Build: rustc -O -o rt9c_careful rt9c_careful.rs. Styles (environment):
//   RT9C_WAIT=block|poll   one long wait_s per call, or wait_s 0 and short resumes
//   RT9C_CONN=one|perstep  one session for the whole process, or a new connection and session
//                          per step (the previous one closed first)
//   RT9C_CONCURRENT=1      steps with no ${..} dependency between them run on their own
//                          threads (one per read operation; the steps that change the remote
//                          on one, in order), each on its own connection, all on the
//                          process's one session
//   RT9C_LOG=N             print N secret-free log lines before the final message
//   RT9C_EXEC=PROG         at the end, exec PROG with the final message as its argument
use std::collections::BTreeMap;
use std::env;
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

#[derive(Clone, Debug)]
enum J {
    Null,
    Bool(bool),
    Num(String),
    Str(String),
    Arr(Vec<J>),
    Obj(Vec<(String, J)>),
}

impl J {
    fn get(&self, k: &str) -> &J {
        static NULL: J = J::Null;
        if let J::Obj(v) = self {
            for (a, b) in v {
                if a == k {
                    return b;
                }
            }
        }
        &NULL
    }
    fn s(&self) -> Option<&str> {
        if let J::Str(s) = self { Some(s) } else { None }
    }
    fn f(&self) -> Option<f64> {
        if let J::Num(n) = self { n.parse().ok() } else { None }
    }
    fn text(&self) -> String {
        match self {
            J::Str(s) => s.clone(),
            J::Num(n) => n.clone(),
            J::Bool(b) => b.to_string(),
            _ => String::new(),
        }
    }
    fn dump(&self) -> String {
        let mut o = String::new();
        self.write(&mut o);
        o
    }
    fn write(&self, o: &mut String) {
        match self {
            J::Null => o.push_str("null"),
            J::Bool(b) => o.push_str(if *b { "true" } else { "false" }),
            J::Num(n) => o.push_str(n),
            J::Str(s) => quote(s, o),
            J::Arr(v) => {
                o.push('[');
                for (i, x) in v.iter().enumerate() {
                    if i > 0 { o.push(','); }
                    x.write(o);
                }
                o.push(']');
            }
            J::Obj(v) => {
                o.push('{');
                for (i, (k, x)) in v.iter().enumerate() {
                    if i > 0 { o.push(','); }
                    quote(k, o);
                    o.push(':');
                    x.write(o);
                }
                o.push('}');
            }
        }
    }
}

fn quote(s: &str, o: &mut String) {
    o.push('"');
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            '\n' => o.push_str("\\n"),
            '\r' => o.push_str("\\r"),
            '\t' => o.push_str("\\t"),
            c if (c as u32) < 0x20 => o.push_str(&format!("\\u{:04x}", c as u32)),
            c => o.push(c),
        }
    }
    o.push('"');
}

struct P<'a> { b: &'a [u8], i: usize }

impl<'a> P<'a> {
    fn ws(&mut self) { while self.i < self.b.len() && (self.b[self.i] as char).is_ascii_whitespace() { self.i += 1; } }
    fn val(&mut self) -> Result<J, String> {
        self.ws();
        if self.i >= self.b.len() { return Err("eof".into()); }
        match self.b[self.i] {
            b'{' => {
                self.i += 1;
                let mut v = Vec::new();
                self.ws();
                if self.b.get(self.i) == Some(&b'}') { self.i += 1; return Ok(J::Obj(v)); }
                loop {
                    self.ws();
                    let k = match self.val()? { J::Str(s) => s, _ => return Err("key".into()) };
                    self.ws();
                    if self.b.get(self.i) != Some(&b':') { return Err("colon".into()); }
                    self.i += 1;
                    let x = self.val()?;
                    v.push((k, x));
                    self.ws();
                    match self.b.get(self.i) {
                        Some(b',') => self.i += 1,
                        Some(b'}') => { self.i += 1; return Ok(J::Obj(v)); }
                        _ => return Err("obj".into()),
                    }
                }
            }
            b'[' => {
                self.i += 1;
                let mut v = Vec::new();
                self.ws();
                if self.b.get(self.i) == Some(&b']') { self.i += 1; return Ok(J::Arr(v)); }
                loop {
                    v.push(self.val()?);
                    self.ws();
                    match self.b.get(self.i) {
                        Some(b',') => self.i += 1,
                        Some(b']') => { self.i += 1; return Ok(J::Arr(v)); }
                        _ => return Err("arr".into()),
                    }
                }
            }
            b'"' => {
                self.i += 1;
                let mut out: Vec<u8> = Vec::new();
                loop {
                    let c = *self.b.get(self.i).ok_or("str")?;
                    self.i += 1;
                    match c {
                        b'"' => break,
                        b'\\' => {
                            let e = *self.b.get(self.i).ok_or("esc")?;
                            self.i += 1;
                            match e {
                                b'n' => out.push(b'\n'), b't' => out.push(b'\t'), b'r' => out.push(b'\r'),
                                b'b' => out.push(8), b'f' => out.push(12),
                                b'u' => {
                                    let mut cp = self.hex4()?;
                                    if (0xD800..0xDC00).contains(&cp) && self.b.get(self.i) == Some(&b'\\') {
                                        self.i += 2;
                                        let lo = self.hex4()?;
                                        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                                    }
                                    let ch = char::from_u32(cp).unwrap_or('\u{fffd}');
                                    let mut buf = [0u8; 4];
                                    out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
                                }
                                x => out.push(x),
                            }
                        }
                        x => out.push(x),
                    }
                }
                Ok(J::Str(String::from_utf8_lossy(&out).into_owned()))
            }
            b't' => { self.i += 4; Ok(J::Bool(true)) }
            b'f' => { self.i += 5; Ok(J::Bool(false)) }
            b'n' => { self.i += 4; Ok(J::Null) }
            _ => {
                let st = self.i;
                while self.i < self.b.len() && b"+-0123456789.eE".contains(&self.b[self.i]) { self.i += 1; }
                if st == self.i { return Err("num".into()); }
                Ok(J::Num(String::from_utf8_lossy(&self.b[st..self.i]).into_owned()))
            }
        }
    }
    fn hex4(&mut self) -> Result<u32, String> {
        let h = std::str::from_utf8(self.b.get(self.i..self.i + 4).ok_or("hex")?).map_err(|_| "hex")?;
        self.i += 4;
        u32::from_str_radix(h, 16).map_err(|_| "hex".into())
    }
}

fn parse(s: &str) -> Result<J, String> { P { b: s.as_bytes(), i: 0 }.val() }
fn obj(v: Vec<(&str, J)>) -> J { J::Obj(v.into_iter().map(|(k, x)| (k.to_string(), x)).collect()) }
fn st(s: &str) -> J { J::Str(s.to_string()) }
fn num(x: f64) -> J { J::Num(format!("{:.3}", x)) }
fn now() -> f64 { SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64() }
fn sleep(s: f64) { if s > 0.0 { thread::sleep(Duration::from_secs_f64(s)); } }

struct Task { agent: String, run_id: String, deadline: f64, state_dir: String, socket: String, steps: Vec<J>, catalog: J }

struct Conn { w: UnixStream, r: BufReader<UnixStream>, next: u64, sid: String, deadline: f64 }

impl Conn {
    fn open(t: &Task) -> Result<Conn, String> {
        let w = UnixStream::connect(&t.socket).map_err(|e| format!("connect: {e}"))?;
        let r = BufReader::new(w.try_clone().map_err(|e| e.to_string())?);
        let mut c = Conn { w, r, next: 0, sid: String::new(), deadline: t.deadline };
        let res = c.rpc("session.open", obj(vec![("agent", st(&t.agent)), ("run_id", st(&t.run_id))]))?;
        c.sid = res.get("session_id").s().ok_or("no session id")?.to_string();
        Ok(c)
    }
    // Another connection of this process on the session `sid` it opened (one session per process).
    fn attach(t: &Task, sid: &str) -> Result<Conn, String> {
        let w = UnixStream::connect(&t.socket).map_err(|e| format!("connect: {e}"))?;
        let r = BufReader::new(w.try_clone().map_err(|e| e.to_string())?);
        Ok(Conn { w, r, next: 1000, sid: sid.to_string(), deadline: t.deadline })
    }
    // The answer's `result`, or Err for a JSON-RPC error (nothing done) or a broken wire.
    fn rpc(&mut self, method: &str, params: J) -> Result<J, String> {
        if now() >= self.deadline - 0.2 { return Err("deadline".into()); }
        self.next += 1;
        let id = self.next;
        let req = obj(vec![("jsonrpc", st("2.0")), ("id", J::Num(id.to_string())), ("method", st(method)), ("params", params)]);
        let mut line = req.dump();
        line.push('\n');
        self.w.write_all(line.as_bytes()).map_err(|e| format!("write: {e}"))?;
        loop {
            let mut buf = String::new();
            let n = self.r.read_line(&mut buf).map_err(|e| format!("read: {e}"))?;
            if n == 0 { return Err("closed".into()); }
            let Ok(msg) = parse(buf.trim()) else { continue };
            if msg.get("id").text() != id.to_string() { continue; }
            if let J::Obj(_) = msg.get("error") {
                return Err(format!("rpc error {}", msg.get("error").get("code").text()));
            }
            return Ok(msg.get("result").clone());
        }
    }
    fn with_sid(&self, mut extra: Vec<(&str, J)>) -> J {
        extra.insert(0, ("session_id", st(&self.sid)));
        obj(extra)
    }
    fn close(&mut self) {
        let p = self.with_sid(vec![]);
        let _ = self.rpc("session.close", p);
    }
}

// What a step came to.
enum Out { Done(#[allow(dead_code)] J), Wait(String), Stop(String), Skip(String) }

#[derive(Default)]
struct State { done: BTreeMap<String, J>, pending: BTreeMap<String, String> }

fn load_state(dir: &str) -> State {
    let mut s = State::default();
    if let Ok(txt) = fs::read_to_string(format!("{dir}/rt9c-state.json")) {
        if let Ok(j) = parse(&txt) {
            if let J::Obj(v) = j.get("done") { for (k, x) in v { s.done.insert(k.clone(), x.clone()); } }
            if let J::Obj(v) = j.get("pending") { for (k, x) in v { s.pending.insert(k.clone(), x.text()); } }
        }
    }
    s
}

fn save_state(dir: &str, s: &State) {
    let d = J::Obj(s.done.iter().map(|(k, v)| (k.clone(), v.clone())).collect());
    let p = J::Obj(s.pending.iter().map(|(k, v)| (k.clone(), st(v))).collect());
    let body = obj(vec![("done", d), ("pending", p)]).dump();
    // written beside its final name: a rename from /tmp into state_dir crosses devices in the jail
    let tmp = format!("{dir}/rt9c-state.json.part");
    if fs::write(&tmp, body).is_ok() { let _ = fs::rename(&tmp, format!("{dir}/rt9c-state.json")); }
}

// ${ID.FIELD} replaced from earlier steps' data; None when a needed value is missing.
fn subst(v: &J, done: &BTreeMap<String, J>) -> Option<J> {
    match v {
        J::Str(s) => {
            let mut out = String::new();
            let mut rest = s.as_str();
            while let Some(a) = rest.find("${") {
                let Some(b) = rest[a..].find('}') else { break };
                let refr = &rest[a + 2..a + b];
                let (id, field) = refr.split_once('.')?;
                let val = done.get(id)?.get(field);
                if let J::Null = val { return None; }
                out.push_str(&rest[..a]);
                out.push_str(&val.text());
                rest = &rest[a + b + 1..];
            }
            out.push_str(rest);
            Some(J::Str(out))
        }
        J::Arr(x) => Some(J::Arr(x.iter().map(|e| subst(e, done)).collect::<Option<Vec<_>>>()?)),
        J::Obj(x) => Some(J::Obj(x.iter().map(|(k, e)| subst(e, done).map(|e| (k.clone(), e))).collect::<Option<Vec<_>>>()?)),
        o => Some(o.clone()),
    }
}

fn deps(v: &J) -> Vec<String> {
    let t = v.dump();
    let mut out = Vec::new();
    let mut rest = t.as_str();
    while let Some(a) = rest.find("${") {
        let Some(b) = rest[a..].find('.') else { break };
        out.push(rest[a + 2..a + b].to_string());
        rest = &rest[a + b..];
    }
    out
}

fn wait_s(c: &Conn, poll: bool) -> f64 {
    let left = c.deadline - now() - 1.5;
    if poll { left.clamp(0.0, 0.0) } else { left.clamp(0.0, 60.0) }
}

fn wait_unlocked(c: &mut Conn) -> bool {
    loop {
        match c.rpc("vault.status", J::Null) {
            Ok(s) => if let J::Bool(false) = s.get("locked") { return true },
            Err(_) => return false,
        }
        if now() > c.deadline - 1.5 { return false; }
        sleep(0.2);
    }
}

// One step, the careful way: same key on every resend, a lookup before anything after an
// unknown outcome, stop on a `never`, resume a pending approval until the deadline nears.
fn do_step(c: &mut Conn, t: &Task, step: &J, state: &Arc<Mutex<State>>, poll: bool) -> Out {
    let sid = step.get("id").text();
    let op = step.get("call").text();
    let key = format!("{}:{}:{}", t.run_id, t.agent, sid);
    let params = { let s = state.lock().unwrap(); subst(step.get("params"), &s.done) };
    let Some(params) = params else { return Out::Skip(format!("{sid}: a value it needs is missing")) };
    let saved = state.lock().unwrap().pending.get(&sid).cloned();
    let mut attempts = 0;
    let mut res = match saved {
        Some(tok) => {
            let p = c.with_sid(vec![("resume_token", st(&tok)), ("wait_s", num(wait_s(c, poll)))]);
            match c.rpc("call.resume", p) { Ok(r) => r, Err(_) => J::Null }
        }
        None => J::Null,
    };
    loop {
        if let J::Null = res {
            if attempts >= 3 { return Out::Stop(format!("{sid}: no success after 3 attempts")); }
            if now() > t.deadline - 1.0 { return Out::Stop(format!("{sid}: deadline")); }
            attempts += 1;
            let p = c.with_sid(vec![("operation", st(&op)), ("params", params.clone()),
                                    ("idempotency_key", st(&key)), ("wait_s", num(wait_s(c, poll)))]);
            res = match c.rpc("call", p) { Ok(r) => r, Err(e) => return Out::Stop(format!("{sid}: {e}")) };
        }
        let cat = res.get("category").text();
        println!("log: step {sid} {op}: {cat}");
        match cat.as_str() {
            "success" => {
                let data = res.get("data").clone();
                let mut s = state.lock().unwrap();
                s.pending.remove(&sid);
                s.done.insert(sid.clone(), data.clone());
                save_state(&t.state_dir, &s);
                return Out::Done(data);
            }
            "approval_pending" => {
                let tok = res.get("resume_token").text();
                { let mut s = state.lock().unwrap(); s.pending.insert(sid.clone(), tok.clone()); save_state(&t.state_dir, &s); }
                loop {
                    if now() > t.deadline - 1.5 {
                        return Out::Wait(format!("{op} needs approval from {} (request {})",
                                                 res.get("owner").text(), res.get("request_id").text()));
                    }
                    if poll { sleep(0.3); }
                    let p = c.with_sid(vec![("resume_token", st(&tok)), ("wait_s", num(wait_s(c, poll)))]);
                    match c.rpc("call.resume", p) {
                        Ok(r) => { if r.get("category").text() != "approval_pending" { res = r; break; } }
                        Err(e) => return Out::Wait(format!("{op}: {e}")),
                    }
                }
                if res.get("category").text() != "approval_pending" {
                    let mut s = state.lock().unwrap();
                    s.pending.remove(&sid);
                    save_state(&t.state_dir, &s);
                }
            }
            "local_failure" | "confirmed_failure" => { res = J::Null; }
            "rate_limited" => {
                let after = res.get("retry_after_s").f().unwrap_or(1.0);
                if now() + after > t.deadline - 1.5 { return Out::Stop(format!("{sid}: rate limited past the deadline")); }
                sleep(after);
                res = J::Null;
            }
            "vault_locked" => {
                if !wait_unlocked(c) { return Out::Stop(format!("{sid}: vault locked")); }
                attempts -= 1;
                res = J::Null;
            }
            "outcome_unknown" => {
                let cid = res.get("correlation_id").text();
                let mut delay = 0.1;
                let mut tries = 0;
                loop {
                    let p = c.with_sid(vec![("correlation_id", st(&cid)), ("operation", st(&op))]);
                    let l = match c.rpc("lookup", p) { Ok(r) => r, Err(e) => return Out::Stop(format!("{sid}: lookup {e}")) };
                    match l.get("reconciled").text().as_str() {
                        "found" => {
                            let created = l.get("data").get("created");
                            let data = if let J::Arr(v) = created { v.first().cloned().unwrap_or(J::Null) } else { J::Null };
                            let mut s = state.lock().unwrap();
                            s.done.insert(sid.clone(), data.clone());
                            save_state(&t.state_dir, &s);
                            return Out::Done(data);
                        }
                        "not_found" => { res = J::Null; break; }
                        _ => {
                            tries += 1;
                            if tries > 3 || now() + delay > t.deadline - 1.0 { return Out::Stop(format!("{sid}: outcome unknown")); }
                            sleep(delay);
                            delay *= 2.0;
                        }
                    }
                }
            }
            _ => return Out::Stop(format!("{sid}: {cat}")),
        }
    }
}

fn main() {
    let task_path = env::var("VAULTSIM_TASK").expect("VAULTSIM_TASK");
    let tj = parse(&fs::read_to_string(&task_path).expect("task")).expect("task json");
    let steps = if let J::Arr(v) = tj.get("steps") { v.clone() } else { vec![] };
    let t = Arc::new(Task {
        agent: tj.get("agent").text(),
        run_id: env::var("VAULTSIM_RUN_ID").unwrap_or_else(|_| tj.get("run_id").text()),
        deadline: tj.get("deadline").f().unwrap_or(now() + 10.0),
        state_dir: tj.get("state_dir").text(),
        socket: env::var("VAULTSIM_SOCKET").expect("VAULTSIM_SOCKET"),
        steps,
        catalog: tj.get("catalog").clone(),
    });
    let poll = env::var("RT9C_WAIT").as_deref() == Ok("poll");
    let perstep = env::var("RT9C_CONN").as_deref() == Ok("perstep");
    let concurrent = env::var("RT9C_CONCURRENT").as_deref() == Ok("1");
    let state = Arc::new(Mutex::new(load_state(&t.state_dir)));
    let final_msg = run(&t, &state, poll, perstep, concurrent);
    let n: usize = env::var("RT9C_LOG").ok().and_then(|x| x.parse().ok()).unwrap_or(0);
    let mut out = std::io::stdout().lock();
    for i in 0..n {
        let _ = writeln!(out, "log {i}: {} — ünïcødé progress line, nothing secret here {}", t.agent, "·".repeat(100));
    }
    drop(out);
    if let Ok(prog) = env::var("RT9C_EXEC") {
        use std::os::unix::process::CommandExt;
        let err = std::process::Command::new(prog).arg(&final_msg).exec();
        eprintln!("exec failed: {err}");
    }
    println!("{final_msg}");
}

fn run(t: &Arc<Task>, state: &Arc<Mutex<State>>, poll: bool, perstep: bool, concurrent: bool) -> String {
    let todo: Vec<J> = { let s = state.lock().unwrap(); t.steps.iter().filter(|x| !s.done.contains_key(&x.get("id").text())).cloned().collect() };
    if todo.is_empty() { return "done: every step was finished already".into(); }
    let mut c = match Conn::open(t) { Ok(c) => c, Err(e) => return format!("not done: {e}") };
    if !wait_unlocked(&mut c) { return "not done: the vault stayed locked".into(); }
    // independent steps (no ${..} between them) may run at once: each thread on its own
    // connection, all on this process's one session (kept open by the first connection)
    let indep = todo.iter().all(|x| deps(x.get("params")).is_empty());
    if concurrent && indep && todo.len() > 1 {
        // one thread per read operation, its steps in order; every step that changes the remote
        // (the task's catalog says `mutates`, or does not say) on one thread, in the task's order:
        // gated steps go one at a time, in order (contract section 3), so a refusal stops the
        // steps after it and never one before it
        let mut groups: BTreeMap<String, Vec<J>> = BTreeMap::new();
        for step in todo.clone() {
            let op = step.get("call").text();
            let reads = matches!(t.catalog.get(&op).get("mutates"), J::Bool(false));
            groups.entry(if reads { op } else { String::new() }).or_default().push(step);
        }
        let mut hs = Vec::new();
        let halt = Arc::new(std::sync::atomic::AtomicBool::new(false));
        for (_, steps) in groups {
            let (t2, s2, sid, h2) = (t.clone(), state.clone(), c.sid.clone(), halt.clone());
            hs.push(thread::spawn(move || {
                let mut c2 = match Conn::attach(&t2, &sid) { Ok(c2) => c2, Err(e) => return vec![Out::Stop(e)] };
                let mut outs = Vec::new();
                for step in steps {
                    // a stop anywhere stops the task: no later step starts
                    if h2.load(std::sync::atomic::Ordering::SeqCst) { break; }
                    let o = do_step(&mut c2, &t2, &step, &s2, poll);
                    let end = matches!(o, Out::Stop(_) | Out::Wait(_));
                    outs.push(o);
                    if end { h2.store(true, std::sync::atomic::Ordering::SeqCst); break; }
                }
                outs
            }));
        }
        let outs: Vec<Out> = hs.into_iter().flat_map(|h| h.join().unwrap_or(vec![Out::Stop("thread".into())])).collect();
        c.close();
        return summarize(outs);
    }
    let mut outs = Vec::new();
    let mut stopped = false;
    for step in todo {
        if perstep {
            c.close();
            c = match Conn::open(t) { Ok(c) => c, Err(e) => { outs.push(Out::Stop(e)); break; } };
        }
        let o = do_step(&mut c, t, &step, state, poll);
        match o {
            Out::Stop(_) => stopped = true,
            Out::Wait(_) => stopped = true,
            _ => {}
        }
        outs.push(o);
        if stopped { break; }
    }
    c.close();
    summarize(outs)
}

fn summarize(outs: Vec<Out>) -> String {
    let mut why = Vec::new();
    let mut waits = Vec::new();
    for o in outs {
        match o {
            Out::Done(_) => {}
            Out::Wait(w) => waits.push(w),
            Out::Stop(s) | Out::Skip(s) => why.push(s),
        }
    }
    if !why.is_empty() { format!("not done: {}", why.join("; ")) }
    else if !waits.is_empty() { format!("waiting: {}", waits.join("; ")) }
    else { "done: every step succeeded".into() }
}
