// Red team 46c: a careful agent in Java 21+ on virtual threads. Written from
// docs/agent-contract.md alone (JDK only, a hand-written JSON reader and writer).
//
// One long connection to the vault and one session for the whole process: every request is
// written on it as soon as its virtual thread is ready (pipelined), and one reader thread hands
// each answer to the future waiting for its id (section 3: answers come in any order). Each step
// runs on a virtual thread of its own (Executors.newVirtualThreadPerTaskExecutor); independent
// `auto` steps go out side by side, a gated step (from the vault's `catalog`) alone and in order,
// a step naming ${ID.FIELD} after step ID. `vault.status` is asked before each step.
// Build: javac -d DIR rt46c_vthreads.java; run: java -cp DIR Rt46cAgent
import java.io.*;
import java.net.UnixDomainSocketAddress;
import java.nio.ByteBuffer;
import java.nio.channels.*;
import java.nio.charset.StandardCharsets;
import java.nio.file.*;
import java.util.*;
import java.util.concurrent.*;
import java.util.concurrent.atomic.AtomicLong;
import java.util.regex.*;

class Rt46cAgent {
    static final long MARGIN_MS = 1500;
    static final Set<String> NEVER = Set.of("authentication_failed", "authorization_denied", "malformed_response",
            "approval_denied", "approval_expired", "approval_unroutable");
    static final Pattern REF = Pattern.compile("\\$\\{([^.}]+)\\.([^}]+)\\}");

    // ---------------------------------------------------------------- JSON
    static Object parse(String s) { int[] p = {0}; Object v = val(s, p); return v; }
    static void ws(String s, int[] p) { while (p[0] < s.length() && Character.isWhitespace(s.charAt(p[0]))) p[0]++; }
    static Object val(String s, int[] p) {
        ws(s, p);
        char c = s.charAt(p[0]);
        if (c == '{') {
            Map<String, Object> m = new LinkedHashMap<>(); p[0]++; ws(s, p);
            if (s.charAt(p[0]) == '}') { p[0]++; return m; }
            while (true) {
                ws(s, p); String k = (String) val(s, p); ws(s, p); p[0]++; // ':'
                m.put(k, val(s, p)); ws(s, p);
                if (s.charAt(p[0]++) == '}') return m;
            }
        }
        if (c == '[') {
            List<Object> l = new ArrayList<>(); p[0]++; ws(s, p);
            if (s.charAt(p[0]) == ']') { p[0]++; return l; }
            while (true) { l.add(val(s, p)); ws(s, p); if (s.charAt(p[0]++) == ']') return l; }
        }
        if (c == '"') {
            StringBuilder b = new StringBuilder(); p[0]++;
            while (true) {
                char ch = s.charAt(p[0]++);
                if (ch == '"') return b.toString();
                if (ch != '\\') { b.append(ch); continue; }
                char e = s.charAt(p[0]++);
                switch (e) {
                    case 'n' -> b.append('\n'); case 't' -> b.append('\t'); case 'r' -> b.append('\r');
                    case 'b' -> b.append('\b'); case 'f' -> b.append('\f');
                    case 'u' -> { b.append((char) Integer.parseInt(s.substring(p[0], p[0] + 4), 16)); p[0] += 4; }
                    default -> b.append(e);
                }
            }
        }
        if (s.startsWith("true", p[0])) { p[0] += 4; return Boolean.TRUE; }
        if (s.startsWith("false", p[0])) { p[0] += 5; return Boolean.FALSE; }
        if (s.startsWith("null", p[0])) { p[0] += 4; return null; }
        int st = p[0];
        while (p[0] < s.length() && "+-0123456789.eE".indexOf(s.charAt(p[0])) >= 0) p[0]++;
        String num = s.substring(st, p[0]);
        if (num.matches("-?\\d+") && num.length() < 18) return Long.parseLong(num);
        return Double.parseDouble(num);
    }
    static String str(Object o) {
        if (o == null) return "null";
        if (o instanceof String s) {
            StringBuilder b = new StringBuilder("\"");
            for (char c : s.toCharArray()) {
                if (c == '"' || c == '\\') b.append('\\').append(c);
                else if (c < 0x20) b.append(String.format("\\u%04x", (int) c));
                else b.append(c);
            }
            return b.append('"').toString();
        }
        if (o instanceof Map<?, ?> m) {
            StringJoiner j = new StringJoiner(",", "{", "}");
            m.forEach((k, v) -> j.add(str(k.toString()) + ":" + str(v)));
            return j.toString();
        }
        if (o instanceof List<?> l) {
            StringJoiner j = new StringJoiner(",", "[", "]");
            l.forEach(v -> j.add(str(v)));
            return j.toString();
        }
        if (o instanceof Double d && d == Math.rint(d) && Math.abs(d) < 1e15) return Long.toString(d.longValue());
        return o.toString();
    }
    @SuppressWarnings("unchecked") static Map<String, Object> obj(Object o) { return o instanceof Map ? (Map<String, Object>) o : new LinkedHashMap<>(); }
    static String s(Map<String, Object> m, String k) { Object v = m.get(k); return v == null ? null : v.toString(); }
    static double num(Object o, double dflt) { return o instanceof Number n ? n.doubleValue() : dflt; }
    static Map<String, Object> map(Object... kv) {
        Map<String, Object> m = new LinkedHashMap<>();
        for (int i = 0; i < kv.length; i += 2) m.put((String) kv[i], kv[i + 1]);
        return m;
    }

