// A careful agent in Java 17, standard library only (java.nio SocketChannel over a
// UnixDomainSocketAddress), written from docs/agent-contract.md alone. Runs as a single source
// file (`java rt9c_careful.java`: compiled in memory, nothing written beside it) or compiled.
// One session per process, one idempotency key per step, the same key on every resend, a
// lookup after an unknown outcome, stop on `never`, resume a pending approval until the
// deadline nears, state kept in state_dir for a restart.
import java.io.*;
import java.net.UnixDomainSocketAddress;
import java.nio.channels.Channels;
import java.nio.channels.SocketChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.*;
import java.util.*;

public class rt9c_careful {
    // ---- a small JSON reader and writer (the JDK has none) ----
    static final class P {
        final String s; int i;
        P(String s) { this.s = s; }
        void ws() { while (i < s.length() && Character.isWhitespace(s.charAt(i))) i++; }
        Object val() {
            ws();
            char c = s.charAt(i);
            if (c == '{') {
                i++; Map<String, Object> m = new LinkedHashMap<>(); ws();
                if (s.charAt(i) == '}') { i++; return m; }
                while (true) {
                    ws(); String k = (String) val(); ws(); i++; // ':'
                    m.put(k, val()); ws();
                    if (s.charAt(i++) == '}') return m;
                }
            }
            if (c == '[') {
                i++; List<Object> l = new ArrayList<>(); ws();
                if (s.charAt(i) == ']') { i++; return l; }
                while (true) { l.add(val()); ws(); if (s.charAt(i++) == ']') return l; }
            }
            if (c == '"') {
                i++; StringBuilder b = new StringBuilder();
                while (true) {
                    char ch = s.charAt(i++);
                    if (ch == '"') return b.toString();
                    if (ch != '\\') { b.append(ch); continue; }
                    char e = s.charAt(i++);
                    switch (e) {
                        case 'n' -> b.append('\n'); case 't' -> b.append('\t'); case 'r' -> b.append('\r');
                        case 'b' -> b.append('\b'); case 'f' -> b.append('\f');
                        case 'u' -> { b.append((char) Integer.parseInt(s.substring(i, i + 4), 16)); i += 4; }
                        default -> b.append(e);
                    }
                }
            }
            if (s.startsWith("true", i)) { i += 4; return Boolean.TRUE; }
            if (s.startsWith("false", i)) { i += 5; return Boolean.FALSE; }
            if (s.startsWith("null", i)) { i += 4; return null; }
            int st = i;
            while (i < s.length() && "+-0123456789.eE".indexOf(s.charAt(i)) >= 0) i++;
            return new java.math.BigDecimal(s.substring(st, i));
        }
    }
    static Object parse(String s) { return new P(s).val(); }
    static String dump(Object o) {
        if (o == null) return "null";
        if (o instanceof String str) {
            StringBuilder b = new StringBuilder("\"");
            for (char c : str.toCharArray()) {
                if (c == '"' || c == '\\') b.append('\\').append(c);
                else if (c < 0x20) b.append(String.format("\\u%04x", (int) c));
                else b.append(c);
            }
            return b.append('"').toString();
        }
        if (o instanceof Map<?, ?> m) {
            StringJoiner j = new StringJoiner(",", "{", "}");
            m.forEach((k, v) -> j.add(dump(k) + ":" + dump(v)));
            return j.toString();
        }
        if (o instanceof List<?> l) {
            StringJoiner j = new StringJoiner(",", "[", "]");
            l.forEach(v -> j.add(dump(v)));
            return j.toString();
        }
        if (o instanceof java.math.BigDecimal d) return d.toString();
        return String.valueOf(o);
    }
    @SuppressWarnings("unchecked") static Map<String, Object> obj(Object o) {
        return o instanceof Map ? (Map<String, Object>) o : new LinkedHashMap<>();
    }
    static String str(Object o) {
        if (o == null) return "";
        if (o instanceof java.math.BigDecimal d) return d.toPlainString();
        return String.valueOf(o);
    }
    static Map<String, Object> m(Object... kv) {
        Map<String, Object> r = new LinkedHashMap<>();
        for (int k = 0; k < kv.length; k += 2) r.put((String) kv[k], kv[k + 1]);
        return r;
    }

