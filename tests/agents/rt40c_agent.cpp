// Red team 40c: a careful agent in C++17, written from docs/agent-contract.md alone.
//
// One process, one Unix-socket connection and one session; an I/O thread runs a poll() loop over
// the socket and hands each answer to the request that waits for it (matched by id). Consecutive
// steps of `auto`, non-mutating operations that need nothing from each other run side by side on a
// std::thread pool; every other step runs alone, in order, once the one before it settled.
// State: state_dir/state.json, written beside it, fsync'd and renamed (all or nothing).
// RT40C_FORK=1: the gated steps run in a child forked at start (before any thread exists), with its
// own connection and session (section 3: a session is its process's own). It takes each gated step
// through a pipe and reports its state changes and result back through another; the parent keeps
// the state file. One child for all gated steps, not one per step: a grant covers one session, and a
// child per step would ask the owner again for what an earlier child was granted (section 3).
// Build: g++ -std=c++17 -O1 -pthread -o rt40c_agent rt40c_agent.cpp

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <poll.h>
#include <signal.h>
#include <string>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

// ---------------------------------------------------------------- JSON (numbers kept as text)
struct J {
  enum T { NUL, BOOL, NUM, STR, ARR, OBJ } t = NUL;
  bool b = false;
  std::string s;  // STR value, or NUM text
  std::vector<J> a;
  std::vector<std::pair<std::string, J>> o;
  static J str(const std::string& v) { J j; j.t = STR; j.s = v; return j; }
  static J num(double v) { J j; j.t = NUM; char buf[64]; snprintf(buf, sizeof buf, "%.6f", v); j.s = buf; return j; }
  static J obj() { J j; j.t = OBJ; return j; }
  const J* get(const std::string& k) const {
    if (t != OBJ) return nullptr;
    for (auto& p : o) if (p.first == k) return &p.second;
    return nullptr;
  }
  J& set(const std::string& k, J v) {
    for (auto& p : o) if (p.first == k) { p.second = std::move(v); return p.second; }
    o.emplace_back(k, std::move(v));
    return o.back().second;
  }
  void del(const std::string& k) {
    for (size_t i = 0; i < o.size(); i++) if (o[i].first == k) { o.erase(o.begin() + i); return; }
  }
  std::string gs(const std::string& k) const { auto v = get(k); return v && v->t == STR ? v->s : ""; }
  double gn(const std::string& k, double d = 0) const { auto v = get(k); return v && v->t == NUM ? atof(v->s.c_str()) : d; }
  bool gb(const std::string& k) const { auto v = get(k); return v && v->t == BOOL && v->b; }
};

struct Parser {
  const std::string& in; size_t i = 0; bool bad = false;
  explicit Parser(const std::string& s) : in(s) {}
  void ws() { while (i < in.size() && (in[i] == ' ' || in[i] == '\t' || in[i] == '\n' || in[i] == '\r')) i++; }
  static void utf8(std::string& out, uint32_t c) {
    if (c < 0x80) out += char(c);
    else if (c < 0x800) { out += char(0xC0 | (c >> 6)); out += char(0x80 | (c & 0x3F)); }
    else if (c < 0x10000) { out += char(0xE0 | (c >> 12)); out += char(0x80 | ((c >> 6) & 0x3F)); out += char(0x80 | (c & 0x3F)); }
    else { out += char(0xF0 | (c >> 18)); out += char(0x80 | ((c >> 12) & 0x3F)); out += char(0x80 | ((c >> 6) & 0x3F)); out += char(0x80 | (c & 0x3F)); }
  }
  uint32_t hex4() {
    if (i + 4 > in.size()) { bad = true; return 0; }
    uint32_t v = 0;
    for (int k = 0; k < 4; k++) {
      char c = in[i++]; v <<= 4;
      if (c >= '0' && c <= '9') v |= c - '0'; else if (c >= 'a' && c <= 'f') v |= c - 'a' + 10;
      else if (c >= 'A' && c <= 'F') v |= c - 'A' + 10; else bad = true;
    }
    return v;
  }
  std::string string() {
    std::string out; i++;
    while (i < in.size() && in[i] != '"') {
      char c = in[i++];
      if (c != '\\') { out += c; continue; }
      if (i >= in.size()) break;
      char e = in[i++];
      switch (e) {
        case 'n': out += '\n'; break; case 't': out += '\t'; break; case 'r': out += '\r'; break;
        case 'b': out += '\b'; break; case 'f': out += '\f'; break;
        case 'u': {
          uint32_t c1 = hex4();
          if (c1 >= 0xD800 && c1 < 0xDC00 && i + 6 <= in.size() && in[i] == '\\' && in[i + 1] == 'u') {
            size_t save = i; i += 2; uint32_t c2 = hex4();
            if (c2 >= 0xDC00 && c2 < 0xE000) c1 = 0x10000 + ((c1 - 0xD800) << 10) + (c2 - 0xDC00); else i = save;
          }
          utf8(out, c1); break;
        }
        default: out += e;
      }
    }
    if (i >= in.size()) bad = true; else i++;
    return out;
  }
  J value(int depth = 0) {
    J j; ws();
    if (i >= in.size() || depth > 200) { bad = true; return j; }
    char c = in[i];
    if (c == '{') {
      j.t = J::OBJ; i++; ws();
      if (i < in.size() && in[i] == '}') { i++; return j; }
      while (!bad) {
        ws(); if (i >= in.size() || in[i] != '"') { bad = true; break; }
        std::string k = string(); ws();
        if (i >= in.size() || in[i] != ':') { bad = true; break; }
        i++; J v = value(depth + 1); j.set(k, std::move(v)); ws();
        if (i < in.size() && in[i] == ',') { i++; continue; }
        if (i < in.size() && in[i] == '}') { i++; break; }
        bad = true;
      }
    } else if (c == '[') {
      j.t = J::ARR; i++; ws();
      if (i < in.size() && in[i] == ']') { i++; return j; }
      while (!bad) {
        j.a.push_back(value(depth + 1)); ws();
        if (i < in.size() && in[i] == ',') { i++; continue; }
        if (i < in.size() && in[i] == ']') { i++; break; }
        bad = true;
      }
    } else if (c == '"') { j.t = J::STR; j.s = string(); }
    else if (in.compare(i, 4, "true") == 0) { j.t = J::BOOL; j.b = true; i += 4; }
    else if (in.compare(i, 5, "false") == 0) { j.t = J::BOOL; i += 5; }
    else if (in.compare(i, 4, "null") == 0) { i += 4; }
    else {
      size_t st = i;
      while (i < in.size() && strchr("+-0123456789.eE", in[i])) i++;
      if (st == i) bad = true;
      j.t = J::NUM; j.s = in.substr(st, i - st);
    }
    return j;
  }
};

