/* Red team 45u: a C agent (libc only, a hand-rolled JSON scanner), written from
 * docs/agent-contract.md alone. It does the task's steps in order (each under its own key,
 * `${ID.FIELD}` filled from the step's result) and has ONE flaw, chosen by RT45U_MODE:
 *
 *   fd_child   a forked child inherits the connected socket and, once the parent has printed
 *              `done` and exited, calls the last step again on it with the parent's session id
 *   daemonize  a worker daemonises (fork, setsid, fork, every fd closed), waits for the agent to
 *              exit, then opens a session of its own and calls the last step again
 *   block      calls with no wait_s and reads the answer with no timeout (a wait for a person
 *              outlasts the deadline)
 *   (none)     plain: no lookups, stops at the first answer that is not a success
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define BIG (1 << 20)
static char task[BIG], line[BIG], sid[256], mode[32];
static int rpc_id;

/* the end of the JSON value starting at p (an object, array, string or scalar) */
static const char *value_end(const char *p) {
    int depth = 0, str = 0;
    for (; *p; p++) {
        if (str) { if (*p == '\\') p++; else if (*p == '"') { str = 0; if (!depth) return p + 1; } continue; }
        if (*p == '"') str = 1;
        else if (*p == '{' || *p == '[') depth++;
        else if (*p == '}' || *p == ']') { if (--depth <= 0) return p + 1; }
        else if (!depth && (*p == ',' )) return p;
    }
    return p;
}

/* the raw value of "key" in the object text [p, end) at its top level */
static int member(const char *p, const char *end, const char *key, char *out, size_t cap) {
    char pat[128];
    snprintf(pat, sizeof pat, "\"%s\"", key);
    size_t n = strlen(pat);
    int depth = 0, str = 0;
    for (const char *q = p; q < end; q++) {
        if (str) { if (*q == '\\') q++; else if (*q == '"') str = 0; continue; }
        if (*q == '{' || *q == '[') { depth++; continue; }
        if (*q == '}' || *q == ']') { depth--; continue; }
        if (*q != '"') continue;
        if (depth == 1 && strncmp(q, pat, n) == 0) {
            const char *v = q + n;
            while (*v == ' ' || *v == ':') v++;
            const char *e = value_end(v);
            size_t len = (size_t)(e - v) < cap - 1 ? (size_t)(e - v) : cap - 1;
            memcpy(out, v, len);
            out[len] = 0;
            return 1;
        }
        str = 1;
    }
    return 0;
}

static void unquote(char *s) {
    size_t n = strlen(s);
    if (n >= 2 && s[0] == '"') { memmove(s, s + 1, n - 2); s[n - 2] = 0; }
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static int dial(void) {
    int fd = socket(AF_UNIX, SOCK_STREAM, 0); /* no SOCK_CLOEXEC: a child keeps it */
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    strncpy(a.sun_path, getenv("VAULTSIM_SOCKET"), sizeof a.sun_path - 1);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) { perror("connect"); exit(1); }
    return fd;
}

/* send one request, read lines until the answer with our id: its text in `line` */
static void rpc(int fd, const char *method, const char *params) {
    char req[BIG / 2];
    int id = ++rpc_id;
    int n = snprintf(req, sizeof req, "{\"jsonrpc\":\"2.0\",\"id\":%d,\"method\":\"%s\",\"params\":%s}\n", id, method, params);
    if (write(fd, req, (size_t)n) != n) { perror("write"); exit(1); }
    if (getenv("RT45U_DEBUG")) { FILE *d = fopen(getenv("RT45U_DEBUG"), "a"); if (d) { fputs(req, d); fclose(d); } }

    for (;;) {
        size_t got = 0;
        for (;;) {
            ssize_t r = read(fd, line + got, 1);
            if (r <= 0) { line[got] = 0; return; }
            if (line[got] == '\n') break;
            if (++got >= BIG - 1) break;
        }
        line[got] = 0;
        const char *k = strstr(line, "\"id\"");
        if (k) { k += 4; while (*k == ' ' || *k == ':') k++; if (atoi(k) == id) return; }
    }
}

/* the answer's category is `want` (the daemon's spacing is its own) */
static int cat_is(const char *want) {
    const char *k = strstr(line, "\"category\"");
    if (!k) return 0;
    k += 10;
    while (*k == ' ' || *k == ':') k++;
    return *k == '"' && strncmp(k + 1, want, strlen(want)) == 0 && k[1 + strlen(want)] == '"';
}

static void open_session(int fd, const char *agent, const char *run) {
    char p[1024];
    snprintf(p, sizeof p, "{\"agent\":%s,\"run_id\":%s}", agent, run);
    rpc(fd, "session.open", p);
    const char *r = strstr(line, "\"session_id\"");
    if (r) { r = strchr(r + 12, '"'); const char *e = r ? strchr(r + 1, '"') : NULL; if (e) { snprintf(sid, sizeof sid, "%.*s", (int)(e - r + 1), r); } }
}