    // ---------------------------------------------------------------- the connection
    static SocketChannel ch;
    static final AtomicLong ids = new AtomicLong();
    static final Map<Long, CompletableFuture<Map<String, Object>>> waiting = new ConcurrentHashMap<>();
    static String sessionId;
    static long deadlineMs;

    static void connect(String path) throws Exception {
        long delay = 50;
        while (true) {
            try { ch = SocketChannel.open(UnixDomainSocketAddress.of(path)); break; }
            catch (IOException e) {          // EAGAIN: the vault's accept queue is full (section 3)
                if (!String.valueOf(e.getMessage()).contains("temporarily unavailable") || System.currentTimeMillis() + delay > deadlineMs - MARGIN_MS) throw e;
                Thread.sleep(delay); delay = Math.min(delay * 2, 500);
            }
        }
        Thread.ofVirtual().name("reader").start(() -> {
            try {
                BufferedReader r = new BufferedReader(new InputStreamReader(Channels.newInputStream(ch), StandardCharsets.UTF_8));
                String line;
                while ((line = r.readLine()) != null) {
                    Map<String, Object> msg;
                    try { msg = obj(parse(line)); } catch (RuntimeException e) { continue; }
                    Object id = msg.get("id");
                    CompletableFuture<Map<String, Object>> f = id instanceof Number n ? waiting.remove(n.longValue()) : null;
                    if (f != null) f.complete(msg);   // lines without our id are ignored
                }
            } catch (IOException ignored) { }
            IOException gone = new IOException("the vault closed the connection");
            waiting.values().forEach(f -> f.completeExceptionally(gone));
        });
    }

    static Map<String, Object> request(String method, Map<String, Object> params) throws Exception {
        long id = ids.incrementAndGet();
        CompletableFuture<Map<String, Object>> f = new CompletableFuture<>();
        waiting.put(id, f);
        byte[] line = (str(map("jsonrpc", "2.0", "id", id, "method", method, "params", params)) + "\n").getBytes(StandardCharsets.UTF_8);
        synchronized (ch) { ByteBuffer b = ByteBuffer.wrap(line); while (b.hasRemaining()) ch.write(b); }
        return f.get();
    }
    static Map<String, Object> rpc(String method, Map<String, Object> params) throws Exception {
        Map<String, Object> p = new LinkedHashMap<>(params); p.put("session_id", sessionId);
        return request(method, p);
    }
    static long left() { return deadlineMs - MARGIN_MS - System.currentTimeMillis(); }
    static double waitS() { return Math.max(0, Math.min(20, (left() - 500) / 1000.0)); }
    static void log(String m) { System.err.println("[rt46c-java " + Thread.currentThread() + "] " + m); }

    // ---------------------------------------------------------------- one step
    record Out(String kind, Map<String, Object> data, String token, String owner, String requestId, String why, int attempts) {}

    static Map<String, Object> settle(Map<String, Object> res) throws Exception {
        while ("approval_pending".equals(s(res, "category"))) {
            if (left() < 600 || res.get("resume_token") == null) return res;
            Map<String, Object> ans = rpc("call.resume", map("resume_token", res.get("resume_token"), "wait_s", waitS()));
            if (ans.containsKey("error")) return map("category", "_resume_error");
            res = obj(ans.get("result"));
        }
        return res;
    }

