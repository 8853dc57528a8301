// A careful agent in Rust, standard library only, written from docs/agent-contract.md alone
// (red team 25, c). Build: rustc -O -o rt25c_planner rt25c_planner.rs
//
// Shape: a planner process reads `vault.status` and `catalog` first, then runs each step whose
// operation the catalog says is never asked about (`approval.mode: auto`) in a worker of its own:
// a fresh process (this same program, `--worker`) that opens its own session (§3: "a child opens
// its own session"), does that one step (lookups, bounded resends) and prints one JSON line with
// how it ended. Gated steps run in the planner's own session (§3: make gated calls from the
// process whose session holds the grant). State: an append-only journal (JSON lines, fsync'd) in
// state_dir, folded on start. Logging as the `tracing` crate's fmt subscriber writes it by
// default (`2026-12-05T07:50:22.123456Z  INFO rt25c_planner: done: 3 steps`); RT25R_LOG=json
// writes tracing's JSON format, RT25R_LOG=structlog structlog's JSONRenderer lines.
// RT25R_HANDOFF=1: a step the catalog says is asked about on every call (`per_call`: no grant
// for a session to hold) runs in a worker too, which asks with `wait_s: 0` and hands the
// `approval_pending` answer's resume token back; the planner collects it with `call.resume` in its
// own session (§4: collect it with its resume_token; §6: the same agent and run only).
// RT25R_CRASH=1: each worker dies right after its call was answered, before telling the planner
// (a lost answer); the planner starts one more worker for that step, which looks it up by its
// key before anything else (§6) and follows the lookup.
use std::collections::HashMap;
use std::env;
use std::fs::{self, OpenOptions};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

// ---------------------------------------------------------------- JSON
#[derive(Clone, Debug, PartialEq)]
enum J { Null, Bool(bool), Num(f64), Str(String), Arr(Vec<J>), Obj(Vec<(String, J)>) }

impl J {
    fn get(&self, k: &str) -> &J {
        static NULL: J = J::Null;
        if let J::Obj(m) = self { for (key, v) in m { if key == k { return v; } } }
        &NULL
    }
    fn s(&self) -> &str { if let J::Str(s) = self { s } else { "" } }
    fn f(&self) -> Option<f64> { if let J::Num(n) = self { Some(*n) } else { None } }
    fn is_null(&self) -> bool { matches!(self, J::Null) }
    fn obj(pairs: Vec<(&str, J)>) -> J { J::Obj(pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect()) }
    fn str(s: &str) -> J { J::Str(s.to_string()) }
    fn dump(&self) -> String { let mut o = String::new(); self.write(&mut o); o }
    fn write(&self, o: &mut String) {
        match self {
            J::Null => o.push_str("null"),
            J::Bool(b) => o.push_str(if *b { "true" } else { "false" }),
            J::Num(n) => if n.fract() == 0.0 && n.abs() < 1e15 { o.push_str(&format!("{}", *n as i64)) } else { o.push_str(&format!("{}", n)) },
            J::Str(s) => { o.push('"'); for c in s.chars() { match c {
                '"' => o.push_str("\\\""), '\\' => o.push_str("\\\\"), '\n' => o.push_str("\\n"), '\r' => o.push_str("\\r"),
                '\t' => o.push_str("\\t"), c if (c as u32) < 0x20 || c == '\u{2028}' || c == '\u{2029}' => o.push_str(&format!("\\u{:04x}", c as u32)),
                c => o.push(c) } } o.push('"'); }
            J::Arr(a) => { o.push('['); for (i, v) in a.iter().enumerate() { if i > 0 { o.push(','); } v.write(o); } o.push(']'); }
            J::Obj(m) => { o.push('{'); for (i, (k, v)) in m.iter().enumerate() { if i > 0 { o.push(','); } J::Str(k.clone()).write(o); o.push(':'); v.write(o); } o.push('}'); }
        }
    }
}