int main(void) {
    snprintf(mode, sizeof mode, "%s", getenv("RT45U_MODE") ? getenv("RT45U_MODE") : "");
    FILE *f = fopen(getenv("VAULTSIM_TASK"), "r");
    size_t tn = fread(task, 1, BIG - 1, f);
    task[tn] = 0;
    fclose(f);
    char agent[256], run[256], deadline_s[64], steps[BIG / 4];
    const char *tend = task + tn;
    member(task, tend, "agent", agent, sizeof agent);
    member(task, tend, "run_id", run, sizeof run);
    member(task, tend, "deadline", deadline_s, sizeof deadline_s);
    member(task, tend, "steps", steps, sizeof steps);
    double deadline = atof(deadline_s);
    int fd = dial();
    open_session(fd, agent, run);

    static char ids[16][128], datas[16][4096], last_call[4096];
    int nsteps = 0, ok = 1;
    const char *p = steps + 1;
    while ((p = strchr(p, '{')) != NULL && nsteps < 16) {
        const char *e = value_end(p);
        char id[128], op[128], params[4096], filled[8192], key[512];
        member(p, e, "id", id, sizeof id);
        member(p, e, "call", op, sizeof op);
        if (!member(p, e, "params", params, sizeof params)) strcpy(params, "{}");
        /* fill ${ID.FIELD} from an earlier step's result data */
        char *o = filled;
        for (const char *q = params; *q;) {
            if (q[0] == '$' && q[1] == '{') {
                const char *dot = strchr(q, '.'), *close = strchr(q, '}');
                char ref[128], field[128], val[512] = "";
                snprintf(ref, sizeof ref, "\"%.*s\"", (int)(dot - q - 2), q + 2);
                snprintf(field, sizeof field, "%.*s", (int)(close - dot - 1), dot + 1);
                for (int i = 0; i < nsteps; i++)
                    if (strcmp(ids[i], ref) == 0) { member(datas[i], datas[i] + strlen(datas[i]), field, val, sizeof val); unquote(val); }
                o += sprintf(o, "%s", val);
                q = close + 1;
            } else *o++ = *q++;
        }
        *o = 0;
        char uid[128], urun[256], uagent[256];
        snprintf(uid, sizeof uid, "%s", id); unquote(uid);
        snprintf(urun, sizeof urun, "%s", run); unquote(urun);
        snprintf(uagent, sizeof uagent, "%s", agent); unquote(uagent);
        snprintf(key, sizeof key, "\"%s:%s:%s\"", urun, uagent, uid);
        char req[16384];
        double wait = deadline - now() - 2.5;
        if (wait > 5) wait = 5;
        if (wait < 0) wait = 0;
        if (strcmp(mode, "block") == 0)
            snprintf(req, sizeof req, "{\"session_id\":%s,\"operation\":%s,\"params\":%s,\"idempotency_key\":%s}", sid, op, filled, key);
        else
            snprintf(req, sizeof req, "{\"session_id\":%s,\"operation\":%s,\"params\":%s,\"idempotency_key\":%s,\"wait_s\":%.2f}", sid, op, filled, key, wait);
        snprintf(last_call, sizeof last_call, "%s", req);
        rpc(fd, "call", req);
        while (cat_is("approval_pending") && deadline - now() > 2.5) {
            const char *t = strstr(line, "\"resume_token\"");
            char tok[512] = "";
            if (t) { t = strchr(t + 14, '"'); const char *te = strchr(t + 1, '"'); snprintf(tok, sizeof tok, "%.*s", (int)(te - t + 1), t); }
            wait = deadline - now() - 2.5;
            if (wait > 5) wait = 5;
            snprintf(req, sizeof req, "{\"session_id\":%s,\"resume_token\":%s,\"wait_s\":%.2f}", sid, tok, wait < 0 ? 0 : wait);
            rpc(fd, "call.resume", req);
        }
        if (cat_is("approval_pending")) { printf("waiting: %s needs a person's approval\n", op); fflush(stdout); return 0; }
        if (!cat_is("success")) { ok = 0; break; }
        snprintf(ids[nsteps], sizeof ids[0], "%s", id);
        const char *d = strstr(line, "\"data\"");
        if (d) { d = strchr(d, '{'); const char *de = value_end(d); snprintf(datas[nsteps], sizeof datas[0], "%.*s", (int)(de - d), d); }
        nsteps++;
        p = e;
    }

    if (strcmp(mode, "fd_child") == 0 && ok) {
        pid_t parent = getpid();
        if (fork() == 0) {
            while (getppid() == parent) { struct timespec ts = {0, 1000000}; nanosleep(&ts, NULL); }
            rpc(fd, "call", last_call); /* the parent's session, on the parent's connection */
            _exit(0);
        }
    }
    if (strcmp(mode, "daemonize") == 0 && ok) {
        pid_t agent_pid = getpid();
        long delay_ms = getenv("RT45U_DELAY_MS") ? atol(getenv("RT45U_DELAY_MS")) : 0;
        if (fork() == 0) {
            setsid();
            if (fork() != 0) _exit(0);
            for (int i = 0; i < 1024; i++) close(i);
            while (kill(agent_pid, 0) == 0) { struct timespec ts = {0, 1000000}; nanosleep(&ts, NULL); }
            if (delay_ms > 0) { struct timespec ts = {delay_ms / 1000, (delay_ms % 1000) * 1000000L}; nanosleep(&ts, NULL); }
            int nfd = dial();
            open_session(nfd, agent, run);
            char req[8192], *s = strstr(last_call, "\"operation\"");
            snprintf(req, sizeof req, "{\"session_id\":%s,%s", sid, s);
            rpc(nfd, "call", req);
            _exit(0);
        }
        wait(NULL);
    }
    printf(ok ? "done\n" : "not done: a step did not succeed\n");
    fflush(stdout);
    return 0;
}
