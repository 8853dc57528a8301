/* A careful agent in C, libc only, written from docs/agent-contract.md alone (red team, pass 11).
 *
 * Knobs (environment): RT11C_LOOKUP=1 looks every mutating step up by its key before writing it
 * and every approval_pending up by its correlation id; RT11C_LINGER=1 stays until shortly before
 * the deadline (RT11C_MARGIN seconds before it, default 0.4); RT11C_FINAL=word|json|result picks the
 * final message's form.
 * Build: cc -O2 -o careful rt11c_careful.c
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

/* ---- a small JSON DOM -------------------------------------------------------------------- */
enum { JNULL, JFALSE, JTRUE, JNUM, JSTR, JARR, JOBJ };
typedef struct J {
    int t;
    double n;
    char *s;       /* JSTR: UTF-8, NUL-terminated; JNUM: the number's own text */
    int len;
    struct J **v;  /* JARR / JOBJ values */
    char **k;      /* JOBJ keys */
} J;

static const char *P;
static void ws(void) { while (*P == ' ' || *P == '\t' || *P == '\n' || *P == '\r') P++; }
static J *jnew(int t) { J *j = calloc(1, sizeof *j); j->t = t; return j; }
static void put_utf8(char **o, unsigned c) {
    if (c < 0x80) *(*o)++ = (char)c;
    else if (c < 0x800) { *(*o)++ = (char)(0xC0 | c >> 6); *(*o)++ = (char)(0x80 | (c & 63)); }
    else if (c < 0x10000) { *(*o)++ = (char)(0xE0 | c >> 12); *(*o)++ = (char)(0x80 | (c >> 6 & 63)); *(*o)++ = (char)(0x80 | (c & 63)); }
    else { *(*o)++ = (char)(0xF0 | c >> 18); *(*o)++ = (char)(0x80 | (c >> 12 & 63)); *(*o)++ = (char)(0x80 | (c >> 6 & 63)); *(*o)++ = (char)(0x80 | (c & 63)); }
}
static unsigned hex4(const char *p) { char b[5] = {0}; memcpy(b, p, 4); return (unsigned)strtoul(b, NULL, 16); }
static char *pstr(void) {
    const char *q = ++P;
    size_t cap = 0;
    while (*q && *q != '"') { if (*q == '\\') q++; if (*q) q++; cap++; }
    char *out = malloc(cap * 4 + 1), *o = out;
    while (*P && *P != '"') {
        if (*P != '\\') { *o++ = *P++; continue; }
        P++;
        switch (*P) {
        case 'n': *o++ = '\n'; break; case 't': *o++ = '\t'; break; case 'r': *o++ = '\r'; break;
        case 'b': *o++ = '\b'; break; case 'f': *o++ = '\f'; break;
        case 'u': {
            unsigned c = hex4(P + 1); P += 4;
            if (c >= 0xD800 && c < 0xDC00 && P[1] == '\\' && P[2] == 'u') {
                unsigned lo = hex4(P + 3); P += 6; c = 0x10000 + ((c - 0xD800) << 10) + (lo - 0xDC00);
            }
            put_utf8(&o, c); break;
        }
        default: *o++ = *P;
        }
        if (*P) P++;
    }
    if (*P == '"') P++;
    *o = 0;
    return out;
}
static J *parse(void) {
    ws();
    J *j;
    if (*P == '{' || *P == '[') {
        int obj = *P++ == '{';
        j = jnew(obj ? JOBJ : JARR);
        int cap = 8;
        j->v = malloc(cap * sizeof *j->v);
        if (obj) j->k = malloc(cap * sizeof *j->k);
        ws();
        while (*P && *P != (obj ? '}' : ']')) {
            if (j->len == cap) { cap *= 2; j->v = realloc(j->v, cap * sizeof *j->v); if (obj) j->k = realloc(j->k, cap * sizeof *j->k); }
            if (obj) { ws(); j->k[j->len] = pstr(); ws(); if (*P == ':') P++; }
            j->v[j->len++] = parse();
            ws();
            if (*P == ',') P++;
            ws();
        }
        if (*P) P++;
    } else if (*P == '"') { j = jnew(JSTR); j->s = pstr(); }
    else if (!strncmp(P, "true", 4)) { j = jnew(JTRUE); P += 4; }
    else if (!strncmp(P, "false", 5)) { j = jnew(JFALSE); P += 5; }
    else if (!strncmp(P, "null", 4)) { j = jnew(JNULL); P += 4; }
    else {
        j = jnew(JNUM);
        const char *s = P;
        j->n = strtod(P, (char **)&P);
        if (P == s) P++;  /* garbage: skip a byte */
        j->s = strndup(s, (size_t)(P - s));
    }
    return j;
}
static J *jparse(const char *s) { P = s; return parse(); }
static J *get(J *o, const char *k) {
    if (!o || o->t != JOBJ) return NULL;
    for (int i = 0; i < o->len; i++) if (!strcmp(o->k[i], k)) return o->v[i];
    return NULL;
}
static const char *gets_(J *o, const char *k) { J *v = get(o, k); return v && v->t == JSTR ? v->s : NULL; }
static double getn(J *o, const char *k, double d) { J *v = get(o, k); return v && v->t == JNUM ? v->n : d; }