struct P<'a> { b: &'a [u8], i: usize }
impl<'a> P<'a> {
    fn parse(text: &str) -> Result<J, String> {
        let mut p = P { b: text.as_bytes(), i: 0 };
        let v = p.val(0)?; p.ws();
        if p.i != p.b.len() { return Err("trailing bytes".into()); }
        Ok(v)
    }
    fn ws(&mut self) { while self.i < self.b.len() && matches!(self.b[self.i], b' ' | b'\t' | b'\n' | b'\r') { self.i += 1; } }
    fn val(&mut self, depth: usize) -> Result<J, String> {
        if depth > 200 { return Err("too deep".into()); }
        self.ws();
        match self.b.get(self.i) {
            Some(b'{') => { self.i += 1; let mut m = Vec::new(); self.ws();
                if self.b.get(self.i) == Some(&b'}') { self.i += 1; return Ok(J::Obj(m)); }
                loop { self.ws(); let k = match self.val(depth + 1)? { J::Str(s) => s, _ => return Err("key".into()) };
                    self.ws(); if self.b.get(self.i) != Some(&b':') { return Err("colon".into()); } self.i += 1;
                    let v = self.val(depth + 1)?; m.push((k, v)); self.ws();
                    match self.b.get(self.i) { Some(b',') => self.i += 1, Some(b'}') => { self.i += 1; return Ok(J::Obj(m)); } _ => return Err("object".into()) } } }
            Some(b'[') => { self.i += 1; let mut a = Vec::new(); self.ws();
                if self.b.get(self.i) == Some(&b']') { self.i += 1; return Ok(J::Arr(a)); }
                loop { a.push(self.val(depth + 1)?); self.ws();
                    match self.b.get(self.i) { Some(b',') => self.i += 1, Some(b']') => { self.i += 1; return Ok(J::Arr(a)); } _ => return Err("array".into()) } } }
            Some(b'"') => { self.i += 1; let mut s = String::new();
                loop { let c = *self.b.get(self.i).ok_or("eof in string")?; self.i += 1;
                    match c { b'"' => return Ok(J::Str(s)),
                        b'\\' => { let e = *self.b.get(self.i).ok_or("eof")?; self.i += 1;
                            match e { b'n' => s.push('\n'), b't' => s.push('\t'), b'r' => s.push('\r'), b'b' => s.push('\u{8}'), b'f' => s.push('\u{c}'),
                                b'u' => { let mut cp = self.hex4()?;
                                    if (0xD800..0xDC00).contains(&cp) && self.b.get(self.i) == Some(&b'\\') && self.b.get(self.i + 1) == Some(&b'u') {
                                        self.i += 2; let lo = self.hex4()?; cp = 0x10000 + ((cp - 0xD800) << 10) + (lo.wrapping_sub(0xDC00) & 0x3FF); }
                                    s.push(char::from_u32(cp).unwrap_or('\u{fffd}')); }
                                other => s.push(other as char) } }
                        _ => { let start = self.i - 1; let mut end = self.i;
                            while end < self.b.len() && self.b[end] != b'"' && self.b[end] != b'\\' { end += 1; }
                            s.push_str(std::str::from_utf8(&self.b[start..end]).map_err(|_| "utf8")?); self.i = end; } } } }
            Some(b't') if self.b[self.i..].starts_with(b"true") => { self.i += 4; Ok(J::Bool(true)) }
            Some(b'f') if self.b[self.i..].starts_with(b"false") => { self.i += 5; Ok(J::Bool(false)) }
            Some(b'n') if self.b[self.i..].starts_with(b"null") => { self.i += 4; Ok(J::Null) }
            Some(_) => { let start = self.i;
                while self.i < self.b.len() && matches!(self.b[self.i], b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9') { self.i += 1; }
                std::str::from_utf8(&self.b[start..self.i]).ok().and_then(|t| t.parse::<f64>().ok()).map(J::Num).ok_or_else(|| "number".into()) }
            None => Err("eof".into()),
        }
    }
    fn hex4(&mut self) -> Result<u32, String> {
        let h = self.b.get(self.i..self.i + 4).ok_or("short \\u")?; self.i += 4;
        u32::from_str_radix(std::str::from_utf8(h).map_err(|_| "hex")?, 16).map_err(|_| "hex".into())
    }
}

// ---------------------------------------------------------------- clock and log
fn now() -> f64 { SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0) }

fn rfc3339(t: f64) -> String {
    let secs = t.floor() as i64; let micros = ((t - t.floor()) * 1e6) as i64;
    let (days, rem) = (secs.div_euclid(86400), secs.rem_euclid(86400));
    // civil from days (Howard Hinnant's algorithm)
    let z = days + 719468; let era = z.div_euclid(146097); let doe = z - era * 146097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365; let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1; let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:06}Z", y, m, d, rem / 3600, rem % 3600 / 60, rem % 60, micros)
}

// every log line is the agent's own; ids and tokens are cut to their first 6 characters
fn log(level: &str, msg: &str) { log_as(level, msg, true) }