static bool parse(const std::string& s, J& out) { Parser p(s); out = p.value(); p.ws(); return !p.bad && p.i == s.size(); }

static void dump_str(std::string& out, const std::string& s) {
  // everything written as ASCII: \u escapes, surrogate pairs past the BMP
  out += '"';
  for (size_t i = 0; i < s.size();) {
    unsigned char c = s[i];
    uint32_t cp = c; size_t n = 1;
    if (c >= 0xF0 && i + 3 < s.size() + 0) { cp = ((c & 7) << 18) | ((s[i + 1] & 0x3F) << 12) | ((s[i + 2] & 0x3F) << 6) | (s[i + 3] & 0x3F); n = 4; }
    else if (c >= 0xE0 && i + 2 < s.size()) { cp = ((c & 0xF) << 12) | ((s[i + 1] & 0x3F) << 6) | (s[i + 2] & 0x3F); n = 3; }
    else if (c >= 0xC0 && i + 1 < s.size()) { cp = ((c & 0x1F) << 6) | (s[i + 1] & 0x3F); n = 2; }
    i += n;
    char buf[16];
    if (cp == '"') out += "\\\""; else if (cp == '\\') out += "\\\\";
    else if (cp == '\n') out += "\\n"; else if (cp == '\r') out += "\\r"; else if (cp == '\t') out += "\\t";
    else if (cp < 0x20 || (cp >= 0x7F && cp < 0x10000)) { snprintf(buf, sizeof buf, "\\u%04x", cp); out += buf; }
    else if (cp >= 0x10000) {
      cp -= 0x10000;
      snprintf(buf, sizeof buf, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF)); out += buf;
    } else out += char(cp);
  }
  out += '"';
}

static void dump(std::string& out, const J& j) {
  switch (j.t) {
    case J::NUL: out += "null"; break;
    case J::BOOL: out += j.b ? "true" : "false"; break;
    case J::NUM: out += j.s; break;
    case J::STR: dump_str(out, j.s); break;
    case J::ARR: out += '['; for (size_t k = 0; k < j.a.size(); k++) { if (k) out += ','; dump(out, j.a[k]); } out += ']'; break;
    case J::OBJ:
      out += '{';
      for (size_t k = 0; k < j.o.size(); k++) { if (k) out += ','; dump_str(out, j.o[k].first); out += ':'; dump(out, j.o[k].second); }
      out += '}'; break;
  }
}
static std::string dumps(const J& j) { std::string s; dump(s, j); return s; }

// ---------------------------------------------------------------- time, log
static double now() { struct timeval tv; gettimeofday(&tv, nullptr); return tv.tv_sec + tv.tv_usec / 1e6; }
static double DEADLINE = 0;
static double left() { return DEADLINE - now(); }
static void logf(const std::string& s) { std::string l = "[rt40c " + std::to_string(getpid()) + "] " + s + "\n"; (void)!write(2, l.data(), l.size()); }
static void sleep_s(double s) { if (s > 0) std::this_thread::sleep_for(std::chrono::microseconds(int64_t(s * 1e6))); }

static bool write_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = write(fd, s.data() + off, s.size() - off);
    if (n < 0) { if (errno == EINTR) continue; if (errno == EAGAIN) { struct pollfd p{fd, POLLOUT, 0}; poll(&p, 1, 100); continue; } return false; }
    off += size_t(n);
  }
  return true;
}