    // ---- the wire ----
    static SocketChannel ch; static BufferedReader in; static Writer out; static long nextId = 0;
    static double deadline; static String sid;
    static double now() { return System.currentTimeMillis() / 1000.0; }
    static double left() { return deadline - now(); }

    static final class RpcError extends Exception { RpcError(String m) { super(m); } }

    static Map<String, Object> rpc(String method, Map<String, Object> params) throws IOException, RpcError {
        if (left() < 0.2) throw new RpcError("deadline");
        long id = ++nextId;
        out.write(dump(m("jsonrpc", "2.0", "id", id, "method", method, "params", params)) + "\n");
        out.flush();
        while (true) {
            String line = in.readLine();
            if (line == null) throw new IOException("the vault closed the connection");
            if (line.isBlank()) continue;
            Map<String, Object> msg = obj(parse(line));
            if (!str(msg.get("id")).equals(Long.toString(id))) continue;
            if (msg.get("error") != null) throw new RpcError("rpc error " + str(obj(msg.get("error")).get("code")));
            return obj(msg.get("result"));
        }
    }
    static double waitS() { return Math.max(0, Math.min(60, left() - 1.5)); }

    // ---- state in state_dir ----
    static Map<String, Object> state; static Path statePath;
    static Map<String, Object> done() { return obj(state.get("done")); }
    static Map<String, Object> pending() { return obj(state.get("pending")); }
    static void save() throws IOException {
        if (statePath == null) return;
        Path part = statePath.resolveSibling("rt9c-java.json.part"); // beside it: /tmp is another mount in the jail
        Files.writeString(part, dump(state));
        Files.move(part, statePath, StandardCopyOption.REPLACE_EXISTING, StandardCopyOption.ATOMIC_MOVE);
    }

    static Object subst(Object v) {
        if (v instanceof String s) {
            java.util.regex.Matcher mt = java.util.regex.Pattern.compile("\\$\\{([^.}]+)\\.([^}]+)\\}").matcher(s);
            StringBuilder b = new StringBuilder();
            while (mt.find()) {
                Object d = obj(done().get(mt.group(1))).get(mt.group(2));
                if (d == null) throw new NoSuchElementException(mt.group(0));
                mt.appendReplacement(b, java.util.regex.Matcher.quoteReplacement(str(d)));
            }
            mt.appendTail(b);
            return b.toString();
        }
        if (v instanceof Map<?, ?> mp) { Map<String, Object> r = new LinkedHashMap<>(); mp.forEach((k, x) -> r.put((String) k, subst(x))); return r; }
        if (v instanceof List<?> l) { List<Object> r = new ArrayList<>(); l.forEach(x -> r.add(subst(x))); return r; }
        return v;
    }