/* a growing buffer */
typedef struct { char *b; size_t n, cap; } Buf;
static void bput(Buf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) { b->cap = (b->n + n + 1) * 2; b->b = realloc(b->b, b->cap); }
    memcpy(b->b + b->n, s, n); b->n += n; b->b[b->n] = 0;
}
static void bstr(Buf *b, const char *s) { bput(b, s, strlen(s)); }
static void bf(Buf *b, const char *fmt, ...) {
    char tmp[512]; va_list ap; va_start(ap, fmt); int n = vsnprintf(tmp, sizeof tmp, fmt, ap); va_end(ap);
    bput(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}
static void bq(Buf *b, const char *s) {  /* a JSON string; UTF-8 bytes pass through */
    bstr(b, "\"");
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') { char e[2] = {'\\', (char)c}; bput(b, e, 2); }
        else if (c < 0x20) bf(b, "\\u%04x", c);
        else bput(b, (const char *)&c, 1);
    }
    bstr(b, "\"");
}
static void jdump(Buf *b, J *j) {
    switch (j->t) {
    case JNULL: bstr(b, "null"); break;
    case JFALSE: bstr(b, "false"); break;
    case JTRUE: bstr(b, "true"); break;
    case JNUM: bstr(b, j->s); break;
    case JSTR: bq(b, j->s); break;
    default:
        bstr(b, j->t == JOBJ ? "{" : "[");
        for (int i = 0; i < j->len; i++) {
            if (i) bstr(b, ",");
            if (j->t == JOBJ) { bq(b, j->k[i]); bstr(b, ":"); }
            jdump(b, j->v[i]);
        }
        bstr(b, j->t == JOBJ ? "}" : "]");
    }
}

/* ---- clock, task, state ------------------------------------------------------------------ */
static double now(void) { struct timespec t; clock_gettime(CLOCK_REALTIME, &t); return t.tv_sec + t.tv_nsec / 1e9; }
static double DEADLINE;
static double left(void) { return DEADLINE - now(); }
#define MARGIN 0.8
static const char *RUN_ID, *AGENT, *STATE_DIR;
static J *TASK;

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    Buf b = {0};
    char tmp[8192]; size_t n;
    while ((n = fread(tmp, 1, sizeof tmp, f)) > 0) bput(&b, tmp, n);
    fclose(f);
    if (!b.b) bput(&b, "", 0);
    return b.b;
}

/* state: {"done": {id: data}, "pending": {id: token}} in state_dir, replaced by a rename there */
static J *STATE;
static void save_state(void) {
    if (!STATE_DIR) return;
    char path[4096], tmp[4200];
    snprintf(path, sizeof path, "%s/rt11c-c.json", STATE_DIR);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    Buf b = {0}; jdump(&b, STATE);
    FILE *f = fopen(tmp, "wb");
    if (!f) return;
    fwrite(b.b, 1, b.n, f);
    fclose(f);
    rename(tmp, path);
    free(b.b);
}
static void load_state(void) {
    char path[4096];
    snprintf(path, sizeof path, "%s/rt11c-c.json", STATE_DIR ? STATE_DIR : ".");
    char *s = STATE_DIR ? slurp(path) : NULL;
    STATE = s ? jparse(s) : NULL;
    if (!STATE || STATE->t != JOBJ || !get(STATE, "done") || !get(STATE, "pending"))
        STATE = jparse("{\"done\": {}, \"pending\": {}}");
}
static void oset(J *o, const char *k, J *v) {  /* set or replace; v NULL removes */
    for (int i = 0; i < o->len; i++) if (!strcmp(o->k[i], k)) {
        if (v) { o->v[i] = v; return; }
        for (int m = i + 1; m < o->len; m++) { o->k[m - 1] = o->k[m]; o->v[m - 1] = o->v[m]; }
        o->len--; return;
    }
    if (!v) return;
    o->v = realloc(o->v, (o->len + 1) * sizeof *o->v);
    o->k = realloc(o->k, (o->len + 1) * sizeof *o->k);
    o->k[o->len] = strdup(k); o->v[o->len++] = v;
}

