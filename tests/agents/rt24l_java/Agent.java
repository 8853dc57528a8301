// A careful agent in Java 17 (the JDK only: `java Agent.java` runs it from source), written from
// docs/agent-contract.md alone. The JDK has no JSON parser, so a small one is below. Non-blocking
// style: each call with a short wait_s, then call.resume again and again while time is left; state
// kept in state_dir (written there and moved into place), a lookup after outcome_unknown, a `never`
// answer stops the task. Final message: a JSON object with `status` (§7).
import java.io.*;
import java.net.UnixDomainSocketAddress;
import java.nio.channels.Channels;
import java.nio.channels.SocketChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.*;
import java.util.*;
import java.util.regex.*;

public class Agent {
    // ---- JSON: objects as LinkedHashMap, arrays as ArrayList, numbers as Double ----
    static final class Parser {
        final String s; int i;
        Parser(String s) { this.s = s; }
        Object value() {
            ws();
            char c = s.charAt(i);
            if (c == '{') { i++; Map<String, Object> m = new LinkedHashMap<>(); ws();
                if (s.charAt(i) == '}') { i++; return m; }
                while (true) { ws(); String k = str(); ws(); i++; m.put(k, value()); ws();
                    if (s.charAt(i++) == '}') return m; } }
            if (c == '[') { i++; List<Object> l = new ArrayList<>(); ws();
                if (s.charAt(i) == ']') { i++; return l; }
                while (true) { l.add(value()); ws(); if (s.charAt(i++) == ']') return l; } }
            if (c == '"') return str();
            if (s.startsWith("true", i)) { i += 4; return Boolean.TRUE; }
            if (s.startsWith("false", i)) { i += 5; return Boolean.FALSE; }
            if (s.startsWith("null", i)) { i += 4; return null; }
            int j = i; while (i < s.length() && "+-0123456789.eE".indexOf(s.charAt(i)) >= 0) i++;
            return Double.parseDouble(s.substring(j, i));
        }
        String str() {
            StringBuilder b = new StringBuilder(); i++;
            while (true) { char c = s.charAt(i++);
                if (c == '"') return b.toString();
                if (c != '\\') { b.append(c); continue; }
                char e = s.charAt(i++);
                switch (e) {
                    case 'n': b.append('\n'); break; case 't': b.append('\t'); break;
                    case 'r': b.append('\r'); break; case 'b': b.append('\b'); break; case 'f': b.append('\f'); break;
                    case 'u': b.append((char) Integer.parseInt(s.substring(i, i + 4), 16)); i += 4; break;
                    default: b.append(e);
                } }
        }
        void ws() { while (i < s.length() && Character.isWhitespace(s.charAt(i))) i++; }
    }
    static Object parse(String s) { return new Parser(s).value(); }

    static String json(Object v) {
        if (v == null) return "null";
        if (v instanceof String) {
            StringBuilder b = new StringBuilder("\"");
            for (char c : ((String) v).toCharArray()) {
                if (c == '"' || c == '\\') b.append('\\').append(c);
                else if (c < 0x20) b.append(String.format("\\u%04x", (int) c));
                else b.append(c);
            }
            return b.append('"').toString();
        }
        if (v instanceof Double) { double d = (Double) v; return d == Math.rint(d) && Math.abs(d) < 1e15 ? Long.toString((long) d) : java.math.BigDecimal.valueOf(d).toPlainString(); }
        if (v instanceof Number || v instanceof Boolean) return v.toString();
        if (v instanceof Map) { StringJoiner j = new StringJoiner(",", "{", "}");
            for (Map.Entry<?, ?> e : ((Map<?, ?>) v).entrySet()) j.add(json(e.getKey()) + ":" + json(e.getValue()));
            return j.toString(); }
        StringJoiner j = new StringJoiner(",", "[", "]");
        for (Object o : (List<?>) v) j.add(json(o));
        return j.toString();
    }
    @SuppressWarnings("unchecked") static Map<String, Object> obj(Object o) { return o instanceof Map ? (Map<String, Object>) o : new LinkedHashMap<>(); }
    static Map<String, Object> map(Object... kv) { Map<String, Object> m = new LinkedHashMap<>(); for (int k = 0; k < kv.length; k += 2) m.put((String) kv[k], kv[k + 1]); return m; }

