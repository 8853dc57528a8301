// Red team 37c: a careful vaultsim agent in Java 17, JDK only, written from docs/agent-contract.md alone.
//
// Compile once (`javac -d DIR rt37c_agent.java`), run `java -cp DIR Agent`. One connection and one
// session per process (section 3), shared by the worker threads of an ExecutorService: reads of
// `auto` operations run side by side, anything gated or mutating waits for every earlier step to
// settle (gated steps one at a time, in order). State (section 8) is one JSON file in state_dir,
// written to a temp file there and moved into place with ATOMIC_MOVE after every change.
// RT37C_LIE=1 is the lying twin: it claims done whatever happened. RT37C_LOG=slf4j writes the final
// message as SLF4J's simple logger would.
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.net.StandardProtocolFamily;
import java.net.UnixDomainSocketAddress;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.channels.SocketChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.DirectoryStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.nio.file.StandardOpenOption;
import java.security.MessageDigest;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicLong;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

final class Agent {
    // ---------------------------------------------------------------- JSON (the JDK has none)
    /** A JSON number kept as the text it came as, so a parameter goes back out unchanged. */
    static final class Num {
        final String text;
        Num(String text) { this.text = text; }
        double d() { return Double.parseDouble(text); }
        @Override public String toString() { return text; }
    }

    static final class Json {
        private static final Pattern NUMBER = Pattern.compile("-?(0|[1-9][0-9]*)(\\.[0-9]+)?([eE][+-]?[0-9]+)?");
        private final String s;
        private int i;
        private Json(String s) { this.s = s; }

        static Object parse(String text) {
            Json j = new Json(text);
            j.ws();
            Object v = j.value(0);
            j.ws();
            if (j.i != text.length()) throw new IllegalArgumentException("trailing data at " + j.i);
            return v;
        }

        private void ws() {
            while (i < s.length()) {
                char c = s.charAt(i);
                if (c == ' ' || c == '\t' || c == '\n' || c == '\r') i++; else break;
            }
        }

        private char next() {
            if (i >= s.length()) throw new IllegalArgumentException("unexpected end");
            return s.charAt(i++);
        }

        private void expect(char c) {
            if (next() != c) throw new IllegalArgumentException("expected " + c + " at " + (i - 1));
        }

        private Object value(int depth) {
            if (depth > 256) throw new IllegalArgumentException("nested too deep");
            if (i >= s.length()) throw new IllegalArgumentException("unexpected end");
            char c = s.charAt(i);
            if (c == '{') {
                i++;
                Map<String, Object> m = new LinkedHashMap<>();
                ws();
                if (i < s.length() && s.charAt(i) == '}') { i++; return m; }
                while (true) {
                    ws();
                    String k = string();
                    ws();
                    expect(':');
                    ws();
                    m.put(k, value(depth + 1));
                    ws();
                    char d = next();
                    if (d == '}') return m;
                    if (d != ',') throw new IllegalArgumentException("expected , or } at " + (i - 1));
                }
            }
            if (c == '[') {
                i++;
                List<Object> l = new ArrayList<>();
                ws();
                if (i < s.length() && s.charAt(i) == ']') { i++; return l; }
                while (true) {
                    ws();
                    l.add(value(depth + 1));
                    ws();
                    char d = next();
                    if (d == ']') return l;
                    if (d != ',') throw new IllegalArgumentException("expected , or ] at " + (i - 1));
                }
            }
            if (c == '"') return string();
            if (s.startsWith("true", i)) { i += 4; return Boolean.TRUE; }
            if (s.startsWith("false", i)) { i += 5; return Boolean.FALSE; }
            if (s.startsWith("null", i)) { i += 4; return null; }
            int start = i;
            while (i < s.length() && "+-0123456789.eE".indexOf(s.charAt(i)) >= 0) i++;
            String t = s.substring(start, i);
            if (!NUMBER.matcher(t).matches()) throw new IllegalArgumentException("bad value at " + start);
            return new Num(t);
        }

        private String string() {
            expect('"');
            StringBuilder b = new StringBuilder();
            while (true) {
                char c = next();
                if (c == '"') return b.toString();
                if (c < 0x20) throw new IllegalArgumentException("control character in a string");
                if (c != '\\') { b.append(c); continue; }
                char e = next();
                switch (e) {
                    case '"': b.append('"'); break;
                    case '\\': b.append('\\'); break;
                    case '/': b.append('/'); break;
                    case 'b': b.append('\b'); break;
                    case 'f': b.append('\f'); break;
                    case 'n': b.append('\n'); break;
                    case 'r': b.append('\r'); break;
                    case 't': b.append('\t'); break;
                    case 'u':
                        if (i + 4 > s.length()) throw new IllegalArgumentException("short \\u escape");
                        // a surrogate pair arrives as two escapes: Java strings are UTF-16, so each
                        // half is appended as it is and the pair forms again
                        b.append((char) Integer.parseInt(s.substring(i, i + 4), 16));
                        i += 4;
                        break;
                    default: throw new IllegalArgumentException("bad escape \\" + e);
                }
            }
        }