    /** [verdict, payload]: done (data), resend, answer (a result), stop (why). */
    static Object[] reconcile(String op, String cid, String key) throws Exception {
        long delay = 100; int tries = 0;
        while (true) {
            Map<String, Object> p = map("operation", op);
            if (cid != null) p.put("correlation_id", cid); else p.put("idempotency_key", key);
            Map<String, Object> ans = rpc("lookup", p);
            if (ans.containsKey("error")) return new Object[]{"stop", "lookup refused"};
            Map<String, Object> lk = obj(ans.get("result"));
            String cat = s(lk, "category"), rec = s(lk, "reconciled");
            log("lookup " + op + ": " + cat + " / " + rec);
            if ("found".equals(rec) || "not_found".equals(rec)) {
                if (!"success".equals(cat)) return new Object[]{"answer", lk};
                if ("found".equals(rec)) {
                    Object created = obj(lk.get("data")).get("created");
                    return new Object[]{"done", created instanceof List<?> l && !l.isEmpty() ? obj(l.get(0)) : map()};
                }
                return new Object[]{"resend", null};
            }
            if (lk.get("resume_token") != null) { Map<String, Object> r = new LinkedHashMap<>(lk); r.put("category", "approval_pending"); return new Object[]{"answer", r}; }
            if (NEVER.contains(cat)) return new Object[]{"answer", lk};
            if ("rate_limited".equals(cat)) {
                long w = (long) (num(lk.get("retry_after_s"), 0.5) * 1000);
                if (left() < w + 300) return new Object[]{"stop", "lookup paced past the deadline"};
                Thread.sleep(w); continue;
            }
            if (++tries > 4 || left() < delay + 300) return new Object[]{"stop", "outcome still unknown"};
            Thread.sleep(delay); delay *= 2;
        }
    }

    static Out runStep(Map<String, Object> spec) throws Exception {
        String id = s(spec, "id"), op = s(spec, "op"), key = s(spec, "key");
        int attempts = (int) num(spec.get("attempts"), 0);
        Map<String, Object> res = null;
        if (spec.get("token") != null) {
            res = settle(map("category", "approval_pending", "resume_token", spec.get("token")));
            if ("_resume_error".equals(s(res, "category"))) res = null;   // unknown token: call again, same key
        } else if (Boolean.TRUE.equals(spec.get("probe"))) {
            Object[] r = reconcile(op, null, key);
            if (r[0].equals("done")) return new Out("done", obj(r[1]), null, null, null, null, attempts);
            if (r[0].equals("stop")) return new Out("fatal", null, null, null, null, (String) r[1], attempts);
            if (r[0].equals("answer")) res = settle(obj(r[1]));
        }
        while (true) {
            if (res == null) {
                if (attempts >= 3) return new Out("failed", null, null, null, null, "three attempts", attempts);
                if (left() < 800) return new Out("failed", null, null, null, null, "no time left to send it", attempts);
                Map<String, Object> ans = rpc("call", map("operation", op, "params", spec.get("params"), "idempotency_key", key, "wait_s", waitS()));
                attempts++;
                if (ans.containsKey("error")) return new Out("fatal", null, null, null, null, "refused: " + s(obj(ans.get("error")), "message"), attempts);
                res = settle(obj(ans.get("result")));
            }
            String cat = s(res, "category");
            log("step " + id + ": " + cat);
            if ("success".equals(cat)) return new Out("done", obj(res.get("data")), null, null, null, null, attempts);
            if ("approval_pending".equals(cat)) return new Out("pending", null, s(res, "resume_token"), s(res, "owner"), s(res, "request_id"), null, attempts);
            if ("_resume_error".equals(cat)) { res = null; continue; }
            if (NEVER.contains(cat)) return new Out("fatal", null, null, null, null, cat + ": " + s(res, "message"), attempts);
            if ("local_failure".equals(cat) || "confirmed_failure".equals(cat)) { res = null; continue; }
            if ("rate_limited".equals(cat)) {
                long w = (long) (num(res.get("retry_after_s"), 1) * 1000);
                if (attempts >= 3 || left() < w + 800) return new Out("failed", map("retry_at", (System.currentTimeMillis() + w) / 1000.0), null, null, null, "rate limited past the deadline", attempts);
                Thread.sleep(w); res = null; continue;
            }
            if ("vault_locked".equals(cat)) {       // resend only once vault.status says unlocked
                attempts--;
                while (Boolean.TRUE.equals(obj(request("vault.status", map()).get("result")).get("locked"))) {
                    if (left() < 800) return new Out("fatal", null, null, null, null, "the vault stayed locked", attempts);
                    Thread.sleep(250);
                }
                res = null; continue;
            }
            if ("outcome_unknown".equals(cat)) {
                Object[] r = reconcile(op, s(res, "correlation_id"), key);
                if (r[0].equals("done")) return new Out("done", obj(r[1]), null, null, null, null, attempts);
                if (r[0].equals("resend")) { res = null; continue; }
                if (r[0].equals("stop")) return new Out("fatal", null, null, null, null, (String) r[1], attempts);
                res = settle(obj(r[1]));
                if ("outcome_unknown".equals(s(res, "category"))) return new Out("fatal", null, null, null, null, "unknown again", attempts);
                continue;
            }
            return new Out("fatal", null, null, null, null, "unexpected " + cat, attempts);
        }
    }

