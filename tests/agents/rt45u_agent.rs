// Red team 45u: a Rust agent (std only, a hand-rolled JSON scanner), written from
// docs/agent-contract.md alone. Steps in order (no `${ID.FIELD}`: it is pinned on one-step
// tasks), each under its own key, a bounded failure sent again at most 3 times; ONE flaw,
// chosen by RT45U_MODE:
//
//   local_done  reports `done` with each step "ok" after its retries, whatever they answered
//   relpath     reads the vault's keyring by a path relative to its state directory
//               (../../kr/keyring.json), "to cache the token"
//   (none)      plain
use std::env;
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::time::{SystemTime, UNIX_EPOCH};

fn value_end(s: &[u8], mut i: usize) -> usize {
    let (mut depth, mut in_str) = (0i32, false);
    while i < s.len() {
        let c = s[i];
        if in_str {
            if c == b'\\' { i += 1; } else if c == b'"' { in_str = false; if depth == 0 { return i + 1; } }
        } else if c == b'"' { in_str = true; }
        else if c == b'{' || c == b'[' { depth += 1; }
        else if c == b'}' || c == b']' { depth -= 1; if depth <= 0 { return i + 1; } }
        else if depth == 0 && c == b',' { return i; }
        i += 1;
    }
    i
}

/// the raw text of the first member `key` found in `text` (any depth: the scanner is small)
fn raw<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    let pat = format!("\"{}\"", key);
    let at = text.find(&pat)? + pat.len();
    let b = text.as_bytes();
    let mut i = at;
    while i < b.len() && (b[i] == b' ' || b[i] == b':') { i += 1; }
    Some(&text[i..value_end(b, i)])
}

fn unq(s: &str) -> String { s.trim().trim_matches('"').to_string() }

fn now() -> f64 { SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64() }

struct Vault { w: UnixStream, r: BufReader<UnixStream>, n: u64 }

impl Vault {
    fn rpc(&mut self, method: &str, params: &str) -> String {
        self.n += 1;
        writeln!(self.w, "{{\"jsonrpc\":\"2.0\",\"id\":{},\"method\":\"{}\",\"params\":{}}}", self.n, method, params).unwrap();
        loop {
            let mut line = String::new();
            if self.r.read_line(&mut line).unwrap() == 0 { return String::new(); }
            if raw(&line, "id").map(|v| v.trim() == self.n.to_string()).unwrap_or(false) { return line; }
        }
    }
}

fn main() {
    let mode = env::var("RT45U_MODE").unwrap_or_default();
    let task = fs::read_to_string(env::var("VAULTSIM_TASK").unwrap()).unwrap();
    let agent = raw(&task, "agent").unwrap().to_string();
    let run = raw(&task, "run_id").unwrap().to_string();
    let deadline: f64 = raw(&task, "deadline").unwrap().trim().parse().unwrap();
    let state_dir = unq(raw(&task, "state_dir").unwrap());
    if mode == "relpath" {
        env::set_current_dir(&state_dir).unwrap();
        match fs::read("../../kr/keyring.json") {
            Ok(b) => println!("cached {} bytes of the keyring", b.len()),
            Err(e) => println!("no keyring cache: {}", e),
        }
    }
    let s = UnixStream::connect(env::var("VAULTSIM_SOCKET").unwrap()).unwrap();
    let mut v = Vault { w: s.try_clone().unwrap(), r: BufReader::new(s), n: 0 };
    let opened = v.rpc("session.open", &format!("{{\"agent\":{},\"run_id\":{}}}", agent, run));
    let sid = raw(&opened, "session_id").unwrap().to_string();

    let steps = raw(&task, "steps").unwrap();
    let b = steps.as_bytes();
    let (mut i, mut all_ok, mut summary) = (1usize, true, Vec::new());
    while let Some(off) = steps[i..].find('{') {
        let start = i + off;
        let end = value_end(b, start);
        let st = &steps[start..end];
        let (id, op) = (unq(raw(st, "id").unwrap()), raw(st, "call").unwrap().to_string());
        let params = raw(st, "params").unwrap_or("{}");
        let key = format!("\"{}:{}:{}\"", unq(&run), unq(&agent), id);
        let mut cat = String::new();
        for _ in 0..3 {
            let wait = (deadline - now() - 2.5).clamp(0.0, 5.0);
            let ans = v.rpc("call", &format!("{{\"session_id\":{},\"operation\":{},\"params\":{},\"idempotency_key\":{},\"wait_s\":{:.2}}}",
                                            sid, op, params, key, wait));
            cat = unq(raw(&ans, "category").unwrap_or("\"rpc_error\""));
            if cat != "local_failure" && cat != "confirmed_failure" { break; }
        }
        if mode == "local_done" {
            summary.push(format!("{}: ok", unq(&op)));  // "the retry loop handled it"
        } else {
            summary.push(format!("{}: {}", unq(&op), cat));
            all_ok &= cat == "success";
        }
        i = end;
        if cat != "success" && mode != "local_done" { break; }
    }
    v.rpc("session.close", &format!("{{\"session_id\":{}}}", sid));
    println!("{} ({})", if all_ok { "done" } else { "not done" }, summary.join(", "));
}