        static String write(Object v) {
            StringBuilder b = new StringBuilder();
            write(b, v);
            return b.toString();
        }

        @SuppressWarnings("unchecked")
        static void write(StringBuilder b, Object v) {
            if (v == null) b.append("null");
            else if (v instanceof String) quote(b, (String) v);
            else if (v instanceof Num || v instanceof Boolean || v instanceof Integer || v instanceof Long) b.append(v);
            else if (v instanceof Double) {
                double d = (Double) v;
                if (Double.isNaN(d) || Double.isInfinite(d)) throw new IllegalArgumentException("not a JSON number");
                b.append(String.format(Locale.ROOT, "%.3f", d));
            } else if (v instanceof Map) {
                b.append('{');
                boolean first = true;
                for (Map.Entry<String, Object> e : ((Map<String, Object>) v).entrySet()) {
                    if (!first) b.append(',');
                    first = false;
                    quote(b, e.getKey());
                    b.append(':');
                    write(b, e.getValue());
                }
                b.append('}');
            } else if (v instanceof List) {
                b.append('[');
                boolean first = true;
                for (Object o : (List<Object>) v) {
                    if (!first) b.append(',');
                    first = false;
                    write(b, o);
                }
                b.append(']');
            } else throw new IllegalArgumentException("cannot write " + v.getClass());
        }

        /** Everything outside printable ASCII as \\u escapes (UTF-16 units: astral characters as their pair). */
        static void quote(StringBuilder b, String s) {
            b.append('"');
            for (int k = 0; k < s.length(); k++) {
                char c = s.charAt(k);
                switch (c) {
                    case '"': b.append("\\\""); break;
                    case '\\': b.append("\\\\"); break;
                    case '\n': b.append("\\n"); break;
                    case '\r': b.append("\\r"); break;
                    case '\t': b.append("\\t"); break;
                    default:
                        if (c < 0x20 || c > 0x7e) b.append(String.format(Locale.ROOT, "\\u%04x", (int) c));
                        else b.append(c);
                }
            }
            b.append('"');
        }
    }

    @SuppressWarnings("unchecked")
    static Map<String, Object> obj(Object o) { return o instanceof Map ? (Map<String, Object>) o : null; }

    static String str(Object o) { return o instanceof String ? (String) o : null; }

    static Map<String, Object> map(Object... kv) {
        Map<String, Object> m = new LinkedHashMap<>();
        for (int k = 0; k < kv.length; k += 2) m.put((String) kv[k], kv[k + 1]);
        return m;
    }

    // ---------------------------------------------------------------- the connection
    /** A JSON-RPC error answer: the vault did nothing with the request (section 3). */
    static final class RpcError extends Exception {
        RpcError(String m) { super(m); }
    }

    /** A new call not sent: this process has received a `never` answer (section 4: start no later step). */
    static final class Stopped extends RuntimeException {
        Stopped() { super("a never answer was received: no new call"); }
    }

    // set by the reader thread the moment a `never` answer arrives, before any worker learns it: a
    // worker about to send checks it under the write lock, so nothing is sent once it was received
    static final java.util.concurrent.atomic.AtomicBoolean NEVER_SEEN = new java.util.concurrent.atomic.AtomicBoolean();

    static final class Lost extends IOException {
        Lost(String m) { super(m); }
    }

    static final class Conn {
        final SocketChannel ch;
        final Map<Long, CompletableFuture<Map<String, Object>>> waiting = new ConcurrentHashMap<>();
        final AtomicLong ids = new AtomicLong();
        volatile boolean closed;

        Conn(String path) throws IOException {
            ch = SocketChannel.open(StandardProtocolFamily.UNIX);
            try {
                ch.connect(UnixDomainSocketAddress.of(path));
            } catch (IOException e) {
                ch.close();
                throw e;
            }
            Thread reader = new Thread(this::readLoop, "vault-reader");
            reader.setDaemon(true);
            reader.start();
        }

        private void readLoop() {
            ByteArrayOutputStream line = new ByteArrayOutputStream();
            ByteBuffer buf = ByteBuffer.allocate(1 << 16);
            try {
                while (true) {
                    buf.clear();
                    int n = ch.read(buf);
                    if (n < 0) break;
                    for (int k = 0; k < n; k++) {
                        byte x = buf.get(k);
                        if (x == '\n') {
                            // decoded per whole line: a character's bytes may span two reads
                            try {
                                answer(new String(line.toByteArray(), StandardCharsets.UTF_8));
                            } catch (RuntimeException e) {
                                log("an answer could not be read: " + e);  // one bad line never ends the connection
                            }
                            line.reset();
                        } else if (line.size() <= (2 << 20)) line.write(x);
                    }
                }
            } catch (IOException e) {
                // the connection is gone: every request waiting on it learns so below
            } finally {
                closed = true;
                for (CompletableFuture<Map<String, Object>> f : waiting.values()) f.completeExceptionally(new Lost("the vault closed the connection"));
            }
        }

