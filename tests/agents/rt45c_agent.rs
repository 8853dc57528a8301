// Red team 45c: a careful agent in Rust (std only: a hand-written JSON value, a reader thread
// that hands each answer to its request's channel by id), written from docs/agent-contract.md.
//
// Shape: std::os::unix::net::UnixStream; a reader thread owns the read half and routes every
// answer to the mpsc::Sender its request registered (lines without a registered id are
// skipped); the main thread waits with recv_timeout bounded by the deadline. Steps one at a
// time, a `Step` enum of what to do next. Rules kept: one session on one connection (3); key
// RUN:AGENT:STEP on every call and resend (5); a lookup before anything else after
// outcome_unknown, its category read before its reconciled (6); waits resumed until settled or
// handed over with the token kept in state_dir (4, 7); retry_after_s waited out, at most 3
// attempts (4); never / human_required stops the task (4); a restart resumes or looks up what it
// kept (8); the final message last (7).
use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

#[derive(Clone, Debug, PartialEq)]
enum V { Null, Bool(bool), Num(f64), Str(String), Arr(Vec<V>), Obj(BTreeMap<String, V>) }

impl V {
    fn get(&self, k: &str) -> Option<&V> { if let V::Obj(m) = self { m.get(k) } else { None } }
    fn s(&self, k: &str) -> Option<&str> { if let Some(V::Str(s)) = self.get(k) { Some(s) } else { None } }
    fn n(&self, k: &str) -> Option<f64> { if let Some(V::Num(n)) = self.get(k) { Some(*n) } else { None } }
    fn is(&self, k: &str, want: &str) -> bool { self.s(k) == Some(want) }
    fn dump(&self, o: &mut String) {
        match self {
            V::Null => o.push_str("null"),
            V::Bool(b) => o.push_str(if *b { "true" } else { "false" }),
            V::Num(n) => { if n.fract() == 0.0 && n.abs() < 1e15 { o.push_str(&format!("{}", *n as i64)) } else { o.push_str(&format!("{}", n)) } }
            V::Str(s) => quote(s, o),
            V::Arr(a) => { o.push('['); for (i, x) in a.iter().enumerate() { if i > 0 { o.push(',') } x.dump(o) } o.push(']') }
            V::Obj(m) => { o.push('{'); for (i, (k, x)) in m.iter().enumerate() { if i > 0 { o.push(',') } quote(k, o); o.push(':'); x.dump(o) } o.push('}') }
        }
    }
    fn to_json(&self) -> String { let mut o = String::new(); self.dump(&mut o); o }
}

fn quote(s: &str, o: &mut String) {
    o.push('"');
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""), '\\' => o.push_str("\\\\"), '\n' => o.push_str("\\n"),
            '\r' => o.push_str("\\r"), '\t' => o.push_str("\\t"),
            c if (c as u32) < 0x20 => o.push_str(&format!("\\u{:04x}", c as u32)),
            c => o.push(c),
        }
    }
    o.push('"');
}