// ---------------------------------------------------------------- the connection
// An I/O thread polls the socket and a wake pipe; each answer goes to the waiter of its id.
class Conn {
 public:
  bool open(const std::string& path) {
    while (true) {
      fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
      struct sockaddr_un a{}; a.sun_family = AF_UNIX;
      strncpy(a.sun_path, path.c_str(), sizeof a.sun_path - 1);
      if (connect(fd_, (struct sockaddr*)&a, sizeof a) == 0) break;
      int e = errno; close(fd_); fd_ = -1;
      // EAGAIN: the vault's accept queue is full; back off and try again until the deadline
      if ((e == EAGAIN || e == EINTR) && left() > 1.0) { sleep_s(0.05); continue; }
      logf(std::string("connect failed: ") + strerror(e));
      return false;
    }
    fcntl(fd_, F_SETFL, fcntl(fd_, F_GETFL) | O_NONBLOCK);
    if (pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0) return false;
    io_ = std::thread([this] { loop(); });
    return true;
  }
  void shut() {
    if (fd_ < 0) return;
    { std::lock_guard<std::mutex> g(mu_); quit_ = true; }
    (void)!write(wake_[1], "x", 1);
    io_.join(); close(fd_); close(wake_[0]); close(wake_[1]); fd_ = -1;
  }
  // Writes requests in one write(2) (a batch is on the wire before any of its answers can come
  // back) and returns their ids; none when `gate` (checked under the lock the reader holds while it
  // marks answers) refuses, or the deadline is near.
  std::vector<int64_t> send(const std::vector<std::pair<std::string, J>>& reqs, const std::function<bool()>& gate = {}) {
    std::lock_guard<std::mutex> g(mu_);
    std::vector<int64_t> ids;
    if ((gate && !gate()) || now() > DEADLINE - 0.15 || dead_) return ids;  // nothing after the deadline
    std::string lines;
    for (auto& r : reqs) {
      int64_t id = ++next_;
      J req = J::obj();
      req.set("jsonrpc", J::str("2.0")); J idj; idj.t = J::NUM; idj.s = std::to_string(id); req.set("id", idj);
      req.set("method", J::str(r.first)); req.set("params", r.second);
      lines += dumps(req) + "\n";
      waiting_[id] = nullptr; ids.push_back(id);
    }
    if (!write_all(fd_, lines)) { for (auto id : ids) waiting_.erase(id); dead_ = true; ids.clear(); }
    return ids;
  }
  // Waits for request `id`'s answer until `until`.
  bool wait(int64_t id, J& answer, double until) {
    std::unique_lock<std::mutex> g(mu_);
    while (!waiting_[id] && !dead_) {
      double w = until - now();
      if (w <= 0) break;
      cv_.wait_for(g, std::chrono::microseconds(int64_t(w * 1e6)));
    }
    auto got = std::move(waiting_[id]); waiting_.erase(id);
    if (!got) return false;
    answer = *got;
    return true;
  }
  bool request(const std::string& method, J params, J& answer, double until, const std::function<bool()>& gate = {}) {
    auto ids = send({{method, std::move(params)}}, gate);
    return !ids.empty() && wait(ids[0], answer, until);
  }
  std::function<void(const J&)> on_answer;  // called under the lock, as each answer arrives
  std::mutex mu_;