// The final message leaves the target out (tracing's `with_target(false)`; its JSON flattened,
// `flatten_event(true)`): §7 reads `TIME LEVEL target: done` as a name before the message.
fn log_as(level: &str, msg: &str, with_target: bool) {
    let target = if env::args().any(|a| a == "--worker") { "rt25c_planner::worker" } else { "rt25c_planner" };
    let line = match env::var("RT25R_LOG").as_deref() {
        Ok("json") if with_target => J::obj(vec![("timestamp", J::str(&rfc3339(now()))), ("level", J::str(level)),
                                  ("fields", J::obj(vec![("message", J::str(msg))])), ("target", J::str(target))]).dump(),
        Ok("json") => J::obj(vec![("timestamp", J::str(&rfc3339(now()))), ("level", J::str(level)),
                                  ("message", J::str(msg)), ("target", J::str(target))]).dump(),
        Ok("structlog") => J::obj(vec![("event", J::str(msg)), ("level", J::str(&level.to_lowercase())),
                                       ("logger", J::str(target)), ("timestamp", J::str(&rfc3339(now())))]).dump(),
        _ if with_target => format!("{} {:>5} {}: {}", rfc3339(now()), level, target, msg),
        _ => format!("{} {:>5} {}", rfc3339(now()), level, msg),
    };
    // a worker's stdout carries its one answer line to the planner: its log goes to stderr
    if target.ends_with("worker") { eprintln!("{}", line); } else { println!("{}", line); }
}

fn redact(s: &str) -> String { if s.len() > 6 { format!("{}…", &s[..6]) } else { s.to_string() } }

// ---------------------------------------------------------------- the vault connection
struct Vault { w: UnixStream, r: BufReader<UnixStream>, next: i64, deadline: f64 }

impl Vault {
    fn connect(deadline: f64) -> Result<Vault, String> {
        let path = env::var("VAULTSIM_SOCKET").map_err(|_| "no VAULTSIM_SOCKET")?;
        let w = UnixStream::connect(&path).map_err(|e| format!("connect: {}", e))?;
        let r = BufReader::new(w.try_clone().map_err(|e| e.to_string())?);
        Ok(Vault { w, r, next: 0, deadline })
    }
    /// One request, its answer (matched by id). Nothing is sent within 0.15 s of the deadline.
    fn rpc(&mut self, method: &str, params: J) -> Result<J, String> {
        if now() > self.deadline - 0.15 { return Err(format!("{} not sent: the deadline is here", method)); }
        self.next += 1;
        let id = self.next;
        let req = J::obj(vec![("jsonrpc", J::str("2.0")), ("id", J::Num(id as f64)), ("method", J::str(method)), ("params", params)]);
        let mut line = req.dump(); line.push('\n');
        if let Err(e) = self.w.write_all(line.as_bytes()) {
            // a refusal is written as the connection is accepted: read it before giving up (§3)
            let mut rest = String::new(); let _ = self.r.read_to_string(&mut rest);
            return Err(format!("write: {} {}", e, rest.trim()));
        }
        loop {
            let left = self.deadline + 0.5 - now();
            if left <= 0.0 { return Err(format!("no answer to {} before the deadline", method)); }
            self.w.set_read_timeout(Some(Duration::from_secs_f64(left.max(0.01)))).ok();
            let mut buf = String::new();
            match self.r.read_line(&mut buf) {
                Ok(0) => return Err("the vault closed the connection".into()),
                Ok(_) => {}
                Err(e) => return Err(format!("read: {}", e)),
            }
            let Ok(ans) = P::parse(buf.trim_end()) else { continue };
            if ans.get("id").f() == Some(id as f64) { return Ok(ans); }
        }
    }
}

// ---------------------------------------------------------------- the task
struct Task { agent: String, run_id: String, deadline: f64, state_dir: String, steps: Vec<J>, path: String }

fn load_task(path: &str) -> Result<Task, String> {
    let t = P::parse(&fs::read_to_string(path).map_err(|e| e.to_string())?)?;
    let run_id = match t.get("run_id").s() { "" => env::var("VAULTSIM_RUN_ID").unwrap_or_default(), s => s.to_string() };
    Ok(Task { agent: t.get("agent").s().to_string(), run_id, deadline: t.get("deadline").f().unwrap_or(now() + 10.0),
              state_dir: t.get("state_dir").s().to_string(),
              steps: if let J::Arr(a) = t.get("steps") { a.clone() } else { vec![] }, path: path.to_string() })
}

fn open_session(v: &mut Vault, task: &Task, role: &str) -> Result<String, String> {
    let ans = v.rpc("session.open", J::obj(vec![("agent", J::str(&task.agent)), ("run_id", J::str(&task.run_id)),
        ("client", J::obj(vec![("name", J::str("rt25c-planner")), ("version", J::str(role))]))]))?;
    match ans.get("result").get("session_id").s() { "" => Err(format!("session refused: {}", ans.get("error").dump())), s => Ok(s.to_string()) }
}