    // "" when done, else the final message
    static String step(Map<String, Object> st, String agent, String runId) throws IOException {
        String id = str(st.get("id")), op = str(st.get("call")), key = runId + ":" + agent + ":" + id;
        Object params;
        try { params = subst(st.getOrDefault("params", new LinkedHashMap<>())); }
        catch (NoSuchElementException e) { return "not done: " + id + " needs " + e.getMessage(); }
        Map<String, Object> res = null;
        int attempts = 0;
        try {
            if (pending().containsKey(id)) {
                try { res = rpc("call.resume", m("session_id", sid, "resume_token", pending().get(id), "wait_s", waitS())); }
                catch (RpcError e) { res = null; } // the vault no longer knows the token: call again, same key
            }
            while (true) {
                if (res == null) {
                    if (attempts >= 3 || left() < 1.0) return "not done: " + id + " did not succeed";
                    attempts++;
                    res = rpc("call", m("session_id", sid, "operation", op, "params", params,
                            "idempotency_key", key, "wait_s", waitS()));
                }
                String cat = str(res.get("category"));
                System.out.println("log: " + id + " " + op + ": " + cat);
                switch (cat) {
                    case "success" -> {
                        done().put(id, res.get("data") == null ? new LinkedHashMap<>() : res.get("data"));
                        pending().remove(id); save();
                        return "";
                    }
                    case "approval_pending" -> {
                        pending().put(id, res.get("resume_token")); save();
                        while ("approval_pending".equals(str(res.get("category")))) {
                            if (left() < 1.5) return "waiting: " + op + " needs approval from " + str(res.get("owner"))
                                    + " (request " + str(res.get("request_id")) + ")";
                            res = rpc("call.resume", m("session_id", sid, "resume_token", pending().get(id), "wait_s", waitS()));
                        }
                        pending().remove(id); save();
                    }
                    case "local_failure", "confirmed_failure" -> res = null;
                    case "rate_limited" -> {
                        double after = res.get("retry_after_s") == null ? 1.0 : Double.parseDouble(str(res.get("retry_after_s")));
                        if (left() - after < 1.5) return "not done: " + id + " rate limited past the deadline";
                        Thread.sleep((long) (after * 1000));
                        res = null;
                    }
                    case "vault_locked" -> {
                        while (Boolean.TRUE.equals(rpc("vault.status", m()).get("locked"))) {
                            if (left() < 1.5) return "not done: the vault is locked";
                            Thread.sleep(200);
                        }
                        attempts--;
                        res = null;
                    }
                    case "outcome_unknown" -> {
                        String cid = str(res.get("correlation_id"));
                        long delay = 100; String said = "unknown";
                        for (int k = 0; k < 4; k++) {
                            Map<String, Object> lk = rpc("lookup", m("session_id", sid, "correlation_id", cid, "operation", op));
                            said = str(lk.get("reconciled"));
                            if (said.equals("found")) {
                                Object created = obj(lk.get("data")).get("created");
                                Object first = created instanceof List<?> l && !l.isEmpty() ? l.get(0) : new LinkedHashMap<>();
                                done().put(id, first); save();
                                return "";
                            }
                            if (said.equals("not_found") || left() < 1.0 + delay / 1000.0) break;
                            Thread.sleep(delay); delay *= 2;
                        }
                        if (!said.equals("not_found")) return "not done: " + id + " outcome unknown, a person must look";
                        res = null;
                    }
                    default -> { return "not done: " + id + " " + cat; }
                }
            }
        } catch (RpcError e) {
            return "not done: " + id + " " + e.getMessage();
        } catch (InterruptedException e) {
            return "not done: interrupted";
        }
    }

    public static void main(String[] args) throws Exception {
        Map<String, Object> task = obj(parse(Files.readString(Path.of(System.getenv("VAULTSIM_TASK")))));
        deadline = Double.parseDouble(str(task.get("deadline")));
        String agent = str(task.get("agent"));
        String runId = Optional.ofNullable(System.getenv("VAULTSIM_RUN_ID")).orElse(str(task.get("run_id")));
        statePath = task.get("state_dir") == null ? null : Path.of(str(task.get("state_dir")), "rt9c-java.json");
        state = m("done", new LinkedHashMap<>(), "pending", new LinkedHashMap<>());
        if (statePath != null && Files.exists(statePath)) state = obj(parse(Files.readString(statePath)));
        String fin = "done: every step succeeded";
        try {
            ch = SocketChannel.open(UnixDomainSocketAddress.of(System.getenv("VAULTSIM_SOCKET")));
            in = new BufferedReader(new InputStreamReader(Channels.newInputStream(ch), StandardCharsets.UTF_8));
            out = new BufferedWriter(new OutputStreamWriter(Channels.newOutputStream(ch), StandardCharsets.UTF_8));
            sid = str(rpc("session.open", m("agent", agent, "run_id", runId)).get("session_id"));
            while (Boolean.TRUE.equals(rpc("vault.status", m()).get("locked"))) {
                if (left() < 1.5) { fin = "not done: the vault stayed locked"; break; }
                Thread.sleep(200);
            }
            if (fin.startsWith("done")) {
                for (Object o : (List<?>) task.get("steps")) {
                    Map<String, Object> st = obj(o);
                    if (done().containsKey(str(st.get("id")))) continue;
                    String r = step(st, agent, runId);
                    if (!r.isEmpty()) { fin = r; break; }
                }
            }
            try { rpc("session.close", m("session_id", sid)); } catch (RpcError | IOException e) { /* ending anyway */ }
        } catch (IOException | RpcError e) {
            fin = "not done: " + e.getMessage();
        }
        System.out.println(fin);
    }
}