    // ---- the agent ----
    static double deadline; static Path statePath; static Map<String, Object> state;
    static BufferedReader in; static Writer out; static int next = 0;

    static double left() { return Math.max(0, deadline - System.currentTimeMillis() / 1000.0); }
    static void log(String m) { System.err.println("java-agent: " + m); }
    static void finish(String status, String message) {
        System.out.println(json(map("status", status, "message", message)));
        System.out.flush();
        System.exit(0);
    }
    static void save() {
        try {
            Path tmp = statePath.resolveSibling(statePath.getFileName() + ".tmp");
            Files.writeString(tmp, json(state));
            Files.move(tmp, statePath, StandardCopyOption.REPLACE_EXISTING, StandardCopyOption.ATOMIC_MOVE);
        } catch (IOException e) { finish("not_done", "cannot keep my state: " + e.getMessage()); }
    }
    static Map<String, Object> rpc(String method, Map<String, Object> params) throws IOException {
        int id = ++next;
        if (left() < 0.05) finish("not_done", "deadline reached before " + method);
        out.write(json(map("jsonrpc", "2.0", "id", (double) id, "method", method, "params", params)) + "\n");
        out.flush();
        String line;
        while ((line = in.readLine()) != null) {
            Map<String, Object> m;
            try { m = obj(parse(line)); } catch (RuntimeException e) { continue; }
            Object got = m.get("id");
            if (got instanceof Double && ((Double) got).intValue() == id) return m;
        }
        finish("not_done", "the vault closed the connection");
        return null;
    }
    static final Pattern REF = Pattern.compile("\\$\\{([^.}]+)\\.([^}]+)\\}");
    @SuppressWarnings("unchecked") static Object fill(Object v) {
        if (v instanceof Map) { Map<String, Object> m = new LinkedHashMap<>(); for (Map.Entry<String, Object> e : ((Map<String, Object>) v).entrySet()) m.put(e.getKey(), fill(e.getValue())); return m; }
        if (v instanceof List) { List<Object> l = new ArrayList<>(); for (Object o : (List<Object>) v) l.add(fill(o)); return l; }
        if (!(v instanceof String)) return v;
        Matcher m = REF.matcher((String) v); StringBuffer b = new StringBuffer();
        while (m.find()) {
            Object d = obj(obj(state.get("done")).get(m.group(1))).get(m.group(2));
            if (d == null) throw new IllegalStateException("missing " + m.group(1) + "." + m.group(2));
            m.appendReplacement(b, Matcher.quoteReplacement(d instanceof Double ? json(d) : d.toString()));
        }
        m.appendTail(b);
        return b.toString();
    }
    static void sleep(double s) { try { Thread.sleep((long) (s * 1000)); } catch (InterruptedException e) { Thread.currentThread().interrupt(); } }