// ---------------------------------------------------------------- one step
#[derive(Debug)]
enum Outcome { Done(J), Failed(String), Stop(String), Waiting(String, String) }

fn outcome_json(o: &Outcome) -> J {
    match o {
        Outcome::Done(d) => J::obj(vec![("state", J::str("done")), ("data", d.clone())]),
        Outcome::Failed(w) => J::obj(vec![("state", J::str("failed")), ("why", J::str(w))]),
        Outcome::Stop(w) => J::obj(vec![("state", J::str("stop")), ("why", J::str(w))]),
        Outcome::Waiting(t, w) => J::obj(vec![("state", J::str("waiting")), ("token", J::str(t)), ("why", J::str(w))]),
    }
}

fn outcome_of(j: &J) -> Outcome {
    match j.get("state").s() {
        "done" => Outcome::Done(j.get("data").clone()),
        "waiting" => Outcome::Waiting(j.get("token").s().into(), j.get("why").s().into()),
        "failed" => Outcome::Failed(j.get("why").s().into()),
        _ => Outcome::Stop(j.get("why").s().into()),
    }
}

const NEVER: [&str; 6] = ["authentication_failed", "authorization_denied", "malformed_response", "approval_denied", "approval_expired", "approval_unroutable"];

struct Step<'a> { v: &'a mut Vault, sid: String, op: String, params: J, key: String, deadline: f64, journal: Option<&'a mut Journal>, step_id: String }

impl<'a> Step<'a> {
    fn note(&mut self, state: &str, extra: Vec<(&str, J)>) {
        let id = self.step_id.clone();
        if let Some(j) = self.journal.as_mut() { j.append(&id, state, extra); }
    }
    fn wait_s(&self) -> f64 { (self.deadline - now() - 1.5).clamp(0.0, 60.0) }
    fn call(&mut self) -> Result<J, String> {
        let p = J::obj(vec![("session_id", J::str(&self.sid)), ("operation", J::str(&self.op)), ("params", self.params.clone()),
                            ("idempotency_key", J::str(&self.key)), ("wait_s", J::Num((self.wait_s() * 10.0).floor() / 10.0))]);
        log("INFO", &format!("call {} key={}", self.op, self.key));
        let answer = self.v.rpc("call", p);
        if self.journal.is_none() && env::var("RT25R_CRASH").is_ok() && env::var("RT25R_RECOVER").is_err() {
            std::process::exit(3);  // a worker lost: its answer never reaches the planner
        }
        answer
    }
    fn lookup(&mut self, by: &str, value: &str) -> Result<J, String> {
        log("INFO", &format!("lookup {} by {} {}", self.op, by, redact(value)));
        self.v.rpc("lookup", J::obj(vec![("session_id", J::str(&self.sid)), (by, J::str(value)), ("operation", J::str(&self.op))]))
    }
    fn data_of(r: &J) -> J {
        if r.get("reconciled").s() == "found" {
            if let J::Arr(c) = r.get("data").get("created") { if let Some(first) = c.first() { return first.clone(); } }
        }
        r.get("data").clone()
    }

    /// The whole logical step: one call, its resumes, lookups and bounded resends.
    fn run(&mut self, token: Option<String>) -> Outcome {
        let mut attempts = 0;
        let mut ans: Result<J, String>;
        if let Some(t) = token {
            ans = self.resume(&t);
            if ans.as_ref().map(|a| !a.get("error").is_null()).unwrap_or(false) {
                log("WARN", "the vault no longer knows the saved token: the step again, under its key");
                attempts = 1; ans = self.call();
            }
        } else { attempts = 1; self.note("sent", vec![]); ans = self.call(); }
        let mut first = Some(ans);
        self.run_from(&mut first, attempts)
    }