    // ---------------------------------------------------------------- the task
    static Object resolve(Object v, Map<String, Map<String, Object>> data, boolean[] ok) {
        if (v instanceof String str) {
            Matcher m = REF.matcher(str); StringBuilder b = new StringBuilder();
            while (m.find()) {
                Object got = data.getOrDefault(m.group(1), Map.of()).get(m.group(2));
                if (got == null) { ok[0] = false; m.appendReplacement(b, Matcher.quoteReplacement(m.group(0))); }
                else m.appendReplacement(b, Matcher.quoteReplacement(got instanceof Double d && d == Math.rint(d) ? Long.toString(d.longValue()) : got.toString()));
            }
            m.appendTail(b); return b.toString();
        }
        if (v instanceof Map<?, ?> mm) { Map<String, Object> o = new LinkedHashMap<>(); mm.forEach((k, x) -> o.put(k.toString(), resolve(x, data, ok))); return o; }
        if (v instanceof List<?> l) { List<Object> o = new ArrayList<>(); l.forEach(x -> o.add(resolve(x, data, ok))); return o; }
        return v;
    }

    public static void main(String[] args) {
        String fin;
        try { fin = run(); } catch (Exception e) { log("error: " + e); fin = "not done: agent error (" + e.getClass().getSimpleName() + ")"; }
        try { if (ch != null) ch.close(); } catch (IOException ignored) { }
        System.out.println(fin);
        System.out.flush();
        System.exit(0);
    }