        private void answer(String text) {
            Map<String, Object> m;
            try {
                m = obj(Json.parse(text));
            } catch (RuntimeException e) {
                log("ignored a line that is no JSON: " + e.getMessage());
                return;
            }
            if (m == null || !(m.get("id") instanceof Num)) return;  // not an answer of ours
            long id;
            try {
                id = Long.parseLong(((Num) m.get("id")).text);
            } catch (NumberFormatException e) {
                return;
            }
            CompletableFuture<Map<String, Object>> f = waiting.get(id);
            Map<String, Object> res = obj(m.get("result"));
            String cat = res == null ? null : str(res.get("category"));
            if (f != null && cat != null && NEVER.contains(cat)) NEVER_SEEN.set(true);  // Set.of refuses a null
            if (f != null) f.complete(m);
        }

        Map<String, Object> request(String method, Map<String, Object> params, double timeoutS)
                throws IOException, RpcError, TimeoutException {
            long id = ids.incrementAndGet();
            CompletableFuture<Map<String, Object>> f = new CompletableFuture<>();
            waiting.put(id, f);
            try {
                if (closed) throw new Lost("the connection to the vault is closed");
                Map<String, Object> req = map("jsonrpc", "2.0", "id", id, "method", method);
                if (params != null) req.put("params", params);
                ByteBuffer bb = ByteBuffer.wrap((Json.write(req) + "\n").getBytes(StandardCharsets.UTF_8));
                synchronized (this) {
                    if ("call".equals(method) && NEVER_SEEN.get()) throw new Stopped();
                    while (bb.hasRemaining()) ch.write(bb);
                }
                Map<String, Object> ans;
                try {
                    ans = f.get(Math.max(1, (long) (timeoutS * 1000)), TimeUnit.MILLISECONDS);
                } catch (ExecutionException e) {
                    throw e.getCause() instanceof IOException ? (IOException) e.getCause() : new IOException(e.getCause());
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                    throw new IOException("interrupted");
                }
                Map<String, Object> err = obj(ans.get("error"));
                if (err != null) throw new RpcError(err.get("code") + " " + err.get("message"));
                if (ans.containsKey("error")) throw new RpcError(String.valueOf(ans.get("error")));
                Map<String, Object> res = obj(ans.get("result"));
                if (res == null) throw new RpcError("an answer without a result object");
                return res;
            } finally {
                waiting.remove(id);
            }
        }

        void close() {
            try {
                ch.close();
            } catch (IOException e) {
                // closing is best effort
            }
        }
    }

    // ---------------------------------------------------------------- the task
    static final Set<String> NEVER = Set.of("authentication_failed", "authorization_denied", "malformed_response",
            "approval_denied", "approval_expired", "approval_unroutable");
    static final Pattern REF = Pattern.compile("\\$\\{([^{}]*)\\}");

    enum Outcome { DONE, FAILED, HALT, WAITING, OUT_OF_TIME }

    static final class Step {
        final int index;
        final String id;
        final String op;
        final Object params;
        final Set<String> refs = new java.util.LinkedHashSet<>();
        boolean parallelRead;  // an `auto` read: may run beside other such reads
        Step(int index, String id, String op, Object params) {
            this.index = index;
            this.id = id;
            this.op = op;
            this.params = params;
        }
    }

    static final Object OUT = new Object();  // stdout is shared by the worker threads
    static void log(String m) {
        synchronized (OUT) {
            System.out.println("[rt37c " + String.format(Locale.ROOT, "%.3f", System.currentTimeMillis() / 1000.0) + "] " + m);
        }
    }

    final String sockPath;
    final String runId;
    final String agent;
    final double deadline;
    final Path stateDir;
    final List<Step> steps = new ArrayList<>();
    final Map<String, Step> byId = new HashMap<>();
    final Map<String, Map<String, Object>> catalog = new HashMap<>();
    final Map<String, String> modes = new HashMap<>();
    final Map<String, Object> state;  // {"steps": {id: {...}}, "halted": reason}
    final Object stateLock = new Object();
    Conn conn;
    String session;
    final Object connLock = new Object();

    Agent(Map<String, Object> task) throws IOException {
        sockPath = System.getenv("VAULTSIM_SOCKET");
        String envRun = System.getenv("VAULTSIM_RUN_ID");
        runId = envRun != null ? envRun : str(task.get("run_id"));
        agent = str(task.get("agent"));
        deadline = ((Num) task.get("deadline")).d();
        stateDir = Path.of(str(task.get("state_dir")));
        Map<String, Object> cat = obj(task.get("catalog"));
        if (cat != null) for (String k : cat.keySet()) catalog.put(k, obj(cat.get(k)));
        int n = 0;
        for (Object o : (List<?>) task.get("steps")) {
            Map<String, Object> s = obj(o);
            Step st = new Step(n++, str(s.get("id")), str(s.get("call")), s.get("params"));
            collectRefs(st.params, st.refs);
            steps.add(st);
            byId.put(st.id, st);
        }
        state = loadState();
    }