/* ---- the wire ---------------------------------------------------------------------------- */
static int FD = -1, NEXT_ID = 1;
static Buf IN;
static char SID[256];

/* one request; its answer (the line with our id), or NULL when none came before the deadline */
static J *rpc(const char *method, Buf *params) {
    int id = NEXT_ID++;
    Buf out = {0};
    bf(&out, "{\"jsonrpc\":\"2.0\",\"id\":%d,\"method\":", id); bq(&out, method);
    bstr(&out, ",\"params\":"); bstr(&out, params && params->b ? params->b : "{}"); bstr(&out, "}\n");
    for (size_t off = 0; off < out.n;) {
        ssize_t w = write(FD, out.b + off, out.n - off);
        if (w < 0) { if (errno == EINTR) continue; free(out.b); return NULL; }
        off += (size_t)w;
    }
    free(out.b);
    for (;;) {
        char *nl = IN.b ? memchr(IN.b, '\n', IN.n) : NULL;
        if (nl) {
            *nl = 0;
            J *m = jparse(IN.b);
            size_t used = (size_t)(nl - IN.b) + 1;
            memmove(IN.b, IN.b + used, IN.n - used); IN.n -= used;
            J *mid = get(m, "id");
            if (mid && mid->t == JNUM && (int)mid->n == id) return m;
            continue;  /* not ours: ignore it */
        }
        double l = left() - 0.05;
        if (l <= 0) return NULL;
        struct pollfd pf = {FD, POLLIN, 0};
        int r = poll(&pf, 1, (int)(l * 1000));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return NULL;
        char tmp[65536];
        ssize_t n = read(FD, tmp, sizeof tmp);
        if (n <= 0) return NULL;
        bput(&IN, tmp, (size_t)n);
    }
}
static void psid(Buf *p) { bstr(p, "{\"session_id\":"); bq(p, SID); }

/* ---- ${ID.FIELD} ------------------------------------------------------------------------- */
static J *resolve(J *v, int *missing) {
    if (v->t == JSTR) {
        Buf b = {0}; bput(&b, "", 0);
        const char *s = v->s;
        while (*s) {
            const char *st = strstr(s, "${");
            const char *en = st ? strchr(st, '}') : NULL;
            const char *dot = st && en ? memchr(st, '.', (size_t)(en - st)) : NULL;
            if (!st || !en || !dot) { bstr(&b, s); break; }
            bput(&b, s, (size_t)(st - s));
            char *sid = strndup(st + 2, (size_t)(dot - st - 2)), *fld = strndup(dot + 1, (size_t)(en - dot - 1));
            J *d = get(get(STATE, "done"), sid), *f = get(d, fld);
            if (!f) *missing = 1;
            else if (f->t == JSTR) bstr(&b, f->s);
            else jdump(&b, f);
            free(sid); free(fld);
            s = en + 1;
        }
        J *r = jnew(JSTR); r->s = b.b; return r;
    }
    if (v->t == JOBJ || v->t == JARR) {
        J *r = jnew(v->t); r->len = v->len;
        r->v = malloc((v->len + 1) * sizeof *r->v);
        if (v->t == JOBJ) r->k = v->k;
        for (int i = 0; i < v->len; i++) r->v[i] = resolve(v->v[i], missing);
        return r;
    }
    return v;
}

/* ---- the work ---------------------------------------------------------------------------- */
enum { DONE, FAILED, STOP, WAIT };
static char WHY[1024];
static int is_never(const char *c) {
    const char *n[] = {"authentication_failed", "authorization_denied", "malformed_response",
                       "approval_denied", "approval_expired", "approval_unroutable"};
    for (size_t i = 0; i < sizeof n / sizeof *n; i++) if (!strcmp(c, n[i])) return 1;
    return 0;
}
static void sleep_s(double s) { if (s <= 0) return; struct timespec t = {(time_t)s, (long)((s - (time_t)s) * 1e9)}; nanosleep(&t, NULL); }