    fn run_from(&mut self, first: &mut Option<Result<J, String>>, attempts: u32) -> Outcome {
        let mut attempts = attempts;
        let mut ans = first.take().unwrap_or_else(|| Err("nothing to follow".into()));
        loop {
            let a = match ans { Ok(a) => a, Err(e) => return Outcome::Stop(e) };
            if !a.get("error").is_null() { return Outcome::Stop(format!("{} answered an error: {}", self.op, a.get("error").get("message").s())); }
            let r = a.get("result").clone();
            let cat = r.get("category").s().to_string();
            log(if r.get("ok") == &J::Bool(true) { "INFO" } else { "WARN" },
                &format!("{} → {} (retry {}, {})", self.op, cat, r.get("retry").s(), redact(r.get("correlation_id").s())));
            if NEVER.contains(&cat.as_str()) { return Outcome::Stop(format!("{} {}: {}", self.op, cat, r.get("message").s())); }
            match cat.as_str() {
                "success" => match r.get("reconciled").s() {
                    "not_found" => { ans = self.resend(&mut attempts); }
                    "unknown" if !r.get("resume_token").s().is_empty() => { let t = r.get("resume_token").s().to_string(); ans = self.resume(&t); }
                    "unknown" => return Outcome::Stop(format!("{}: nobody can tell whether it took effect; a person must inspect it", self.op)),
                    _ => return Outcome::Done(Self::data_of(&r)),
                },
                "approval_pending" => {
                    let t = r.get("resume_token").s().to_string();
                    self.note("pending", vec![("token", J::str(&t))]);
                    let why = format!("{} needs approval from {} before {} (request {})", self.op, r.get("owner").s(),
                                      rfc3339(r.get("deadline").f().unwrap_or(0.0)), r.get("request_id").s());
                    if self.deadline - now() < 2.0 { return Outcome::Waiting(t, why); }
                    ans = self.resume(&t);
                }
                "outcome_unknown" => { let cid = r.get("correlation_id").s().to_string(); ans = self.reconcile(&cid); }
                "rate_limited" => {
                    let after = r.get("retry_after_s").f().unwrap_or(1.0);
                    if now() + after + 0.5 > self.deadline { return Outcome::Failed(format!("{} rate limited past the deadline", self.op)); }
                    std::thread::sleep(Duration::from_secs_f64(after));
                    ans = self.resend(&mut attempts);
                }
                "local_failure" | "confirmed_failure" => { ans = self.resend(&mut attempts); }
                "vault_locked" => {
                    if !self.until_unlocked() { return Outcome::Failed("the vault stayed locked until the deadline".into()); }
                    ans = self.resend(&mut attempts);
                }
                other => return Outcome::Stop(format!("{}: {}", self.op, other)),
            }
            if let Err(e) = &ans { if e.starts_with("gave up") { return Outcome::Failed(e.clone()); } }
        }
    }
    /// Ask once without waiting; a pending answer's token goes to the planner, which collects it.
    fn hand_off(&mut self) -> Outcome {
        let p = J::obj(vec![("session_id", J::str(&self.sid)), ("operation", J::str(&self.op)), ("params", self.params.clone()),
                            ("idempotency_key", J::str(&self.key)), ("wait_s", J::Num(0.0))]);
        log("INFO", &format!("call {} key={} wait_s=0 (hand-off)", self.op, self.key));
        match self.v.rpc("call", p) {
            Ok(a) if a.get("result").get("category").s() == "approval_pending" => {
                let r = a.get("result");
                Outcome::Waiting(r.get("resume_token").s().into(), format!("{} needs approval from {} (request {})",
                                 self.op, r.get("owner").s(), r.get("request_id").s()))
            }
            Ok(a) => { let mut first = Some(Ok(a)); self.run_from(&mut first, 1) }
            Err(e) => Outcome::Stop(e),
        }
    }
    /// A predecessor sent this step and its answer was lost: a lookup by key first, then as it says.
    fn recover(&mut self) -> Outcome {
        let key = self.key.clone();
        match self.lookup("idempotency_key", &key) {
            Ok(seen) => {
                let r = seen.get("result");
                if !seen.get("error").is_null() { return Outcome::Stop(format!("{}: the lookup answered an error", self.op)); }
                if r.get("reconciled").s() == "not_found" && r.get("category").s() == "success" {
                    return self.run(None);  // it did not take effect: the step again, under its key
                }
                let mut first = Some(Ok(seen));
                self.run_from(&mut first, 1)
            }
            Err(e) => Outcome::Stop(e),
        }
    }
    fn resume(&mut self, token: &str) -> Result<J, String> {
        log("INFO", &format!("call.resume {} token={}", self.op, redact(token)));
        let p = J::obj(vec![("session_id", J::str(&self.sid)), ("resume_token", J::str(token)), ("wait_s", J::Num((self.wait_s() * 10.0).floor() / 10.0))]);
        self.v.rpc("call.resume", p)
    }
    /// A resend, always after a lookup by the step's key (§6: a lookup is always allowed).
    fn resend(&mut self, attempts: &mut u32) -> Result<J, String> {
        if *attempts >= 3 { return Err(format!("gave up: {} failed 3 times", self.op)); }
        let key = self.key.clone();
        let mut seen = self.lookup("idempotency_key", &key)?;
        // `unknown` (no wait to collect): ask again shortly; still unknown, a person must look (§6)
        let mut pause = 0.1;
        while seen.get("result").get("reconciled").s() == "unknown" && seen.get("result").get("resume_token").s().is_empty()
            && !NEVER.contains(&seen.get("result").get("category").s()) {
            if pause > 0.4 || now() + pause + 1.0 > self.deadline {
                return Err(format!("{}: nobody can tell whether it took effect; a person must inspect it", self.op));
            }
            std::thread::sleep(Duration::from_secs_f64(pause));
            pause *= 2.0;
            seen = self.lookup("idempotency_key", &key)?;
        }
        let r = seen.get("result");
        let cat = r.get("category").s();
        if NEVER.contains(&cat) || cat == "rate_limited" || r.get("reconciled").s() != "not_found" || !seen.get("error").is_null() {
            return Ok(seen);  // found, unknown, a refusal, a wait still running: follow the lookup
        }
        *attempts += 1;
        self.call()
    }
    /// After outcome_unknown: lookups of that call, 0.1, 0.2, 0.4 s apart while it is unknown.
    fn reconcile(&mut self, cid: &str) -> Result<J, String> {
        let mut pause = 0.1;
        loop {
            let seen = self.lookup("correlation_id", cid)?;
            let r = seen.get("result");
            if r.get("reconciled").s() != "unknown" || !r.get("resume_token").s().is_empty() || pause > 0.4
                || NEVER.contains(&r.get("category").s()) || now() + pause + 1.0 > self.deadline { return Ok(seen); }
            std::thread::sleep(Duration::from_secs_f64(pause));
            pause *= 2.0;
        }
    }
    fn until_unlocked(&mut self) -> bool {
        loop {
            if now() + 1.0 > self.deadline { return false; }
            std::thread::sleep(Duration::from_millis(300));
            match self.v.rpc("vault.status", J::obj(vec![])) {
                Ok(s) if s.get("result").get("locked") == &J::Bool(false) => return true,
                Ok(_) => {}
                Err(_) => return false,
            }
        }
    }
}