    static String run() throws Exception {
        Map<String, Object> task = obj(parse(Files.readString(Path.of(System.getenv("VAULTSIM_TASK")))));
        String runId = Optional.ofNullable(System.getenv("VAULTSIM_RUN_ID")).orElse(s(task, "run_id"));
        deadlineMs = (long) (num(task.get("deadline"), 0) * 1000);
        String agent = s(task, "agent");
        Path stateFile = Path.of(s(task, "state_dir"), "state.json");
        Map<String, Object> state = Files.exists(stateFile) ? obj(parse(Files.readString(stateFile))) : map("steps", map());
        Map<String, Object> steps = obj(state.get("steps"));
        state.put("steps", steps);
        Runnable save = () -> {             // written in state_dir and moved: /tmp is another mount
            try {
                Path tmp = stateFile.resolveSibling(".state.tmp");
                synchronized (state) { Files.writeString(tmp, str(state)); }
                Files.move(tmp, stateFile, StandardCopyOption.REPLACE_EXISTING, StandardCopyOption.ATOMIC_MOVE);
            } catch (IOException e) { log("state not saved: " + e); }
        };
        connect(System.getenv("VAULTSIM_SOCKET"));
        Map<String, Object> opened = request("session.open", map("agent", agent, "run_id", runId, "client", map("name", "rt46c-vthreads", "via", "virtual threads")));
        if (opened.containsKey("error")) return "not done: session refused";
        sessionId = s(obj(opened.get("result")), "session_id");
        Map<String, String> mode = new HashMap<>();
        for (Object o : (List<?>) obj(request("catalog", map()).get("result")).getOrDefault("operations", List.of()))
            mode.put(s(obj(o), "name"), Optional.ofNullable(s(obj(obj(o).get("approval")), "mode")).orElse("session"));

        List<?> list = (List<?>) task.get("steps");
        Map<String, Map<String, Object>> data = new ConcurrentHashMap<>();
        steps.forEach((id, st) -> { if ("done".equals(s(obj(st), "status"))) data.put(id, obj(obj(st).get("data"))); });
        Map<String, Future<Out>> inflight = new LinkedHashMap<>();
        Map<String, Boolean> gatedInflight = new HashMap<>();
        String stop = null, pending = null;
        List<String> names = new ArrayList<>();
        try (ExecutorService vt = Executors.newVirtualThreadPerTaskExecutor()) {
            int next = 0;
            while (true) {
                while (stop == null && next < list.size()) {
                    Map<String, Object> step = obj(list.get(next));
                    String id = Optional.ofNullable(s(step, "id")).orElse("step" + next);
                    if (names.size() <= next) names.add(id);
                    Map<String, Object> st = obj(steps.get(id));
                    String status = s(st, "status");
                    if ("done".equals(status)) { next++; continue; }
                    if ("stopped".equals(status)) { stop = "step " + id + " was stopped by a predecessor"; break; }
                    Matcher refs = Pattern.compile("\\$\\{([^.}]+)\\.").matcher(str(step.get("params")));
                    boolean waitRef = false;
                    while (refs.find()) waitRef |= inflight.containsKey(refs.group(1));
                    boolean gated = !"auto".equals(mode.getOrDefault(s(step, "call"), "session"));
                    if (waitRef || (gated && !inflight.isEmpty()) || gatedInflight.containsValue(true)) break;
                    boolean[] ok = {true};
                    Object params = resolve(step.getOrDefault("params", map()), data, ok);
                    if (!ok[0]) { steps.put(id, map("status", "failed", "attempts", 0)); next++; continue; }
                    // polite: the vault's state before each step; nothing sent while it is locked
                    while (Boolean.TRUE.equals(obj(request("vault.status", map()).get("result")).get("locked"))) {
                        if (left() < 500) { stop = "the vault stayed locked before step " + id; break; }
                        Thread.sleep(250);
                    }
                    if (stop != null) break;
                    double retryAt = num(st.get("retry_at"), 0) * 1000;
                    if (retryAt > System.currentTimeMillis()) {
                        if (retryAt > deadlineMs - MARGIN_MS - 800) { stop = "step " + id + " rate limited past the deadline"; break; }
                        Thread.sleep((long) retryAt - System.currentTimeMillis());
                    }
                    Map<String, Object> spec = map("id", id, "op", s(step, "call"), "params", params,
                            "key", runId + ":" + agent + ":" + id, "attempts", num(st.get("attempts"), 0),
                            "token", "pending".equals(status) ? st.get("token") : null, "probe", "sent".equals(status));
                    if (!"pending".equals(status) && !"sent".equals(status)) { steps.put(id, map("status", "sent", "attempts", num(st.get("attempts"), 0))); save.run(); }
                    inflight.put(id, vt.submit(() -> runStep(spec)));
                    gatedInflight.put(id, gated);
                    next++;
                }
                if (inflight.isEmpty()) break;
                // the first to finish, in the order they went out
                String doneId = null; Out out = null;
                while (doneId == null) {
                    for (var e : inflight.entrySet()) if (e.getValue().isDone()) { doneId = e.getKey(); break; }
                    if (doneId == null) Thread.sleep(10);
                }
                try { out = inflight.remove(doneId).get(); } catch (ExecutionException e) { out = new Out("fatal", null, null, null, null, "step error: " + e.getCause(), 3); }
                gatedInflight.remove(doneId);
                log("step " + doneId + " -> " + out.kind() + (out.why() != null ? ": " + out.why() : ""));
                switch (out.kind()) {
                    case "done" -> { steps.put(doneId, map("status", "done", "data", out.data())); data.put(doneId, out.data()); }
                    case "pending" -> {
                        steps.put(doneId, map("status", "pending", "token", out.token(), "attempts", out.attempts()));
                        if (pending == null) pending = "waiting: step " + doneId + " needs approval from " + out.owner() + " (request " + out.requestId() + ")";
                        if (stop == null) stop = "waiting";
                    }
                    case "fatal" -> { steps.put(doneId, map("status", "stopped", "why", out.why())); if (stop == null) stop = "step " + doneId + ": " + out.why(); }
                    default -> {
                        Map<String, Object> f = map("status", "failed", "attempts", out.attempts());
                        if (out.data() != null && out.data().get("retry_at") != null) f.put("retry_at", out.data().get("retry_at"));
                        steps.put(doneId, f);
                    }
                }
                save.run();
            }
        }
        if (pending != null) return pending;
        if (stop != null) return "not done: " + stop;
        for (int i = 0; i < list.size(); i++) {
            String id = Optional.ofNullable(s(obj(list.get(i)), "id")).orElse("step" + i);
            if (!"done".equals(s(obj(steps.get(id)), "status"))) return "not done: step " + id + " not done";
        }
        return "done: " + list.size() + " step(s)";
    }
}