/* lookup, asked again while the remote cannot tell: found / not_found / unknown / error */
static const char *lookup(const char *op, const char *by, const char *val, J **res) {
    double delay = 0.1;
    *res = NULL;
    for (int i = 0; i < 4 && left() > MARGIN + 0.5; i++) {
        Buf p = {0}; psid(&p); bf(&p, ",\"%s\":", by); bq(&p, val); bstr(&p, ",\"operation\":"); bq(&p, op); bstr(&p, "}");
        J *a = rpc("lookup", &p); free(p.b);
        if (!a || get(a, "error")) return "error";
        *res = get(a, "result");
        const char *rec = gets_(*res, "reconciled");
        if (rec && (!strcmp(rec, "found") || !strcmp(rec, "not_found"))) return rec;
        sleep_s(delay); delay *= 2;
    }
    return "unknown";
}
static J *created0(J *res) {
    J *c = get(get(res, "data"), "created");
    return c && c->t == JARR && c->len > 0 ? c->v[0] : jparse("{}");
}

static int do_step(J *step, J *params) {
    const char *sid = gets_(step, "id"), *op = gets_(step, "call");
    char key[2048]; snprintf(key, sizeof key, "%s:%s:%s", RUN_ID, AGENT, sid);
    J *cat = get(get(TASK, "catalog"), op), *mut = get(cat, "mutates");
    int mutates = !mut || mut->t != JFALSE;
    Buf pj = {0}; jdump(&pj, params);
    J *res;
    if (getenv("RT11C_LOOKUP") && mutates && !get(get(STATE, "pending"), sid)) {
        const char *rec = lookup(op, "idempotency_key", key, &res);
        printf("log: lookup-before-write %s %s\n", sid, rec);
        if (!strcmp(rec, "found")) { oset(get(STATE, "done"), sid, created0(res)); return DONE; }
    }
    int attempts = 0;
    for (;;) {
        if (left() < MARGIN + 0.3) { snprintf(WHY, sizeof WHY, "no time left for %s", sid); return STOP; }
        double wait_s = left() - MARGIN - 0.3; if (wait_s > 30) wait_s = 30; if (wait_s < 0) wait_s = 0;
        J *pend = get(get(STATE, "pending"), sid), *a;
        Buf p = {0}; psid(&p);
        if (pend && pend->t == JSTR) {
            bstr(&p, ",\"resume_token\":"); bq(&p, pend->s); bf(&p, ",\"wait_s\":%.3f}", wait_s);
            a = rpc("call.resume", &p);
            if (a && get(a, "error")) { oset(get(STATE, "pending"), sid, NULL); save_state(); free(p.b); continue; }
        } else {
            attempts++;
            bstr(&p, ",\"operation\":"); bq(&p, op); bstr(&p, ",\"params\":"); bstr(&p, pj.b);
            bstr(&p, ",\"idempotency_key\":"); bq(&p, key); bf(&p, ",\"wait_s\":%.3f}", wait_s);
            a = rpc("call", &p);
            if (a && get(a, "error")) { snprintf(WHY, sizeof WHY, "%s: refused", sid); free(p.b); return STOP; }
        }
        free(p.b);
        if (!a) { snprintf(WHY, sizeof WHY, "%s: no answer before the deadline", sid); return STOP; }
        res = get(a, "result");
        const char *c = gets_(res, "category"); if (!c) c = "?";
        printf("log: %s %s\n", sid, c); fflush(stdout);
        if (!strcmp(c, "success")) {
            oset(get(STATE, "pending"), sid, NULL);
            J *d = get(res, "data");
            oset(get(STATE, "done"), sid, d && d->t == JOBJ ? d : jparse("{}"));
            return DONE;
        }
        if (!strcmp(c, "approval_pending")) {
            J *tok = get(res, "resume_token");
            oset(get(STATE, "pending"), sid, tok); save_state();
            if (getenv("RT11C_LOOKUP")) { J *r2; printf("log: lookup-after-wait %s %s\n", sid, lookup(op, "correlation_id", gets_(res, "correlation_id"), &r2)); }
            if (left() < MARGIN + 0.5) { snprintf(WHY, sizeof WHY, "%s needs approval from %s", op, gets_(res, "owner") ? gets_(res, "owner") : "?"); return WAIT; }
            continue;
        }
        oset(get(STATE, "pending"), sid, NULL); save_state();
        if (is_never(c)) { snprintf(WHY, sizeof WHY, "%s: %s", sid, c); return STOP; }
        if (!strcmp(c, "outcome_unknown")) {
            J *lr; const char *rec = lookup(op, "correlation_id", gets_(res, "correlation_id"), &lr);
            if (!strcmp(rec, "found")) { oset(get(STATE, "done"), sid, created0(lr)); return DONE; }
            if (!strcmp(rec, "not_found") && attempts < 3) continue;
            snprintf(WHY, sizeof WHY, "%s: outcome unknown (%s)", sid, rec); return STOP;
        }
        if (!strcmp(c, "local_failure") || !strcmp(c, "confirmed_failure")) {
            if (attempts < 3) continue;
            return FAILED;
        }
        if (!strcmp(c, "rate_limited")) {
            double d = getn(res, "retry_after_s", 1.0);
            if (attempts < 3 && left() > d + MARGIN + 0.5) { sleep_s(d); continue; }
            snprintf(WHY, sizeof WHY, "%s: rate limited", sid); return STOP;
        }
        if (!strcmp(c, "vault_locked")) {
            int unlocked = 0;
            while (!unlocked && left() > MARGIN + 0.5) {
                J *s = rpc("vault.status", NULL), *l = get(get(s, "result"), "locked");
                if (l && l->t == JFALSE) unlocked = 1; else sleep_s(0.2);
            }
            if (unlocked) continue;
            snprintf(WHY, sizeof WHY, "%s: vault locked", sid); return STOP;
        }
        snprintf(WHY, sizeof WHY, "%s: %s", sid, c); return STOP;
    }
}