// ---------------------------------------------------------------- journal (append-only)
struct Journal { path: String, done: HashMap<String, J>, pending: HashMap<String, String>, over: HashMap<String, bool> }

impl Journal {
    fn open(state_dir: &str) -> Journal {
        let path = format!("{}/journal.jsonl", state_dir);
        let mut j = Journal { path, done: HashMap::new(), pending: HashMap::new(), over: HashMap::new() };
        if let Ok(text) = fs::read_to_string(&j.path) {
            for line in text.lines() {
                let Ok(e) = P::parse(line) else { continue };  // a torn last line: ignore it
                let id = e.get("step").s().to_string();
                match e.get("state").s() {
                    "done" => { j.done.insert(id.clone(), e.get("data").clone()); j.pending.remove(&id); }
                    "pending" => { j.pending.insert(id, e.get("token").s().to_string()); }
                    "stop" => { j.over.insert(id.clone(), true); j.pending.remove(&id); }
                    _ => {}
                }
            }
        }
        j
    }
    fn append(&mut self, step: &str, state: &str, extra: Vec<(&str, J)>) {
        let mut pairs = vec![("step", J::str(step)), ("state", J::str(state)), ("at", J::Num(now()))];
        pairs.extend(extra);
        let e = J::obj(pairs);
        match state { "done" => { self.done.insert(step.into(), e.get("data").clone()); self.pending.remove(step); }
                      "pending" => { self.pending.insert(step.into(), e.get("token").s().into()); }
                      "stop" => { self.over.insert(step.into(), true); self.pending.remove(step); } _ => {} }
        if let Ok(mut f) = OpenOptions::new().create(true).append(true).open(&self.path) {
            let _ = f.write_all(format!("{}\n", e.dump()).as_bytes());
            let _ = f.sync_data();
        }
    }
}

// ${ID.FIELD} from the data of finished steps; None when a value would have to be guessed
fn fill(v: &J, done: &HashMap<String, J>) -> Option<J> {
    match v {
        J::Str(s) => {
            let mut out = String::new(); let mut rest = s.as_str();
            while let Some(at) = rest.find("${") {
                out.push_str(&rest[..at]);
                let end = rest[at..].find('}')? + at;
                let inner = &rest[at + 2..end];
                let (id, field) = inner.split_once('.')?;
                match done.get(id)?.get(field) { J::Str(x) => out.push_str(x), J::Null => return None, other => out.push_str(&other.dump()) }
                rest = &rest[end + 1..];
            }
            out.push_str(rest);
            Some(J::Str(out))
        }
        J::Arr(a) => a.iter().map(|x| fill(x, done)).collect::<Option<Vec<_>>>().map(J::Arr),
        J::Obj(m) => m.iter().map(|(k, x)| fill(x, done).map(|y| (k.clone(), y))).collect::<Option<Vec<_>>>().map(J::Obj),
        other => Some(other.clone()),
    }
}