struct P<'a> { b: &'a [u8], i: usize }
impl<'a> P<'a> {
    fn ws(&mut self) { while self.i < self.b.len() && (self.b[self.i] as char).is_ascii_whitespace() { self.i += 1 } }
    fn hex4(&mut self) -> Option<u32> {
        let h = std::str::from_utf8(self.b.get(self.i..self.i + 4)?).ok()?; self.i += 4; u32::from_str_radix(h, 16).ok()
    }
    fn string(&mut self) -> Option<String> {
        self.i += 1;
        let mut out: Vec<u8> = Vec::new();
        while self.i < self.b.len() {
            let c = self.b[self.i]; self.i += 1;
            match c {
                b'"' => return String::from_utf8(out).ok(),
                b'\\' => {
                    let e = *self.b.get(self.i)?; self.i += 1;
                    match e {
                        b'n' => out.push(b'\n'), b't' => out.push(b'\t'), b'r' => out.push(b'\r'),
                        b'b' => out.push(8), b'f' => out.push(12),
                        b'u' => {
                            let mut cp = self.hex4()?;
                            if (0xD800..0xDC00).contains(&cp) && self.b.get(self.i) == Some(&b'\\') && self.b.get(self.i + 1) == Some(&b'u') {
                                self.i += 2; let lo = self.hex4()?; cp = 0x10000 + ((cp - 0xD800) << 10) + (lo.wrapping_sub(0xDC00) & 0x3FF);
                            }
                            let ch = char::from_u32(cp).unwrap_or('\u{FFFD}');
                            let mut tmp = [0u8; 4]; out.extend_from_slice(ch.encode_utf8(&mut tmp).as_bytes());
                        }
                        x => out.push(x),
                    }
                }
                x => out.push(x),
            }
        }
        None
    }
    fn value(&mut self) -> Option<V> {
        self.ws();
        match *self.b.get(self.i)? {
            b'{' => {
                self.i += 1; let mut m = BTreeMap::new();
                loop {
                    self.ws();
                    match *self.b.get(self.i)? {
                        b'}' => { self.i += 1; return Some(V::Obj(m)) }
                        b',' => { self.i += 1; continue }
                        b'"' => { let k = self.string()?; self.ws(); if self.b.get(self.i) == Some(&b':') { self.i += 1 } let v = self.value()?; m.insert(k, v); }
                        _ => return None,
                    }
                }
            }
            b'[' => {
                self.i += 1; let mut a = Vec::new();
                loop {
                    self.ws();
                    match *self.b.get(self.i)? {
                        b']' => { self.i += 1; return Some(V::Arr(a)) }
                        b',' => { self.i += 1; continue }
                        _ => a.push(self.value()?),
                    }
                }
            }
            b'"' => self.string().map(V::Str),
            b't' => { self.i += 4; Some(V::Bool(true)) }
            b'f' => { self.i += 5; Some(V::Bool(false)) }
            b'n' => { self.i += 4; Some(V::Null) }
            _ => {
                let st = self.i;
                while self.i < self.b.len() && b"+-0123456789.eE".contains(&self.b[self.i]) { self.i += 1 }
                std::str::from_utf8(&self.b[st..self.i]).ok()?.parse().ok().map(V::Num)
            }
        }
    }
}
fn parse(s: &str) -> Option<V> { P { b: s.as_bytes(), i: 0 }.value() }
fn obj(pairs: Vec<(&str, V)>) -> V { V::Obj(pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect()) }
fn st(s: &str) -> V { V::Str(s.to_string()) }

fn now() -> f64 { SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64() }

enum Err { Stop(String), Refused(String) }

struct Vault {
    w: UnixStream,
    routes: Arc<Mutex<HashMap<u64, Sender<V>>>>,
    next: u64,
    deadline: f64,
    sid: String,
}

impl Vault {
    fn connect(path: &str, deadline: f64) -> Result<Vault, String> {
        let mut pause = 0.05;
        let s = loop {
            match UnixStream::connect(path) {
                Ok(s) => break s,
                // a full accept queue is not a missing vault: back off (3)
                Err(e) if e.raw_os_error() == Some(11) && now() + pause < deadline - 1.0 => {
                    std::thread::sleep(Duration::from_secs_f64(pause)); pause = (pause * 2.0f64).min(0.5);
                }
                Err(e) => return Err(format!("cannot reach the vault ({})", e)),
            }
        };
        let routes: Arc<Mutex<HashMap<u64, Sender<V>>>> = Arc::new(Mutex::new(HashMap::new()));
        let (r, rt) = (s.try_clone().map_err(|e| e.to_string())?, routes.clone());
        std::thread::spawn(move || {
            for line in BufReader::new(r).lines() {
                let Ok(line) = line else { break };
                let Some(msg) = parse(&line) else { continue };
                let Some(id) = msg.n("id") else { continue };
                if let Some(tx) = rt.lock().unwrap().remove(&(id as u64)) { let _ = tx.send(msg); }
            }
            rt.lock().unwrap().clear(); // every waiter sees the connection gone
        });
        Ok(Vault { w: s, routes, next: 0, deadline, sid: String::new() })
    }

    fn rpc(&mut self, method: &str, params: V) -> Result<V, Err> {
        if now() > self.deadline - 0.25 { return Err(Err::Stop(format!("the deadline came before {} could be sent", method))) }
        self.next += 1;
        let id = self.next;
        let (tx, rx) = channel();
        self.routes.lock().unwrap().insert(id, tx);
        let frame = obj(vec![("jsonrpc", st("2.0")), ("id", V::Num(id as f64)), ("method", st(method)), ("params", params)]);
        let mut line = frame.to_json(); line.push('\n');
        if self.w.write_all(line.as_bytes()).is_err() { return Err(Err::Stop("the vault closed the connection".into())) }
        let wait = (self.deadline + 1.0 - now()).max(0.0);
        let msg = rx.recv_timeout(Duration::from_secs_f64(wait)).map_err(|_| Err::Stop(format!("no answer to {}", method)))?;
        if let Some(e) = msg.get("error") { return Err(Err::Refused(e.s("message").unwrap_or("error").chars().take(200).collect())) }
        Ok(msg.get("result").cloned().unwrap_or(V::Null))
    }