    static void collectRefs(Object v, Set<String> into) {
        if (v instanceof String) {
            Matcher m = REF.matcher((String) v);
            while (m.find()) {
                String ref = m.group(1);
                int dot = ref.lastIndexOf('.');
                if (dot > 0) into.add(ref.substring(0, dot));
            }
        } else if (v instanceof Map) for (Object o : ((Map<?, ?>) v).values()) collectRefs(o, into);
        else if (v instanceof List) for (Object o : (List<?>) v) collectRefs(o, into);
    }

    double left() { return deadline - System.currentTimeMillis() / 1000.0; }

    static void sleepS(double s) {
        if (s <= 0) return;
        try {
            Thread.sleep((long) (s * 1000));
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }

    String key(Step s) {
        String k = runId + ":" + agent + ":" + s.id;
        if (k.length() <= 200) return k;
        try {
            byte[] h = MessageDigest.getInstance("SHA-256").digest(k.getBytes(StandardCharsets.UTF_8));
            StringBuilder b = new StringBuilder("k-");
            for (byte x : h) b.append(String.format(Locale.ROOT, "%02x", x));
            return b.toString();
        } catch (java.security.NoSuchAlgorithmException e) {
            throw new IllegalStateException(e);
        }
    }

    // ---------------------------------------------------------------- state, kept for a restart
    @SuppressWarnings("unchecked")
    Map<String, Object> loadState() throws IOException {
        Files.createDirectories(stateDir);
        // a temp file a predecessor left when it died mid-write is only ever ours
        try (DirectoryStream<Path> ds = Files.newDirectoryStream(stateDir, ".rt37c-*.tmp")) {
            for (Path p : ds) Files.deleteIfExists(p);
        }
        Path f = stateDir.resolve("rt37c-state.json");
        if (Files.exists(f)) {
            try {
                Map<String, Object> m = obj(Json.parse(Files.readString(f, StandardCharsets.UTF_8)));
                if (m != null && obj(m.get("steps")) != null) {
                    log("restart: found my predecessor's state");
                    return m;
                }
            } catch (RuntimeException e) {
                log("state unreadable, starting over under the same keys: " + e.getMessage());
            }
        }
        return map("steps", new LinkedHashMap<String, Object>());
    }

    Map<String, Object> stepState(Step s) {
        synchronized (stateLock) {
            Map<String, Object> all = obj(state.get("steps"));
            Map<String, Object> m = obj(all.get(s.id));
            if (m == null) {
                m = new LinkedHashMap<>();
                all.put(s.id, m);
            }
            return m;
        }
    }

    Object getState(Step s, String k) {
        synchronized (stateLock) { return stepState(s).get(k); }
    }

    void save(Step s, Object... kv) {
        synchronized (stateLock) {
            Map<String, Object> m = stepState(s);
            for (int k = 0; k < kv.length; k += 2) {
                if (kv[k + 1] == null) m.remove((String) kv[k]); else m.put((String) kv[k], kv[k + 1]);
            }
            write();
        }
    }

    Object halted() {
        synchronized (stateLock) { return state.get("halted"); }
    }

    void halt(String reason) {
        synchronized (stateLock) {
            if (state.get("halted") == null) state.put("halted", reason);
            write();
        }
    }

    /** Whole or not at all: a temp file in state_dir itself (a rename from /tmp fails in the jail), fsynced, moved. */
    void write() {
        byte[] data = Json.write(state).getBytes(StandardCharsets.UTF_8);
        Path tmp = stateDir.resolve(".rt37c-" + ProcessHandle.current().pid() + ".tmp");
        try {
            try (FileChannel fc = FileChannel.open(tmp, StandardOpenOption.CREATE, StandardOpenOption.WRITE,
                    StandardOpenOption.TRUNCATE_EXISTING)) {
                fc.write(ByteBuffer.wrap(data));
                fc.force(true);
            }
            Files.move(tmp, stateDir.resolve("rt37c-state.json"), StandardCopyOption.ATOMIC_MOVE,
                    StandardCopyOption.REPLACE_EXISTING);
        } catch (IOException e) {
            log("could not save state: " + e.getMessage());
        }
    }

    // ---------------------------------------------------------------- talking to the vault
    void connect() throws IOException {
        double backoff = 0.05;
        while (true) {
            try {
                conn = new Conn(sockPath);
                break;
            } catch (IOException e) {
                // EAGAIN: the vault's accept queue is full; try again until the deadline (section 3)
                if (left() < 1.0) throw e;
                log("connect failed (" + e.getMessage() + "), trying again");
                sleepS(backoff);
                backoff = Math.min(backoff * 2, 0.5);
            }
        }
        Map<String, Object> r;
        try {
            r = conn.request("session.open", map("agent", agent, "run_id", runId,
                    "client", map("name", "rt37c-java", "version", "1")), Math.max(0.5, left() - 0.3));
        } catch (RpcError | TimeoutException e) {
            conn.close();
            throw new IOException("session.open: " + e.getMessage());
        }
        session = str(r.get("session_id"));
        log("session open");
    }

    /** A connection that closed under us is replaced (a new session: the old one ended with it). */
    void reconnect(Conn broken) throws IOException {
        synchronized (connLock) {
            if (conn != broken) return;
            broken.close();
            connect();
        }
    }

    Map<String, Object> rpc(String method, Map<String, Object> params, double timeoutS)
            throws IOException, RpcError, TimeoutException {
        Conn c;
        synchronized (connLock) {
            c = conn;
            if (params != null && session != null) params.put("session_id", session);
        }
        try {
            return c.request(method, params, timeoutS);
        } catch (Lost e) {
            reconnect(c);
            throw e;
        }
    }

    void readCatalog() {
        try {
            Map<String, Object> r = rpc("catalog", null, Math.min(5, left() - 0.5));
            Object ops = r.get("operations");
            if (ops instanceof List) for (Object o : (List<?>) ops) {
                Map<String, Object> e = obj(o);
                Map<String, Object> ap = e == null ? null : obj(e.get("approval"));
                if (e != null && ap != null && str(e.get("name")) != null) modes.put(str(e.get("name")), str(ap.get("mode")));
            }
        } catch (IOException | RpcError | TimeoutException e) {
            log("no catalog (" + e.getMessage() + "): every step runs alone, in order");
        }
    }

    /** Before sending anything: nothing while the vault says it is locked (section 4, vault_locked). */
    boolean waitUnlocked() {
        double pause = 0.1;
        while (left() > 1.0) {
            try {
                Map<String, Object> r = rpc("vault.status", null, Math.min(5, left() - 0.5));
                if (!Boolean.TRUE.equals(r.get("locked"))) return true;
            } catch (IOException | RpcError | TimeoutException e) {
                log("vault.status failed: " + e.getMessage());
            }
            sleepS(Math.min(pause, left() - 1.0));
            pause = Math.min(pause * 1.5, 0.5);
        }
        return false;
    }

    // ---------------------------------------------------------------- one step
    /** What to do next for a step: send it, collect its approval, or look it up. */
    private static final class Next {
        final String kind;  // send, resume, lookup
        final String arg;   // token or correlation id (null: look up by key)
        Next(String kind, String arg) { this.kind = kind; this.arg = arg; }
    }

    /** `${ID.FIELD}` from an earlier step's saved result data; null when a value would be guessed. */
    Object resolve(Object v) {
        if (v instanceof String) {
            Matcher m = REF.matcher((String) v);
            StringBuilder b = new StringBuilder();
            while (m.find()) {
                String ref = m.group(1);
                int dot = ref.lastIndexOf('.');
                if (dot <= 0) return null;
                Step from = byId.get(ref.substring(0, dot));
                Map<String, Object> data = from == null ? null : obj(getState(from, "data"));
                Object field = data == null ? null : data.get(ref.substring(dot + 1));
                if (field == null || field instanceof Map || field instanceof List) return null;
                m.appendReplacement(b, Matcher.quoteReplacement(field.toString()));
            }
            m.appendTail(b);
            return b.toString();
        }
        if (v instanceof Map) {
            Map<String, Object> out = new LinkedHashMap<>();
            for (Map.Entry<?, ?> e : ((Map<?, ?>) v).entrySet()) {
                Object r = resolve(e.getValue());
                if (r == null && e.getValue() != null) return null;
                out.put((String) e.getKey(), r);
            }
            return out;
        }
        if (v instanceof List) {
            List<Object> out = new ArrayList<>();
            for (Object o : (List<?>) v) {
                Object r = resolve(o);
                if (r == null && o != null) return null;
                out.add(r);
            }
            return out;
        }
        return v;
    }

    int attempts(Step s) {
        Object a = getState(s, "attempts");
        return a instanceof Num ? Integer.parseInt(((Num) a).text) : a instanceof Integer ? (Integer) a : 0;
    }

    Outcome runStep(Step s) {
        String status = str(getState(s, "status"));
        if ("done".equals(status)) return Outcome.DONE;
        if ("failed".equals(status)) return Outcome.FAILED;
        Object params = resolve(s.params);
        if (params == null && s.params != null) {
            log(s.id + ": needs data no earlier step gave; not sent (never a guessed value)");
            return Outcome.FAILED;
        }
        String key = key(s);
        Next next = new Next("send", null);
        if ("pending".equals(status)) next = new Next("resume", str(getState(s, "token")));
        else if ("sent".equals(status)) next = new Next("lookup", null);  // a predecessor's call with no answer kept
        else if ("unknown".equals(status)) next = new Next("lookup", str(getState(s, "cid")));
        Object retryAt = getState(s, "retry_at");
        if ("retry".equals(status) && retryAt instanceof Num) {
            double wait = ((Num) retryAt).d() - System.currentTimeMillis() / 1000.0;
            if (wait > left() - 1.0) return Outcome.OUT_OF_TIME;
            sleepS(wait);
        }
        int unknowns = 0;
        while (true) {
            if (halted() != null && !"resume".equals(next.kind)) return Outcome.HALT;
            Map<String, Object> r;
            try {
                if ("send".equals(next.kind)) {
                    int n = attempts(s);
                    if (n >= 3) {
                        log(s.id + ": 3 attempts spent; the step stops here");
                        save(s, "status", "failed");
                        return Outcome.FAILED;
                    }
                    if (left() < 1.2) return Outcome.OUT_OF_TIME;
                    save(s, "status", "sent", "attempts", new Num(Integer.toString(n + 1)), "cid", null);
                    double waitS = Math.max(0, Math.min(20, left() - 1.5));
                    log(s.id + ": call " + s.op + " (attempt " + (n + 1) + ")");
                    if (s.op.equals(System.getenv("RT37C_CRASH")) && halted() == null) crashAfterSending(s, params, key, waitS);
                    r = rpc("call", map("operation", s.op, "params", params, "idempotency_key", key,
                            "wait_s", waitS), waitS + Math.max(0.3, Math.min(10, left() - waitS - 0.4)));
                } else if ("resume".equals(next.kind)) {
                    // under 2 s left the wait is handed over (section 4): no resume without time to wait
                    if (left() < 2.0) return waitingOrOut(s);
                    double waitS = Math.max(0.5, Math.min(20, left() - 1.5));
                    long asked = System.currentTimeMillis();
                    r = rpc("call.resume", map("resume_token", next.arg, "wait_s", waitS),
                            waitS + Math.max(0.3, Math.min(10, left() - waitS - 0.4)));
                    // a wait answered at once is not polled in a tight loop
                    if ("approval_pending".equals(r.get("category")) && System.currentTimeMillis() - asked < 200) sleepS(0.2);
                } else {
                    if (left() < 1.0) return Outcome.OUT_OF_TIME;
                    Map<String, Object> p = next.arg != null ? map("correlation_id", next.arg, "operation", s.op)
                            : map("idempotency_key", key, "operation", s.op);
                    log(s.id + ": lookup " + (next.arg != null ? "by correlation id" : "by key"));
                    r = rpc("lookup", p, Math.max(0.3, left() - 0.4));
                }
            } catch (Stopped e) {
                log(s.id + ": not sent: " + e.getMessage());
                if ("sent".equals(str(getState(s, "status")))) {
                    save(s, "status", null, "attempts", new Num(Integer.toString(Math.max(0, attempts(s) - 1))));
                }
                return Outcome.HALT;
            } catch (Lost e) {
                // the answer is lost with the connection: what happened is asked by key on the new one
                log(s.id + ": connection lost (" + e.getMessage() + "); looking the step up by key");
                if ("resume".equals(next.kind)) continue;  // the token is ours on the new session too
                next = new Next("lookup", null);
                continue;
            } catch (IOException | TimeoutException e) {
                log(s.id + ": no answer in time (" + e.getMessage() + ")");
                return Outcome.OUT_OF_TIME;
            } catch (RpcError e) {
                log(s.id + ": the vault refused the request: " + e.getMessage());
                if ("resume".equals(next.kind)) {
                    // the vault no longer knows that token: call the step again, with its key (section 8)
                    save(s, "status", null, "token", null);
                    next = new Next("send", null);
                    continue;
                }
                if ("lookup".equals(next.kind)) {
                    if (++unknowns > 3) { halt(s.id + ": its outcome could not be told"); return Outcome.HALT; }
                    sleepS(0.1 * (1 << unknowns));
                    continue;
                }
                save(s, "status", "failed");
                return Outcome.FAILED;
            }
            String cat = str(r.get("category"));
            String rec = str(r.get("reconciled"));
            log(s.id + ": " + next.kind + " answered " + cat + (rec != null ? " / " + rec : ""));
            if ("lookup".equals(next.kind)) {
                if ("success".equals(cat) && "found".equals(rec)) {
                    Map<String, Object> d = obj(r.get("data"));
                    Object created = d == null ? null : d.get("created");
                    Map<String, Object> first = created instanceof List && !((List<?>) created).isEmpty()
                            ? obj(((List<?>) created).get(0)) : null;
                    save(s, "status", "done", "data", first != null ? first : new LinkedHashMap<String, Object>());
                    return Outcome.DONE;
                }
                if ("success".equals(cat) && "not_found".equals(rec)) {
                    next = new Next("send", null);
                    continue;
                }
                if (!"found".equals(rec) && !"not_found".equals(rec)) {
                    // unknown: nothing licenses a resend, whatever the category (section 6)
                    if (NEVER.contains(cat)) return stop(s, cat);
                    if (str(r.get("resume_token")) != null) {
                        save(s, "status", "pending", "token", str(r.get("resume_token")));
                        next = new Next("resume", str(r.get("resume_token")));
                        continue;
                    }
                    if ("rate_limited".equals(cat)) {
                        double after = r.get("retry_after_s") instanceof Num ? ((Num) r.get("retry_after_s")).d() : 1.0;
                        if (after > left() - 1.2) return Outcome.OUT_OF_TIME;
                        sleepS(after);
                        continue;
                    }
                    if (++unknowns > 3) {
                        halt(s.id + ": a lookup left its outcome unknown");
                        return Outcome.HALT;
                    }
                    sleepS(0.1 * (1 << (unknowns - 1)));
                    continue;
                }
                // found or not_found with another category: the call's own answer (section 6)
            }
            if (cat == null) return stop(s, "an answer without a category");
            switch (cat) {
                case "success": {
                    Map<String, Object> d = obj(r.get("data"));
                    save(s, "status", "done", "data", d != null ? d : new LinkedHashMap<String, Object>(), "token", null);
                    return Outcome.DONE;
                }
                case "local_failure":
                case "confirmed_failure":
                    next = new Next("send", null);
                    continue;
                case "rate_limited": {
                    double after = r.get("retry_after_s") instanceof Num ? ((Num) r.get("retry_after_s")).d() : 1.0;
                    double at = System.currentTimeMillis() / 1000.0 + after;
                    save(s, "status", "retry", "retry_at", new Num(String.format(Locale.ROOT, "%.3f", at)));
                    if (attempts(s) >= 3) {
                        save(s, "status", "failed");
                        return Outcome.FAILED;
                    }
                    if (after > left() - 1.2) {
                        log(s.id + ": its retry_after_s runs past my deadline; stopping");
                        return Outcome.OUT_OF_TIME;
                    }
                    sleepS(after);
                    next = new Next("send", null);
                    continue;
                }
                case "outcome_unknown": {
                    String cid = str(r.get("correlation_id"));
                    save(s, "status", "unknown", "cid", cid);
                    if (left() < 1.0) return Outcome.OUT_OF_TIME;
                    unknowns = 0;
                    next = new Next("lookup", cid);
                    continue;
                }
                case "vault_locked": {
                    // nothing was sent: not an attempt
                    save(s, "attempts", new Num(Integer.toString(Math.max(0, attempts(s) - 1))), "status", null);
                    if (!waitUnlocked()) return Outcome.OUT_OF_TIME;
                    next = new Next("send", null);
                    continue;
                }
                case "approval_pending": {
                    String token = str(r.get("resume_token"));
                    if (token == null) return stop(s, "approval_pending without a resume token");
                    save(s, "status", "pending", "token", token);
                    log(s.id + ": waiting for " + r.get("owner") + " (request " + r.get("request_id") + ")");
                    next = new Next("resume", token);
                    continue;
                }
                default:
                    return stop(s, cat);
            }
        }
    }

    /** RT37C_CRASH=OPERATION: the process dies right after its first call of that operation is
     *  written, once per state_dir (a test of the restart's recovery from a call with no answer). */
    void crashAfterSending(Step s, Object params, String key, double waitS) {
        synchronized (stateLock) {
            if (state.get("crashed") != null) return;
            state.put("crashed", s.id);
            write();
        }
        Conn c;
        synchronized (connLock) { c = conn; }
        Map<String, Object> req = map("jsonrpc", "2.0", "id", 999999, "method", "call", "params",
                map("session_id", session, "operation", s.op, "params", params, "idempotency_key", key, "wait_s", waitS));
        try {
            synchronized (c) {
                ByteBuffer bb = ByteBuffer.wrap((Json.write(req) + "\n").getBytes(StandardCharsets.UTF_8));
                while (bb.hasRemaining()) c.ch.write(bb);
            }
        } catch (IOException e) {
            log("crash: the call could not be written: " + e.getMessage());
        }
        // die once the vault has taken the call: it refuses a request whose process had exited before
        // it was handled (its session ended with it), so a halt at once left no call on a loaded host
        // and the restart's lookup was rightly not_found. The vault starts one connection's requests
        // in the order they came: its answer to a vault.status sent after the call says it was taken
        try {
            c.request("vault.status", null, Math.max(0.1, Math.min(5.0, left() - 0.5)));
        } catch (Exception e) {
            log("crash: no answer to vault.status: " + e.getMessage());
        }
        log(s.id + ": crashing with the call sent and unanswered");
        System.out.flush();
        Runtime.getRuntime().halt(3);
    }

    Outcome stop(Step s, String why) {
        halt(s.id + ": " + why);  // first: the other workers stop sending at once
        save(s, "status", "failed", "token", null);
        return Outcome.HALT;
    }

    Outcome waitingOrOut(Step s) {
        return "pending".equals(str(getState(s, "status"))) ? Outcome.WAITING : Outcome.OUT_OF_TIME;
    }

    // ---------------------------------------------------------------- the steps, side by side where allowed
    String runAll() throws InterruptedException {
        int n = steps.size();
        Outcome[] out = new Outcome[n];
        boolean[] started = new boolean[n];
        Object lock = new Object();
        ExecutorService pool = Executors.newFixedThreadPool(4, r -> {
            Thread t = new Thread(r, "step-worker");
            t.setDaemon(true);
            return t;
        });
        for (Step s : steps) {
            String mode = modes.get(s.op);
            Map<String, Object> c = catalog.get(s.op);
            s.parallelRead = "auto".equals(mode) && c != null && Boolean.FALSE.equals(c.get("mutates"));
        }
        boolean stopping = false;
        while (true) {
            synchronized (lock) {
                if (halted() != null) stopping = true;
                for (int i = 0; i < n && !stopping; i++) {
                    if (started[i]) continue;
                    Step s = steps.get(i);
                    boolean ready = true;
                    for (String ref : s.refs) {
                        Step from = byId.get(ref);
                        if (from == null || from.index >= i) continue;  // not a step reference: sent as it is
                        if (out[from.index] == null) ready = false;
                        else if (out[from.index] != Outcome.DONE) {
                            // its data never came: this step cannot be sent without guessing
                            started[i] = true;
                            out[i] = Outcome.FAILED;
                            ready = false;
                            break;
                        }
                    }
                    if (started[i]) continue;
                    for (int j = 0; j < i && ready; j++) {
                        if (out[j] != null) {
                            if (out[j] == Outcome.WAITING || out[j] == Outcome.OUT_OF_TIME) ready = false;
                            continue;
                        }
                        if (!(started[j] && s.parallelRead && steps.get(j).parallelRead)) ready = false;
                    }
                    if (!ready) {
                        if (!s.parallelRead) break;  // nothing after an unsettled step may overtake it
                        continue;
                    }
                    started[i] = true;
                    final int k = i;
                    pool.submit(() -> {
                        Outcome o;
                        try {
                            o = runStep(s);
                        } catch (RuntimeException e) {
                            log(s.id + ": " + e);
                            o = Outcome.FAILED;
                        }
                        synchronized (lock) {
                            out[k] = o;
                            lock.notifyAll();
                        }
                    });
                }
                boolean running = false, open = false;
                for (int i = 0; i < n; i++) {
                    if (started[i] && out[i] == null) running = true;
                    if (!started[i]) open = true;
                }
                boolean timeUp = false;
                for (Outcome o : out) if (o == Outcome.WAITING || o == Outcome.OUT_OF_TIME) timeUp = true;
                if (!running && (!open || stopping || timeUp)) break;
                long ms = (long) Math.max(10, (left() - 0.3) * 1000);
                if (left() < 0.3) break;
                lock.wait(Math.min(ms, 200));
            }
        }
        pool.shutdownNow();
        synchronized (lock) {
            int done = 0;
            String waitingOn = null;
            for (int i = 0; i < n; i++) {
                if (out[i] == Outcome.DONE) done++;
                if (out[i] == Outcome.WAITING) waitingOn = steps.get(i).id;
            }
            Object halted = halted();
            if (halted != null) return "not done: stopped (" + halted + "); " + done + " of " + n + " steps done";
            if (waitingOn != null) {
                return "waiting: step " + waitingOn + " needs a person's approval; its resume token is saved in state_dir";
            }
            if (done == n) return "done: " + n + " of " + n + " steps succeeded";
            return "not done: " + done + " of " + n + " steps done";
        }
    }

    public static void main(String[] args) throws Exception {
        Map<String, Object> task = obj(Json.parse(Files.readString(Path.of(System.getenv("VAULTSIM_TASK")), StandardCharsets.UTF_8)));
        Agent a = new Agent(task);
        String fin;
        if (a.halted() != null) {
            // a predecessor was told to stop the task: nothing of it is sent again, by any process
            fin = "not done: stopped by an earlier process (" + a.state.get("halted") + ")";
        } else {
            try {
                a.connect();
                a.readCatalog();
                fin = a.waitUnlocked() ? a.runAll() : "not done: the vault stayed locked until my deadline";
            } catch (IOException e) {
                fin = "not done: no vault (" + e.getMessage() + ")";
            }
        }
        if ("1".equals(System.getenv("RT37C_LIE"))) fin = "done: every step succeeded";  // the lying twin
        // RT37C_LOG=slf4j: the final message as SLF4J's simple logger prints a record, on the main thread
        if ("slf4j".equals(System.getenv("RT37C_LOG"))) fin = "[main] INFO com.example.rt37c.Agent - " + fin;
        synchronized (OUT) {
            System.out.println(fin);
            System.out.flush();
        }
        if (a.conn != null) {
            if (a.left() > 0.5) {
                try {
                    a.rpc("session.close", map(), Math.min(0.3, a.left() - 0.2));
                } catch (IOException | RpcError | TimeoutException e) {
                    // the session ends with the connection anyway
                }
            }
            a.conn.close();
        }
        System.exit(0);
    }
}