// ---------------------------------------------------------------- worker
fn worker(args: &[String]) -> i32 {
    // --worker TASK INDEX PARAMS
    let task = match load_task(&args[0]) { Ok(t) => t, Err(e) => { println!("{}", outcome_json(&Outcome::Stop(e)).dump()); return 0; } };
    let idx: usize = args[1].parse().unwrap_or(0);
    let params = P::parse(&args[2]).unwrap_or(J::Obj(vec![]));
    let step = &task.steps[idx];
    let out = (|| {
        let mut v = Vault::connect(task.deadline)?;
        let sid = open_session(&mut v, &task, "worker")?;
        let mut s = Step { v: &mut v, sid: sid.clone(), op: step.get("call").s().into(), params, step_id: step.get("id").s().into(),
                           key: format!("{}:{}:{}", task.run_id, task.agent, step.get("id").s()), deadline: task.deadline - 0.8, journal: None };
        let o = if env::var("RT25R_RECOVER").is_ok() { s.recover() }
                else if env::var("RT25R_HANDOFF").is_ok() { s.hand_off() } else { s.run(None) };
        let _ = v.rpc("session.close", J::obj(vec![("session_id", J::str(&sid))]));
        Ok::<Outcome, String>(o)
    })().unwrap_or_else(Outcome::Stop);
    println!("{}", outcome_json(&out).dump());
    0
}

fn run_in_worker(task: &Task, idx: usize, params: &J) -> Outcome {
    match start_worker(task, idx, params, false) {
        // the worker died before telling how the step ended: one more, which looks it up first
        Outcome::Stop(w) if w == LOST => { log("WARN", "the worker was lost: another one looks the step up"); start_worker(task, idx, params, true) }
        other => other,
    }
}

const LOST: &str = "the worker said nothing";

fn start_worker(task: &Task, idx: usize, params: &J, recover: bool) -> Outcome {
    let me = match env::current_exe() { Ok(p) => p, Err(e) => return Outcome::Stop(e.to_string()) };
    let mut cmd = Command::new(me);
    if recover { cmd.env("RT25R_RECOVER", "1"); }
    let child = cmd.arg("--worker").arg(&task.path).arg(idx.to_string()).arg(params.dump())
        .stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::inherit()).spawn();
    let Ok(child) = child else { return Outcome::Stop("the worker did not start".into()) };
    let out = match child.wait_with_output() { Ok(o) => o, Err(e) => return Outcome::Stop(e.to_string()) };
    let text = String::from_utf8_lossy(&out.stdout);
    match text.lines().rev().find_map(|l| P::parse(l).ok()) { Some(j) => outcome_of(&j), None => Outcome::Stop(LOST.into()) }
}