static void final(const char *word, const char *why) {
    const char *form = getenv("RT11C_FINAL") ? getenv("RT11C_FINAL") : "word";
    Buf b = {0};
    if (!strcmp(form, "json")) {
        bstr(&b, "{\"status\":"); bq(&b, !strcmp(word, "not done") ? "not_done" : word);
        bstr(&b, ",\"message\":"); bq(&b, why); bstr(&b, "}");
    } else if (!strcmp(form, "result")) {
        bf(&b, "{\"ok\":%s,\"category\":\"%s\",\"message\":", !strcmp(word, "done") ? "true" : "false",
           !strcmp(word, "waiting") ? "approval_pending" : !strcmp(word, "done") ? "success" : "stopped");
        bq(&b, why); bstr(&b, "}");
    } else { bstr(&b, word); bstr(&b, ": "); bstr(&b, why); }
    printf("%s\n", b.b);
    fflush(stdout);
}

int main(void) {
    const char *tp = getenv("VAULTSIM_TASK"), *sp = getenv("VAULTSIM_SOCKET");
    char *text = tp ? slurp(tp) : NULL;
    if (!text || !sp) { fprintf(stderr, "no task or socket\n"); final("not done", "no task"); return 0; }
    TASK = jparse(text);
    DEADLINE = getn(TASK, "deadline", now() + 10);
    RUN_ID = getenv("VAULTSIM_RUN_ID") ? getenv("VAULTSIM_RUN_ID") : gets_(TASK, "run_id");
    AGENT = gets_(TASK, "agent");
    STATE_DIR = gets_(TASK, "state_dir");
    load_state();

    struct sockaddr_un a = {0}; a.sun_family = AF_UNIX;
    strncpy(a.sun_path, sp, sizeof a.sun_path - 1);
    FD = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (FD < 0 || connect(FD, (struct sockaddr *)&a, sizeof a) < 0) { final("not done", "cannot reach the vault"); return 0; }
    Buf p = {0}; bstr(&p, "{\"agent\":"); bq(&p, AGENT); bstr(&p, ",\"run_id\":"); bq(&p, RUN_ID);
    bstr(&p, ",\"client\":{\"name\":\"rt11c-c\"}}");
    J *o = rpc("session.open", &p);
    const char *sid = gets_(get(o, "result"), "session_id");
    if (!sid) { final("not done", "no session"); return 0; }
    snprintf(SID, sizeof SID, "%s", sid);

    const char *word = "done"; char why[1200] = "every step succeeded";
    J *steps = get(TASK, "steps");
    for (int i = 0; steps && i < steps->len; i++) {
        J *st = steps->v[i];
        const char *id = gets_(st, "id");
        if (get(get(STATE, "done"), id)) continue;
        int missing = 0;
        J *params = get(st, "params") ? resolve(get(st, "params"), &missing) : jparse("{}");
        if (missing) { word = "not done"; snprintf(why, sizeof why, "%s needs data a failed step did not give", id); continue; }
        int r = do_step(st, params);
        save_state();
        if (r == FAILED) { word = "not done"; snprintf(why, sizeof why, "%s failed", id); continue; }
        if (r == STOP) { word = "not done"; snprintf(why, sizeof why, "%s", WHY); break; }
        if (r == WAIT) { word = "waiting"; snprintf(why, sizeof why, "%s", WHY); break; }
    }
    Buf c = {0}; psid(&c); bstr(&c, "}");
    if (left() > 0.3) rpc("session.close", &c);
    close(FD);
    if (getenv("RT11C_LINGER")) sleep_s(left() - (getenv("RT11C_MARGIN") ? atof(getenv("RT11C_MARGIN")) : 0.4));
    final(word, why);
    return 0;
}