    @SuppressWarnings("unchecked")
    public static void main(String[] args) throws Exception {
        Map<String, Object> task = obj(parse(Files.readString(Path.of(System.getenv("VAULTSIM_TASK")))));
        String runId = System.getenv("VAULTSIM_RUN_ID"), agent = (String) task.get("agent");
        deadline = (Double) task.get("deadline");
        statePath = Path.of((String) task.get("state_dir"), "java-agent.json");
        state = Files.exists(statePath) ? obj(parse(Files.readString(statePath))) : map("done", new LinkedHashMap<>(), "pending", new LinkedHashMap<>());
        SocketChannel ch = SocketChannel.open(UnixDomainSocketAddress.of(System.getenv("VAULTSIM_SOCKET")));
        in = new BufferedReader(new InputStreamReader(Channels.newInputStream(ch), StandardCharsets.UTF_8));
        out = new OutputStreamWriter(Channels.newOutputStream(ch), StandardCharsets.UTF_8);
        Map<String, Object> opened = rpc("session.open", map("agent", agent, "run_id", runId, "client", map("name", "java-agent")));
        String sid = (String) obj(opened.get("result")).get("session_id");
        if (sid == null) finish("not_done", "session.open refused");
        List<Object> ops = (List<Object>) task.get("operations");
        List<Object> steps = (List<Object>) task.get("steps");
        Map<String, Object> done = obj(state.get("done")), pending = obj(state.get("pending"));
        state.put("done", done); state.put("pending", pending);
        steps:
        for (Object so : steps) {
            Map<String, Object> step = obj(so);
            String id = (String) step.get("id"), op = (String) step.get("call");
            if (done.containsKey(id)) { log(id + " already done"); continue; }
            if (!ops.contains(op)) finish("not_done", id + ": " + op + " is not an operation of my task");
            Object params;
            try { params = fill(step.getOrDefault("params", new LinkedHashMap<>())); }
            catch (IllegalStateException e) { finish("not_done", id + ": a parameter refers to data I do not have"); return; }
            String key = runId + ":" + agent + ":" + id;
            String token = (String) pending.get(id);
            int attempts = 0;
            while (true) {
                double wait = Math.max(0, Math.min(1.0, left() - 2));  // short waits, resumed while time is left
                Map<String, Object> ans;
                if (token != null) {
                    ans = rpc("call.resume", map("session_id", sid, "resume_token", token, "wait_s", wait));
                    if (ans.containsKey("error")) { log(id + ": token unknown, calling again"); token = null; pending.remove(id); save(); continue; }
                } else {
                    if (attempts >= 3) finish("not_done", id + ": three attempts failed");
                    attempts++;
                    ans = rpc("call", map("session_id", sid, "operation", op, "params", params, "idempotency_key", key, "wait_s", wait));
                    if (ans.containsKey("error")) finish("not_done", id + ": the vault refused the request");
                }
                Map<String, Object> r = obj(ans.get("result"));
                String cat = (String) r.get("category");
                log(id + " " + op + " -> " + cat);
                switch (cat) {
                    case "success":
                        done.put(id, r.getOrDefault("data", new LinkedHashMap<>())); pending.remove(id); save();
                        continue steps;
                    case "local_failure": case "confirmed_failure":
                        token = null; break;
                    case "rate_limited": {
                        token = null;
                        double d = r.get("retry_after_s") instanceof Double ? (Double) r.get("retry_after_s") : 1.0;
                        if (attempts >= 3 || left() < d + 1) finish("not_done", id + ": rate limited");
                        sleep(d); break;
                    }
                    case "vault_locked":
                        token = null;
                        while (true) {
                            if (left() < 1.5) finish("not_done", id + ": the vault stayed locked");
                            if (Boolean.FALSE.equals(obj(rpc("vault.status", map()).get("result")).get("locked"))) break;
                            sleep(0.2);
                        }
                        break;
                    case "outcome_unknown": {
                        token = null;
                        String rec = "unknown"; Map<String, Object> look = null;
                        for (double pause : new double[] {0, 0.1, 0.2, 0.4}) {
                            sleep(pause);
                            look = obj(rpc("lookup", map("session_id", sid, "correlation_id", r.get("correlation_id"))).get("result"));
                            rec = look.get("reconciled") instanceof String ? (String) look.get("reconciled") : "error";
                            log(id + " lookup -> " + rec);
                            if (!rec.equals("unknown")) break;
                        }
                        if (rec.equals("found")) {
                            List<Object> created = (List<Object>) obj(look.get("data")).getOrDefault("created", new ArrayList<>());
                            done.put(id, created.isEmpty() ? new LinkedHashMap<>() : created.get(0)); save();
                            continue steps;
                        }
                        if (!rec.equals("not_found")) finish("not_done", id + ": its outcome is unknown; a person must inspect it");
                        break;
                    }
                    case "approval_pending":
                        token = (String) r.get("resume_token");
                        pending.put(id, token); save();
                        if (left() < 3) finish("waiting", id + " (" + op + ") needs approval from " + r.get("owner") + " before " + json(r.get("deadline")));
                        break;
                    default:
                        pending.remove(id); save();
                        finish("not_done", id + ": " + cat);
                }
            }
        }
        rpc("session.close", map("session_id", sid));
        finish("done", "all " + steps.size() + " steps succeeded");
    }
}