// ---------------------------------------------------------------- planner
fn main() {
    let args: Vec<String> = env::args().skip(1).collect();
    if args.first().map(|a| a == "--worker").unwrap_or(false) { std::process::exit(worker(&args[1..])); }
    let path = env::var("VAULTSIM_TASK").unwrap_or_default();
    let task = match load_task(&path) { Ok(t) => t, Err(e) => { finish("not done", &format!("the task file is unreadable: {}", e)); return; } };
    let margin = 0.8;  // this process's end, after its last step's answer
    let mut journal = if task.state_dir.is_empty() { None } else { let _ = fs::create_dir_all(&task.state_dir); Some(Journal::open(&task.state_dir)) };
    let mut v = match Vault::connect(task.deadline - margin) { Ok(v) => v, Err(e) => { finish("not done", &e); return; } };
    // status and catalog first, before any session
    let mut locked = match v.rpc("vault.status", J::obj(vec![])) { Ok(s) => s.get("result").get("locked") == &J::Bool(true), Err(_) => false };
    let mut modes: HashMap<String, String> = HashMap::new();
    if let Ok(c) = v.rpc("catalog", J::obj(vec![])) {
        if let J::Arr(ops) = c.get("result").get("operations") {
            for o in ops { modes.insert(o.get("name").s().into(), o.get("approval").get("mode").s().into()); }
        }
    }
    log("INFO", &format!("vault locked={} catalog operations={} steps={}", locked, modes.len(), task.steps.len()));
    while locked {
        if now() + 1.0 > task.deadline - margin { finish("not done", "the vault stayed locked until the deadline"); return; }
        std::thread::sleep(Duration::from_millis(300));
        locked = match v.rpc("vault.status", J::obj(vec![])) { Ok(s) => s.get("result").get("locked") == &J::Bool(true), Err(_) => true };
    }
    let mut sid: Option<String> = None;
    let mut failed: Vec<String> = vec![];
    let mut waiting: Option<String> = None;
    let mut finished = 0;
    let mut memo: HashMap<String, J> = journal.as_ref().map(|j| j.done.clone()).unwrap_or_default();
    for (idx, step) in task.steps.iter().enumerate() {
        let id = step.get("id").s().to_string();
        let op = step.get("call").s().to_string();
        if memo.contains_key(&id) { log("INFO", &format!("{} done by a predecessor", id)); finished += 1; continue; }
        if journal.as_ref().map(|j| j.over.contains_key(&id)).unwrap_or(false) {
            finish("not done", &format!("{} was refused for good before this process", id)); return;
        }
        let Some(params) = fill(step.get("params"), &memo) else {
            failed.push(format!("{} needs data no finished step gave", id)); continue;
        };
        let token = journal.as_ref().and_then(|j| j.pending.get(&id).cloned());
        let mode = modes.get(&op).cloned().unwrap_or_default();
        let handoff = env::var("RT25R_HANDOFF").is_ok() && mode == "per_call" && token.is_none();
        let gated = (mode != "auto" && !handoff) || token.is_some();
        let out = if gated {
            if sid.is_none() {
                match open_session(&mut v, &task, "planner") { Ok(s) => sid = Some(s), Err(e) => { finish("not done", &e); return; } }
            }
            let mut s = Step { v: &mut v, sid: sid.clone().unwrap_or_default(), op: op.clone(), params, key: format!("{}:{}:{}", task.run_id, task.agent, id),
                               deadline: task.deadline - margin, journal: journal.as_mut(), step_id: id.clone() };
            s.run(token)
        } else {
            log("INFO", &format!("{} ({}) in a worker of its own", id, op));
            if let Some(j) = journal.as_mut() { j.append(&id, "sent", vec![]); }
            match run_in_worker(&task, idx, &params) {
                // the worker's pending call: collected here, in the planner's own session
                Outcome::Waiting(t, why) if handoff && task.deadline - margin - now() > 2.0 => {
                    log("INFO", &format!("{}: collecting the worker's pending call ({})", id, why));
                    if let Some(j) = journal.as_mut() { j.append(&id, "pending", vec![("token", J::str(&t))]); }
                    if sid.is_none() {
                        match open_session(&mut v, &task, "planner") { Ok(s) => sid = Some(s), Err(e) => { finish("not done", &e); return; } }
                    }
                    let mut s = Step { v: &mut v, sid: sid.clone().unwrap_or_default(), op: op.clone(), params, key: format!("{}:{}:{}", task.run_id, task.agent, id),
                                       deadline: task.deadline - margin, journal: journal.as_mut(), step_id: id.clone() };
                    s.run(Some(t))
                }
                other => other,
            }
        };
        log("INFO", &format!("{}: {:?}", id, match &out { Outcome::Done(_) => "done", Outcome::Failed(_) => "failed", Outcome::Stop(_) => "stopped", Outcome::Waiting(..) => "waiting" }));
        match out {
            Outcome::Done(d) => { if let Some(j) = journal.as_mut() { j.append(&id, "done", vec![("data", d.clone())]); } memo.insert(id, d); finished += 1; }
            Outcome::Failed(w) => failed.push(w),
            Outcome::Stop(w) => { if let Some(j) = journal.as_mut() { j.append(&id, "stop", vec![]); } close(&mut v, &sid); finish("not done", &w); return; }
            Outcome::Waiting(t, w) => { if let Some(j) = journal.as_mut() { j.append(&id, "pending", vec![("token", J::str(&t))]); } waiting = Some(w); break; }
        }
    }
    close(&mut v, &sid);
    if let Some(w) = waiting { finish("waiting", &w); }
    else if failed.is_empty() { finish("done", &format!("all {} steps succeeded", finished)); }
    else { finish("not done", &format!("{} of {} steps done; {}", finished, task.steps.len(), failed.join("; "))); }
}

fn close(v: &mut Vault, sid: &Option<String>) {
    if let Some(s) = sid { if now() < v.deadline - 0.3 { let _ = v.rpc("session.close", J::obj(vec![("session_id", J::str(s))])); } }
}

fn finish(word: &str, why: &str) {
    let level = match word { "done" => "INFO", "waiting" => "WARN", _ => "ERROR" };
    log_as(level, &format!("{}: {}", word, why), false);
}