    fn req(&mut self, method: &str, mut params: V) -> Result<V, Err> {
        if let V::Obj(m) = &mut params { m.insert("session_id".into(), st(&self.sid)); }
        let r = self.rpc(method, params)?;
        eprintln!("[rt45c-rust] {} -> {} {}", method, r.s("category").unwrap_or("?"), r.s("reconciled").unwrap_or(""));
        Ok(r)
    }
}

struct Agent { v: Vault, task: V, state: BTreeMap<String, V>, state_path: String, deadline: f64, waiting: Vec<String> }

enum Next { Send, Answer(V), Settled(&'static str) }

impl Agent {
    fn left(&self) -> f64 { self.deadline - now() - 0.8 }
    fn nap(&self, s: f64) { let s = s.min(self.left()); if s > 0.0 { std::thread::sleep(Duration::from_secs_f64(s)) } }
    fn wait_s(&self) -> f64 { ((self.left() - 0.3).max(0.0) * 100.0).floor() / 100.0 }
    fn save(&self) {
        // written in state_dir itself and renamed there (a rename from /tmp fails in the jail: 1)
        let tmp = format!("{}.{}.tmp", self.state_path, std::process::id());
        let body = V::Obj(self.state.clone()).to_json();
        if let Ok(mut f) = std::fs::File::create(&tmp) {
            let _ = f.write_all(body.as_bytes()); let _ = f.sync_all();
            let _ = std::fs::rename(&tmp, &self.state_path);
        }
    }
    fn rec(&mut self, id: &str) -> &mut BTreeMap<String, V> {
        let e = self.state.entry(id.to_string()).or_insert_with(|| V::Obj(BTreeMap::new()));
        if let V::Obj(m) = e { m } else { unreachable!() }
    }
    fn done(&self, id: &str) -> bool { self.state.get(id).and_then(|r| r.get("data")).is_some() }

    fn fill(&self, v: &V) -> Result<V, Err> {
        Ok(match v {
            V::Str(s) => {
                let mut out = String::new(); let mut rest = s.as_str();
                while let Some(at) = rest.find("${") {
                    let (Some(dot), Some(end)) = (rest[at..].find('.'), rest[at..].find('}')) else { break };
                    if dot > end { break }
                    out.push_str(&rest[..at]);
                    let (id, field) = (&rest[at + 2..at + dot], &rest[at + dot + 1..at + end]);
                    match self.state.get(id).and_then(|r| r.get("data")).and_then(|d| d.get(field)) {
                        Some(V::Str(x)) => out.push_str(x),
                        Some(x) => out.push_str(&x.to_json()),
                        None => return Err(Err::Stop(format!("step {} gave no {} to use", id, field))),
                    }
                    rest = &rest[at + end + 1..];
                }
                out.push_str(rest); V::Str(out)
            }
            V::Arr(a) => V::Arr(a.iter().map(|x| self.fill(x)).collect::<Result<_, _>>()?),
            V::Obj(m) => V::Obj(m.iter().map(|(k, x)| Ok((k.clone(), self.fill(x)?))).collect::<Result<_, Err>>()?),
            x => x.clone(),
        })
    }
    fn refs(v: &V, out: &mut Vec<String>) {
        match v {
            V::Str(s) => { let mut r = s.as_str(); while let Some(at) = r.find("${") { if let Some(d) = r[at..].find('.') { out.push(r[at + 2..at + d].to_string()); r = &r[at + d..] } else { break } } }
            V::Arr(a) => a.iter().for_each(|x| Self::refs(x, out)),
            V::Obj(m) => m.values().for_each(|x| Self::refs(x, out)),
            _ => {}
        }
    }

    fn lookup(&mut self, op: &str, refk: &str, refv: &str) -> Result<V, Err> {
        let mut res = V::Null;
        for pause in [0.0, 0.1, 0.2, 0.4] {
            if pause > 0.0 { if pause > self.left() { break } self.nap(pause) }
            res = self.v.req("lookup", obj(vec![("operation", st(op)), (refk, st(refv))]))?;
            if res.is("reconciled", "found") || res.is("reconciled", "not_found") || res.get("resume_token").is_some()
                || res.is("category", "rate_limited") || stops(&res) { break }
        }
        Ok(res)
    }

    fn collect(&mut self, step: &V, id: &str, mut res: V) -> Result<Next, Err> {
        let token = res.s("resume_token").unwrap_or("").to_string();
        self.rec(id).insert("token".into(), st(&token)); self.save();
        loop {
            if self.left() <= 0.4 {
                self.waiting.push(format!("{} ({}) awaits {}", step.s("call").unwrap_or("?"), id, res.s("owner").unwrap_or("its owner")));
                return Ok(Next::Settled("waiting"));
            }
            let (asked, w) = (now(), self.wait_s());
            match self.v.req("call.resume", obj(vec![("resume_token", st(&token)), ("wait_s", V::Num(w))])) {
                Err(Err::Refused(_)) => { self.rec(id).remove("token"); self.save(); return Ok(Next::Send) }
                Err(e) => return Err(e),
                Ok(nxt) => {
                    if !nxt.is("category", "approval_pending") { self.rec(id).remove("token"); self.save(); return Ok(Next::Answer(nxt)) }
                    res = nxt;
                    if w > 1.0 && now() - asked < w / 2.0 { self.nap(0.2) }
                }
            }
        }
    }

    fn settle(&mut self, id: &str, data: Option<&V>) -> Next {
        let d = match data { Some(V::Obj(m)) => V::Obj(m.clone()), _ => V::Obj(BTreeMap::new()) };
        let r = self.rec(id); r.remove("token"); r.insert("data".into(), d); self.save();
        Next::Settled("done")
    }

    fn step(&mut self, step: &V) -> Result<&'static str, Err> {
        let id = step.s("id").unwrap_or("").to_string();
        let op = step.s("call").unwrap_or("").to_string();
        let key = format!("{}:{}:{}", self.task.s("run_id").unwrap_or(""), self.task.s("agent").unwrap_or(""), id);
        let params = self.fill(step.get("params").unwrap_or(&V::Obj(BTreeMap::new())))?;
        let (mut refk, mut refv) = ("idempotency_key".to_string(), key.clone());
        let attempts = |a: &Agent| a.state.get(&id).and_then(|r| r.n("attempts")).unwrap_or(0.0);
        let mut next = Next::Send;
        let rec = self.rec(&id).clone();
        if let Some(tok) = rec.get("token").and_then(|t| if let V::Str(s) = t { Some(s.clone()) } else { None }) {
            match self.v.req("call.resume", obj(vec![("resume_token", st(&tok)), ("wait_s", V::Num(self.wait_s()))])) {
                Ok(r) => next = Next::Answer(r),
                Err(Err::Refused(_)) => { self.rec(&id).remove("token"); self.save(); }
                Err(e) => return Err(e),
            }
        } else if rec.contains_key("sent") {
            next = Next::Answer(self.lookup(&op, &refk, &refv)?);
        }
        loop {
            let res = match next {
                Next::Settled(s) => return Ok(s),
                Next::Answer(r) => r,
                Next::Send => {
                    if attempts(self) >= 3.0 || self.left() <= 0.2 { return Ok("failed") }
                    let n = attempts(self) + 1.0;
                    let r = self.rec(&id); r.insert("sent".into(), V::Bool(true)); r.insert("attempts".into(), V::Num(n)); self.save();
                    let w = self.wait_s();
                    match self.v.req("call", obj(vec![("operation", st(&op)), ("params", params.clone()), ("idempotency_key", st(&key)), ("wait_s", V::Num(w))])) {
                        Ok(r) => r,
                        Err(Err::Refused(m)) => { eprintln!("[rt45c-rust] {} refused: {}", id, m); return Ok("failed") }
                        Err(e) => return Err(e),
                    }
                }
            };
            let cat = res.s("category").unwrap_or("").to_string();
            let retry = res.s("retry").unwrap_or("").to_string();
            let recon = res.s("reconciled").map(|s| s.to_string());
            next = match (cat.as_str(), recon.as_deref()) {
                ("success", Some("found")) => {                       // a lookup answered (6)
                    let first = res.get("data").and_then(|d| d.get("created")).and_then(|c| if let V::Arr(a) = c { a.first().cloned() } else { None });
                    self.settle(&id, first.as_ref())
                }
                ("success", Some("not_found")) => Next::Send,
                ("success", Some(_)) | (_, Some("unknown")) if cat != "rate_limited" && cat != "approval_pending" && !stops(&res) => {
                    if res.get("resume_token").is_none() { return Err(Err::Stop(format!("{} ({}): outcome unknown ({}); a person must inspect it", op, id, cat))) }
                    self.collect(step, &id, res)?
                }
                ("success", _) => self.settle(&id, res.get("data")),
                ("approval_pending", _) => self.collect(step, &id, res)?,
                _ if stops(&res) => return Err(Err::Stop(format!("{} ({}) answered {} (retry: {})", op, id, cat, retry))),
                ("outcome_unknown", _) => {
                    refk = "correlation_id".into(); refv = res.s("correlation_id").unwrap_or("").to_string();
                    Next::Answer(self.lookup(&op, &refk, &refv)?)
                }
                ("rate_limited", r) => {
                    let after = res.n("retry_after_s").unwrap_or(1.0);
                    if r == Some("unknown") {
                        if after > self.left() { return Err(Err::Stop(format!("{} ({}): outcome unknown, no time to look it up again", op, id))) }
                        self.nap(after);
                        Next::Answer(self.lookup(&op, &refk, &refv)?)
                    } else {
                        if attempts(self) >= 3.0 || after > self.left() - 0.3 { return Ok("failed") }
                        self.nap(after); Next::Send
                    }
                }
                ("local_failure", _) | ("confirmed_failure", _) => {
                    if attempts(self) >= 3.0 { return Ok("failed") }
                    self.nap(0.2); Next::Send
                }
                ("vault_locked", _) => {
                    loop {
                        let s = self.v.rpc("vault.status", obj(vec![]))?;
                        if s.get("locked") == Some(&V::Bool(false)) { break }
                        if self.left() < 0.5 { return Err(Err::Stop(format!("the vault stayed locked; {} ({}) not sent", op, id))) }
                        self.nap(0.3);
                    }
                    Next::Send
                }
                _ => return Err(Err::Stop(format!("{} ({}) answered {} ({})", op, id, cat, retry))),
            };
        }
    }
}

fn stops(r: &V) -> bool { r.is("retry", "never") || r.is("retry", "human_required") }

fn main() {
    let path = std::env::var("VAULTSIM_TASK").unwrap_or_default();
    let task = std::fs::read_to_string(&path).ok().and_then(|t| parse(&t)).unwrap_or(V::Null);
    let deadline = task.n("deadline").unwrap_or(now() + 5.0);
    let sd = task.s("state_dir").unwrap_or(".").to_string();
    let _ = std::fs::create_dir_all(&sd);
    let state_path = format!("{}/rt45c-rust.json", sd);
    let state = match std::fs::read_to_string(&state_path).ok().and_then(|t| parse(&t)) { Some(V::Obj(m)) => m, _ => BTreeMap::new() };
    let mut v = match Vault::connect(&std::env::var("VAULTSIM_SOCKET").unwrap_or_default(), deadline) {
        Ok(v) => v, Err(e) => { println!("not done: {}", e); return }
    };
    let open = obj(vec![("agent", st(task.s("agent").unwrap_or(""))), ("run_id", st(task.s("run_id").unwrap_or(""))),
                        ("client", obj(vec![("name", st("rt45c-rust")), ("version", st("45.0"))]))]);
    match v.rpc("session.open", open) {
        Ok(r) if r.s("session_id").is_some() => v.sid = r.s("session_id").unwrap().to_string(),
        _ => { println!("not done: no session"); return }
    }
    let steps = match task.get("steps") { Some(V::Arr(a)) => a.clone(), _ => vec![] };
    let mut a = Agent { v, task: task.clone(), state, state_path, deadline, waiting: vec![] };
    let mut stopped: Option<String> = None;
    for s in &steps {
        let id = s.s("id").unwrap_or("");
        if a.done(id) { continue }
        if !a.waiting.is_empty() { break }
        let mut rs = vec![]; Agent::refs(s.get("params").unwrap_or(&V::Null), &mut rs);
        if rs.iter().any(|r| !a.done(r)) { continue }
        match a.step(s) {
            Ok(_) => {}
            Err(Err::Stop(m)) | Err(Err::Refused(m)) => { stopped = Some(m); break }
        }
    }
    if a.left() > -0.5 { let sid = a.v.sid.clone(); let _ = a.v.rpc("session.close", obj(vec![("session_id", st(&sid))])); }
    let undone: Vec<&str> = steps.iter().filter_map(|s| s.s("id")).filter(|i| !a.done(i)).collect();
    let msg = if undone.is_empty() { format!("done: {} steps", steps.len()) }
        else if let Some(m) = stopped { format!("not done: {}", m) }
        else if !a.waiting.is_empty() { format!("waiting: {} (token kept in state_dir)", a.waiting.join("; ")) }
        else { format!("not done: {} did not succeed", undone.join(", ")) };
    println!("{}", msg);
}