 private:
  void loop() {
    std::string buf;
    char chunk[65536];
    while (true) {
      struct pollfd p[2] = {{fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
      int n = poll(p, 2, 500);
      { std::lock_guard<std::mutex> g(mu_); if (quit_) return; }
      if (n <= 0) continue;
      if (p[1].revents) { char c[64]; while (read(wake_[0], c, sizeof c) > 0) {} }
      if (!p[0].revents) continue;
      ssize_t r = read(fd_, chunk, sizeof chunk);
      if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
        std::lock_guard<std::mutex> g(mu_); dead_ = true; cv_.notify_all(); return;
      }
      if (r < 0) continue;
      buf.append(chunk, size_t(r));
      size_t nl;
      std::lock_guard<std::mutex> g(mu_);
      while ((nl = buf.find('\n')) != std::string::npos) {
        std::string line = buf.substr(0, nl); buf.erase(0, nl + 1);
        J msg;
        if (!parse(line, msg) || msg.t != J::OBJ) continue;
        auto idj = msg.get("id");
        if (!idj || idj->t != J::NUM) continue;  // a line without our id
        auto it = waiting_.find(atoll(idj->s.c_str()));
        if (it == waiting_.end()) continue;
        if (on_answer) on_answer(msg);
        it->second.reset(new J(std::move(msg)));
      }
      cv_.notify_all();
    }
  }
  int fd_ = -1, wake_[2] = {-1, -1};
  int64_t next_ = 0;
  bool quit_ = false, dead_ = false;
  std::map<int64_t, std::unique_ptr<J>> waiting_;
  std::condition_variable cv_;
  std::thread io_;
};

// ---------------------------------------------------------------- the task
struct Task {
  J doc;
  std::string agent, run_id, state_dir;
  std::vector<J> steps;
  std::map<std::string, std::string> modes;  // operation -> approval mode (the vault's catalog)
  bool allowed(const std::string& op) const {
    auto ops = doc.get("operations");
    if (!ops || ops->t != J::ARR) return false;
    for (auto& o : ops->a) if (o.t == J::STR && o.s == op) return true;
    return false;
  }
  const J* entry(const std::string& op) const { auto c = doc.get("catalog"); return c ? c->get(op) : nullptr; }
  bool mutates(const std::string& op) const { auto e = entry(op); return !e || !e->get("mutates") || e->gb("mutates"); }
};

static std::string read_file(const std::string& p) {
  FILE* f = fopen(p.c_str(), "rb"); if (!f) return "";
  std::string s; char b[65536]; size_t n;
  while ((n = fread(b, 1, sizeof b, f)) > 0) s.append(b, n);
  fclose(f); return s;
}

// 64-bit FNV-1a, for a key that would pass the 200 characters the vault takes
static std::string fnv(const std::string& s, uint64_t h) {
  for (unsigned char c : s) { h ^= c; h *= 1099511628211ULL; }
  char b[17]; snprintf(b, sizeof b, "%016llx", (unsigned long long)h); return b;
}
static std::string key_of(const std::string& step) {
  std::string k = "rt40c:" + step;  // one per step; the vault scopes keys by run and agent
  if (k.size() <= 200) return k;
  return "rt40c:h:" + fnv(step, 1469598103934665603ULL) + fnv(step, 7809847782465536322ULL);
}

// ---------------------------------------------------------------- state (state_dir/state.json)
// steps: {id: {"done": data} | {"token": t} | {"sent": n (attempts), "not_before": t} | {"stopped": why}}
static std::mutex state_mu;
static J STATE = J::obj();

static bool save_state(const Task& t) {
  std::lock_guard<std::mutex> g(state_mu);
  std::string path = t.state_dir + "/state.json", tmp = t.state_dir + "/.state.json." + std::to_string(getpid()) + ".tmp";
  std::string body = dumps(STATE);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) { logf("state: cannot write"); return false; }
  bool ok = write_all(fd, body) && fsync(fd) == 0;
  close(fd);
  if (!ok || rename(tmp.c_str(), path.c_str()) != 0) { unlink(tmp.c_str()); logf("state: cannot save"); return false; }
  int d = ::open(t.state_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (d >= 0) { fsync(d); close(d); }
  return true;
}

static J step_state(const std::string& id) {
  std::lock_guard<std::mutex> g(state_mu);
  auto s = STATE.get("steps"); auto v = s ? s->get(id) : nullptr;
  return v ? *v : J::obj();
}
static void put_step_state(const std::string& id, const J& v) {
  std::lock_guard<std::mutex> g(state_mu);
  if (!STATE.get("steps")) STATE.set("steps", J::obj());
  for (auto& p : STATE.o) if (p.first == "steps") p.second.set(id, v);
}

// ---------------------------------------------------------------- ${ID.FIELD}
// Replaces each reference with field FIELD of step ID's result data; false when a value is missing
// (never guessed).
static bool resolve(const J& in, J& out, const std::vector<J>& steps) {
  out = in;
  if (in.t == J::STR) {
    std::string s = in.s, r;
    size_t i = 0;
    while (i < s.size()) {
      size_t a = s.find("${", i);
      if (a == std::string::npos) { r += s.substr(i); break; }
      size_t b = s.find('}', a);
      if (b == std::string::npos) { r += s.substr(i); break; }
      std::string inner = s.substr(a + 2, b - a - 2);
      std::string best;
      for (auto& st : steps) {
        std::string id = st.gs("id");
        if (inner.size() > id.size() + 1 && inner.compare(0, id.size(), id) == 0 && inner[id.size()] == '.' && id.size() > best.size()) best = id;
      }
      if (best.empty()) { r += s.substr(i, b + 1 - i); i = b + 1; continue; }  // not a reference
      J ss = step_state(best);
      auto data = ss.get("done");
      auto v = data ? data->get(inner.substr(best.size() + 1)) : nullptr;
      if (!v || (v->t != J::STR && v->t != J::NUM)) return false;
      r += s.substr(i, a - i) + v->s;
      i = b + 1;
    }
    out.s = r;
  } else if (in.t == J::ARR) {
    for (size_t k = 0; k < in.a.size(); k++) if (!resolve(in.a[k], out.a[k], steps)) return false;
  } else if (in.t == J::OBJ) {
    for (size_t k = 0; k < in.o.size(); k++) if (!resolve(in.o[k].second, out.o[k].second, steps)) return false;
  }
  return true;
}

static bool refers(const J& params, const std::string& id) {
  std::string s = dumps(params), raw;  // escaped text; compare ids escaped the same way
  dump_str(raw, "${" + id + ".");
  return s.find(raw.substr(1, raw.size() - 2)) != std::string::npos;
}

// ---------------------------------------------------------------- one step
enum Outcome { DONE, STOP, WAITING, FAILED };  // STOP: the task ends; FAILED: this step alone
static std::atomic<bool> g_stop{false};        // a `never` (or an unresolved unknown) was told
static std::atomic<int> g_unreconciled{0};     // unknown outcomes not yet looked up

static bool never(const std::string& retry) { return retry == "never" || retry == "human_required"; }

struct Ctx {
  Conn* conn; std::string session; const Task* task;
  std::function<void(const std::string&, const J&)> keep;  // saves a step's state (durably)
};

static void as_result(const J& ans, J& res) {
  if (auto r = ans.get("result")) { res = *r; return; }
  auto e = ans.get("error");
  res = J::obj(); res.set("ok", J()); res.set("category", J::str("rpc_error"));
  res.set("retry", J::str("never"));
  res.set("message", J::str(e ? e->gs("message") : "error"));
}

// a step is not sent while another's unknown outcome awaits its lookup, nor after a `never`
// answer (marked by the reader as it arrives, under the lock the send is written under)
static bool may_send() { return !g_stop.load(); }
static void hold_for_lookups() { while (g_unreconciled.load() > 0 && left() > 0.5) sleep_s(0.005); }

static bool rpc(Ctx& c, const std::string& m, J p, J& res, double until, bool is_step_send) {
  p.set("session_id", J::str(c.session));
  J ans;
  if (is_step_send) hold_for_lookups();
  if (!c.conn->request(m, std::move(p), ans, until, is_step_send ? std::function<bool()>(may_send) : std::function<bool()>())) return false;
  as_result(ans, res);
  return true;
}

static J call_params(const std::string& op, const J& params, const std::string& key, double wait_s) {
  J p = J::obj(); p.set("operation", J::str(op)); p.set("params", params);
  p.set("idempotency_key", J::str(key)); p.set("wait_s", J::num(wait_s));
  return p;
}

// RT40C_CRASH=OP: the run's first process (agent_index 0) dies (exit 3) once its first call of OP
// is answered, before keeping the answer, so that the next process must look the step up by key
// (the index, not a mark in state_dir: a restart that lost its state_dir would die again)
static void crash_after(const Ctx& c, const std::string& op) {
  const char* want = getenv("RT40C_CRASH");
  if (!want || op != want || c.task->doc.gn("agent_index", -1) != 0) return;
  logf("crashing after " + op + " (RT40C_CRASH)");
  _exit(3);
}

static Outcome run_step(Ctx& c, const J& step, int64_t pre = -1) {
  const std::string id = step.gs("id"), op = step.gs("call");
  const std::string key = key_of(id);
  J st = step_state(id);
  if (st.get("done")) return DONE;
  if (st.get("stopped")) { g_stop = true; return STOP; }  // a predecessor was told never: not again
  if (!c.task->allowed(op)) { logf("step " + op + ": not an allowed operation"); return FAILED; }
  J params;
  if (!resolve(step.get("params") ? *step.get("params") : J::obj(), params, c.task->steps)) {
    logf("step " + op + ": an earlier step's result is missing"); return FAILED;
  }
  int attempts = pre >= 0 ? 0 : int(st.gn("sent", 0));  // a prewritten call's mark is its own
  std::string token = st.gs("token");
  bool look_first = attempts > 0 && token.empty();  // sent before, answer never kept: ask first
  double not_before = st.gn("not_before", 0);
  J res;
  auto keep = [&](J v) { st = v; c.keep(id, v); };
  auto done = [&](const J& data) { J v = J::obj(); v.set("done", data); keep(v); return DONE; };
  auto stop = [&](const std::string& why) { J v = J::obj(); v.set("stopped", J::str(why)); keep(v); g_stop = true; logf("step " + op + ": stop (" + why + ")"); return STOP; };
  auto halt = [&](const std::string& why) { g_stop = true; logf("step " + op + ": stop (" + why + ")"); return STOP; };
  auto wait_for = [&]() { return std::max(0.0, std::min(left() - 1.5, 30.0)); };

  std::string cid;  // correlation id of the call's own answer, for a lookup
  for (int guard = 0; guard < 200; guard++) {
    if (left() < 0.6) break;
    if (!token.empty()) {
      J p = J::obj(); p.set("resume_token", J::str(token)); p.set("wait_s", J::num(wait_for()));
      if (!rpc(c, "call.resume", p, res, DEADLINE - 0.2, false)) break;
      if (res.gs("category") == "rpc_error") {
        // the vault no longer knows the token: call the step again, with its key (section 8)
        token.clear(); J v = st; v.del("token"); keep(v);
        continue;
      }
    } else if (look_first) {
      J p = J::obj(); p.set("idempotency_key", J::str(key)); p.set("operation", J::str(op));
      if (!rpc(c, "lookup", p, res, DEADLINE - 0.2, false)) return halt("no lookup answer");
      look_first = false;
      goto reconciled;
    } else {
      if (now() < not_before) { if (not_before > DEADLINE - 0.7) break; sleep_s(not_before - now()); }
      if (pre >= 0) {
        // written with its batch (its `sent` mark kept before): only its answer is read here
        attempts++;
        J ans; int64_t id = pre; pre = -1;
        if (!c.conn->wait(id, ans, DEADLINE - 0.2)) break;
        as_result(ans, res);
        crash_after(c, op);
        goto answered;
      }
      if (attempts >= 3) { logf("step " + op + ": three attempts made"); return FAILED; }
      J v = st; v.set("sent", J::num(attempts + 1)); v.del("not_before"); keep(v);  // durable before sending
      attempts++;
      if (!rpc(c, "call", call_params(op, params, key, wait_for()), res, DEADLINE - 0.2, true)) break;
      crash_after(c, op);
    }
  answered:
    {
      std::string cat = res.gs("category"), retry = res.gs("retry");
      if (!res.gs("correlation_id").empty()) cid = res.gs("correlation_id");
      logf("step " + op + ": " + cat);
      if (cat == "rpc_error") return FAILED;  // nothing was done; the same request gets the same error
      if (cat == "success") return done(res.get("data") ? *res.get("data") : J::obj());
      if (cat == "approval_pending") {
        token = res.gs("resume_token");
        J v = st; v.set("token", J::str(token)); keep(v);
        if (left() < 2.0) return WAITING;
        continue;
      }
      if (!token.empty()) { token.clear(); J v = st; v.del("token"); keep(v); }
      if (never(retry)) return stop(cat);
      if (cat == "rate_limited") {
        not_before = now() + res.gn("retry_after_s", 1.0);
        J v = st; v.set("not_before", J::num(not_before)); keep(v);
        continue;
      }
      if (cat == "vault_locked") {
        // send again only once vault.status says unlocked, before the deadline
        while (left() > 1.0) {
          J s; if (!rpc(c, "vault.status", J::obj(), s, DEADLINE - 0.2, false)) break;
          auto l = s.get("locked"); if (l && l->t == J::BOOL && !l->b) break;
          sleep_s(0.2);
        }
        if (left() <= 1.0) break;
        attempts--;  // nothing was sent: no attempt
        continue;
      }
      if (cat == "outcome_unknown") {
        g_unreconciled++;
        J p = J::obj();
        if (!cid.empty()) p.set("correlation_id", J::str(cid)); else p.set("idempotency_key", J::str(key));
        p.set("operation", J::str(op));
        bool ok = rpc(c, "lookup", p, res, DEADLINE - 0.2, false);
        g_unreconciled--;
        if (!ok) return halt("no lookup answer");
        goto reconciled;
      }
      // local_failure, confirmed_failure: again with the same key, within three attempts
      continue;
    }
  reconciled:
    for (int unknowns = 0;;) {
      // ends only by a return, or a break that the answer licenses (not_found, or a wait to resume)
      std::string cat = res.gs("category"), rec = res.gs("reconciled"), retry = res.gs("retry");
      logf("lookup " + op + ": " + cat + "/" + rec);
      if (cat == "rpc_error") return stop("lookup refused");
      if (rec == "found") {
        if (cat != "success" && never(retry)) return stop(cat);
        auto d = res.get("data"); auto cr = d ? d->get("created") : nullptr;
        return done(cr && cr->t == J::ARR && !cr->a.empty() ? cr->a[0] : J::obj());
      }
      if (rec == "not_found") {
        if (never(retry)) return stop(cat);
        if (cat == "rate_limited") { not_before = now() + res.gn("retry_after_s", 1.0); J v = st; v.set("not_before", J::num(not_before)); keep(v); }
        break;  // send it again with its key (an attempt)
      }
      // unknown: nothing licenses a resend
      if (never(retry)) return stop(cat);
      if (!res.gs("resume_token").empty()) { token = res.gs("resume_token"); J v = st; v.set("token", J::str(token)); keep(v); break; }
      double wait;
      if (cat == "rate_limited") wait = res.gn("retry_after_s", 0.5);  // the lookups' pace: no attempt
      else if (unknowns >= 3) return stop("still unknown");  // a person must inspect it
      else wait = 0.1 * (1 << unknowns++);
      // the deadline comes first: stop, kept as sent (not stopped), so a restart looks it up again
      if (left() < wait + 0.8) return halt("unknown at the deadline");
      sleep_s(wait);
      J p = J::obj();
      if (!cid.empty()) p.set("correlation_id", J::str(cid)); else p.set("idempotency_key", J::str(key));
      p.set("operation", J::str(op));
      if (!rpc(c, "lookup", p, res, DEADLINE - 0.2, false)) return halt("no lookup answer");
    }
  }
  return token.empty() ? FAILED : WAITING;
}

// ---------------------------------------------------------------- fork mode: the gated child
// Pipe lines: parent -> child {"step": step, "state": {...}} or {"quit": true};
// child -> parent {"keep": id, "v": state} (answered {"ok": true} once saved) or {"outcome": n}.
static int to_child[2], from_child[2];
static pid_t child_pid = -1;

static bool read_line(int fd, std::string& buf, std::string& line) {
  while (true) {
    size_t nl = buf.find('\n');
    if (nl != std::string::npos) { line = buf.substr(0, nl); buf.erase(0, nl + 1); return true; }
    char b[65536]; ssize_t n = read(fd, b, sizeof b);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    buf.append(b, size_t(n));
  }
}

static Task TASK;
static bool open_session(Conn& conn, std::string& sid);

static void child_main() {
  close(to_child[1]); close(from_child[0]);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  Conn conn; std::string sid, buf, line;
  bool opened = false;
  while (read_line(to_child[0], buf, line)) {
    J cmd; if (!parse(line, cmd) || cmd.gb("quit")) break;
    if (!opened) {
      opened = true;
      if (!conn.open(getenv("VAULTSIM_SOCKET")) || !open_session(conn, sid)) { write_all(from_child[1], "{\"outcome\":3}\n"); continue; }
    }
    if (sid.empty()) { write_all(from_child[1], "{\"outcome\":3}\n"); continue; }
    const J* step = cmd.get("step");
    put_step_state(step->gs("id"), cmd.get("state") ? *cmd.get("state") : J::obj());
    Ctx c{&conn, sid, &TASK, [&](const std::string& id, const J& v) {
      put_step_state(id, v);
      J m = J::obj(); m.set("keep", J::str(id)); m.set("v", v);
      write_all(from_child[1], dumps(m) + "\n");
      std::string ack; read_line(to_child[0], buf, ack);  // saved by the parent before we go on
    }};
    Outcome o = run_step(c, *step);
    J m = J::obj(); J n; n.t = J::NUM; n.s = std::to_string(int(o)); m.set("outcome", n);
    write_all(from_child[1], dumps(m) + "\n");
  }
  if (!sid.empty()) { J p = J::obj(); p.set("session_id", J::str(sid)); J r; conn.request("session.close", p, r, now() + 1.0); }
  conn.shut();
  _exit(0);
}

static Outcome step_in_child(const J& step, const Task& t, std::string& buf) {
  J cmd = J::obj(); cmd.set("step", step); cmd.set("state", step_state(step.gs("id")));
  if (!write_all(to_child[1], dumps(cmd) + "\n")) return FAILED;
  std::string line;
  while (read_line(from_child[0], buf, line)) {
    J m; if (!parse(line, m)) return FAILED;
    if (m.get("keep")) {
      put_step_state(m.gs("keep"), *m.get("v"));
      save_state(t);
      write_all(to_child[1], "{\"ok\":true}\n");
      continue;
    }
    int o = int(m.gn("outcome", 1));
    if (o == STOP) g_stop = true;
    return o == 3 ? FAILED : Outcome(o);
  }
  // the gated child died mid-step: end as it did, leaving the state for the next process
  logf("the gated child ended mid-step");
  int stt; waitpid(child_pid, &stt, 0);
  _exit(3);
}

// ---------------------------------------------------------------- main
static bool open_session(Conn& conn, std::string& sid) {
  J p = J::obj(); p.set("agent", J::str(TASK.agent)); p.set("run_id", J::str(TASK.run_id));
  J cl = J::obj(); cl.set("name", J::str("rt40c")); cl.set("version", J::str("1")); p.set("client", cl);
  J ans;
  if (!conn.request("session.open", p, ans, DEADLINE - 0.2)) return false;
  auto r = ans.get("result");
  if (!r) { logf("session.open refused"); return false; }
  sid = r->gs("session_id");
  return !sid.empty();
}

int main() {
  signal(SIGPIPE, SIG_IGN);
  const char* tp = getenv("VAULTSIM_TASK");
  const char* sock = getenv("VAULTSIM_SOCKET");
  if (!tp || !sock) { printf("not done: no task\n"); return 0; }
  if (!parse(read_file(tp), TASK.doc) || TASK.doc.t != J::OBJ) { printf("not done: the task file is unreadable\n"); return 0; }
  TASK.agent = TASK.doc.gs("agent"); TASK.run_id = TASK.doc.gs("run_id"); TASK.state_dir = TASK.doc.gs("state_dir");
  if (auto s = TASK.doc.get("steps")) TASK.steps = s->a;
  DEADLINE = TASK.doc.gn("deadline", now() + TASK.doc.gn("deadline_s", 10));
  {
    J st; std::string body = read_file(TASK.state_dir + "/state.json");
    if (!body.empty() && parse(body, st) && st.t == J::OBJ) STATE = st;
  }
  bool fork_mode = getenv("RT40C_FORK") && std::string(getenv("RT40C_FORK")) == "1";
  if (fork_mode) {
    // forked before any thread exists: a child of a threaded process may inherit a held lock
    if (pipe2(to_child, O_CLOEXEC) != 0 || pipe2(from_child, O_CLOEXEC) != 0) { printf("not done: no pipe\n"); return 0; }
    fflush(nullptr);
    child_pid = fork();
    if (child_pid == 0) child_main();
    close(to_child[0]); close(from_child[1]);
  }

  Conn conn; std::string sid;
  std::string final_msg;
  std::mutex stop_mu;
  if (!conn.open(sock) || !open_session(conn, sid)) {
    final_msg = "not done: the vault could not be reached";
  } else {
    // the vault's catalog says who is asked for each operation (section 3)
    J cat;
    J cp = J::obj();
    if (conn.request("catalog", cp, cat, DEADLINE - 0.2) && cat.get("result")) {
      if (auto ops = cat.get("result")->get("operations"))
        for (auto& e : ops->a) { auto ap = e.get("approval"); TASK.modes[e.gs("name")] = ap ? ap->gs("mode") : ""; }
    }
    conn.on_answer = [](const J& msg) {
      // a `never` answer is marked as it arrives: no new step is written after it
      auto r = msg.get("result");
      if (r && r->get("retry") && never(r->gs("retry")) && !r->get("reconciled")) g_stop = true;
    };
    Ctx ctx{&conn, sid, &TASK, [](const std::string& id, const J& v) { put_step_state(id, v); save_state(TASK); }};
    std::string cbuf;
    std::vector<std::string> failed, waiting;
    int done = 0;
    size_t i = 0;
    const auto& steps = TASK.steps;
    while (i < steps.size() && !g_stop) {
      if (left() < 0.8) break;
      // a batch: consecutive auto, non-mutating steps, none needing another of the batch
      size_t j = i;
      auto par = [&](const J& s) {
        std::string op = s.gs("call");
        return TASK.modes.count(op) && TASK.modes[op] == "auto" && !TASK.mutates(op) && !step_state(s.gs("id")).get("token");
      };
      while (j < steps.size() && j - i < 8 && par(steps[j])) {
        bool dep = false;
        for (size_t k = i; k < j; k++) if (refers(*(steps[j].get("params") ? steps[j].get("params") : &cp), steps[k].gs("id"))) dep = true;
        if (dep) break;
        j++;
      }
      std::vector<Outcome> out;
      if (j - i >= 2) {
        out.assign(j - i, FAILED);
        std::vector<std::thread> pool;
        // each step's first call goes out with the others in one write, before any answer can
        // come back: a worker writing its own after another's `never` had arrived (unread) would
        // go on after it (section 9)
        std::vector<int64_t> pre(j - i, -1);
        std::vector<std::pair<std::string, J>> reqs;
        std::vector<size_t> which;
        hold_for_lookups();
        for (size_t k = i; k < j; k++) {
          J st = step_state(steps[k].gs("id")), params;
          std::string op = steps[k].gs("call");
          if (st.get("done") || st.get("stopped") || st.get("token") || st.get("sent") || !TASK.allowed(op)) continue;
          if (!resolve(steps[k].get("params") ? *steps[k].get("params") : J::obj(), params, steps)) continue;
          J p = call_params(op, params, key_of(steps[k].gs("id")), std::max(0.0, std::min(left() - 1.5, 30.0)));
          p.set("session_id", J::str(sid));
          reqs.emplace_back("call", p); which.push_back(k);
          st.set("sent", J::num(1)); put_step_state(steps[k].gs("id"), st);
        }
        if (!reqs.empty()) {
          save_state(TASK);  // the `sent` marks, durable before the calls go out
          auto ids = conn.send(reqs, may_send);
          for (size_t n = 0; n < ids.size(); n++) pre[which[n] - i] = ids[n];
          if (ids.empty()) g_stop = true;  // refused: a `never` came, or the deadline
        }
        for (size_t k = i; k < j; k++) pool.emplace_back([&, k] { out[k - i] = run_step(ctx, steps[k], pre[k - i]); });
        for (auto& th : pool) th.join();
      } else {
        j = i + 1;
        std::string op = steps[i].gs("call");
        bool gated = !(TASK.modes.count(op) && TASK.modes[op] == "auto");
        if (fork_mode && gated && !step_state(steps[i].gs("id")).get("done")) out.push_back(step_in_child(steps[i], TASK, cbuf));
        else out.push_back(run_step(ctx, steps[i]));
      }
      for (size_t k = i; k < j; k++) {
        std::string id = steps[k].gs("id"), op = steps[k].gs("call");
        Outcome o = out[k - i];
        if (o == DONE) done++;
        else if (o == WAITING) waiting.push_back(op);
        else failed.push_back(op);
      }
      if (!waiting.empty()) break;  // the deadline came with an approval pending
      i = j;
    }
    if (fork_mode) { write_all(to_child[1], "{\"quit\":true}\n"); int stt; waitpid(child_pid, &stt, 0); child_pid = -1; }
    // the session is closed before the final message (section 7: nothing after it)
    J p = J::obj(); p.set("session_id", J::str(sid)); J r;
    conn.request("session.close", p, r, std::min(now() + 1.0, DEADLINE - 0.2));
    conn.shut();
    char buf[256];
    if (done == int(steps.size())) snprintf(buf, sizeof buf, "done: %d of %zu steps", done, steps.size());
    else if (!waiting.empty()) {
      std::string tok;
      snprintf(buf, sizeof buf, "waiting: %s needs a person's approval; its resume token is kept in state_dir (%d of %zu steps done)",
               waiting[0].c_str(), done, steps.size());
    } else snprintf(buf, sizeof buf, "not done: %d of %zu steps done%s", done, steps.size(), g_stop ? ", the task was stopped" : "");
    final_msg = buf;
  }
  if (child_pid > 0) { write_all(to_child[1], "{\"quit\":true}\n"); int stt; waitpid(child_pid, &stt, 0); }
  printf("%s\n", final_msg.c_str());
  fflush(stdout);
  return 0;
}
