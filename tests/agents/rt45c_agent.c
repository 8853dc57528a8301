/* Red team 45c: a careful agent in C (libc only, a hand-written JSON reader and writer),
 * written from docs/agent-contract.md.
 *
 * Shape: non-blocking waits (section 3: `wait_s: 0`, then `call.resume` with short waits until it
 * settles or the deadline nears), poll() with a deadline on every read of the socket, state
 * kept as one line per finished step or pending token in state_dir (a file replaced by a rename
 * inside state_dir, section 1). Rules kept: one session on one connection (3); key
 * RUN:AGENT:STEP on every call and resend (5); a lookup before anything else after
 * outcome_unknown, its category read before its reconciled (6); waits collected or handed over
 * with the token kept (4, 7); retry_after_s waited out, at most 3 attempts (4); never /
 * human_required stops the task (4); a restart resumes or looks up what it kept (8); nothing
 * sent past the deadline; the final message last (7).
 * Build: gcc -O2 -Wall -o agent rt45c_agent.c
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

/* ---- a small JSON tree ------------------------------------------------------------------ */
enum { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ };
typedef struct J { int t; double n; char *s; struct J **v; char **k; int len; } J;

static J *jnew(int t) { J *j = calloc(1, sizeof *j); j->t = t; return j; }
static void jfree(J *j) {
    if (!j) return;
    for (int i = 0; i < j->len; i++) { jfree(j->v[i]); if (j->k) free(j->k[i]); }
    free(j->v); free(j->k); free(j->s); free(j);
}
static const char *ws(const char *p) { while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++; return p; }
static void put_utf8(char **o, unsigned c) {
    char *q = *o;
    if (c < 0x80) *q++ = (char)c;
    else if (c < 0x800) { *q++ = (char)(0xC0 | c >> 6); *q++ = (char)(0x80 | (c & 63)); }
    else if (c < 0x10000) { *q++ = (char)(0xE0 | c >> 12); *q++ = (char)(0x80 | ((c >> 6) & 63)); *q++ = (char)(0x80 | (c & 63)); }
    else { *q++ = (char)(0xF0 | c >> 18); *q++ = (char)(0x80 | ((c >> 12) & 63)); *q++ = (char)(0x80 | ((c >> 6) & 63)); *q++ = (char)(0x80 | (c & 63)); }
    *o = q;
}
static const char *pstr(const char *p, char **out) {
    /* p at the opening quote */
    size_t cap = strlen(p) + 1; char *o = malloc(cap), *q = o; p++;
    while (*p && *p != '"') {
        if (*p != '\\') { *q++ = *p++; continue; }
        p++;
        switch (*p) {
        case 'n': *q++ = '\n'; p++; break; case 't': *q++ = '\t'; p++; break;
        case 'r': *q++ = '\r'; p++; break; case 'b': *q++ = '\b'; p++; break;
        case 'f': *q++ = '\f'; p++; break;
        case 'u': {
            unsigned c = (unsigned)strtoul((char[]){p[1], p[2], p[3], p[4], 0}, NULL, 16); p += 5;
            if (c >= 0xD800 && c < 0xDC00 && p[0] == '\\' && p[1] == 'u') {
                unsigned lo = (unsigned)strtoul((char[]){p[2], p[3], p[4], p[5], 0}, NULL, 16);
                c = 0x10000 + ((c - 0xD800) << 10) + (lo - 0xDC00); p += 6;
            }
            put_utf8(&q, c); break;
        }
        default: if (*p) *q++ = *p++;
        }
    }
    *q = 0; *out = o;
    return *p ? p + 1 : p;
}
static const char *pval(const char *p, J **out);
static void jpush(J *j, char *k, J *v) {
    j->v = realloc(j->v, sizeof(J *) * (size_t)(j->len + 1));
    if (j->t == J_OBJ) { j->k = realloc(j->k, sizeof(char *) * (size_t)(j->len + 1)); j->k[j->len] = k; }
    j->v[j->len++] = v;
}
static const char *pval(const char *p, J **out) {
    p = ws(p);
    if (*p == '{' || *p == '[') {
        int obj = *p == '{'; J *j = jnew(obj ? J_OBJ : J_ARR); p = ws(p + 1);
        while (*p && *p != (obj ? '}' : ']')) {
            char *k = NULL; J *v = NULL;
            if (obj) { if (*p != '"') break; p = ws(pstr(p, &k)); if (*p == ':') p++; }
            p = ws(pval(p, &v));
            jpush(j, k, v ? v : jnew(J_NULL));
            if (*p == ',') p = ws(p + 1);
        }
        *out = j; return *p ? p + 1 : p;
    }
    if (*p == '"') { J *j = jnew(J_STR); p = pstr(p, &j->s); *out = j; return p; }
    if (!strncmp(p, "true", 4)) { J *j = jnew(J_BOOL); j->n = 1; *out = j; return p + 4; }
    if (!strncmp(p, "false", 5)) { *out = jnew(J_BOOL); return p + 5; }
    if (!strncmp(p, "null", 4)) { *out = jnew(J_NULL); return p + 4; }
    char *e; double n = strtod(p, &e);
    if (e == p) { *out = NULL; return p + (*p ? 1 : 0); }
    J *j = jnew(J_NUM); j->n = n; *out = j; return e;
}
static J *jparse(const char *s) { J *j = NULL; pval(s, &j); return j; }
static J *jget(J *j, const char *k) {
    if (!j || j->t != J_OBJ) return NULL;
    for (int i = 0; i < j->len; i++) if (!strcmp(j->k[i], k)) return j->v[i];
    return NULL;
}
static const char *jstr(J *j, const char *k) { J *v = jget(j, k); return v && v->t == J_STR ? v->s : NULL; }
static int jis(J *j, const char *k, const char *want) { const char *s = jstr(j, k); return s && !strcmp(s, want); }

/* a growing string */
typedef struct { char *b; size_t n, cap; } Buf;
static void bput(Buf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) { b->cap = (b->n + n + 1) * 2; b->b = realloc(b->b, b->cap); }
    memcpy(b->b + b->n, s, n); b->n += n; b->b[b->n] = 0;
}
static void bprintf(Buf *b, const char *fmt, ...) {
    char tmp[512]; va_list ap; va_start(ap, fmt); int n = vsnprintf(tmp, sizeof tmp, fmt, ap); va_end(ap);
    bput(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}
static void bstr(Buf *b, const char *s) {
    bput(b, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') { char e[2] = {'\\', (char)*p}; bput(b, e, 2); }
        else if (*p < 0x20) bprintf(b, "\\u%04x", *p);
        else bput(b, (const char *)p, 1);
    }
    bput(b, "\"", 1);
}
static void bjson(Buf *b, J *j) {
    if (!j) { bput(b, "null", 4); return; }
    switch (j->t) {
    case J_NULL: bput(b, "null", 4); break;
    case J_BOOL: if (j->n) bput(b, "true", 4); else bput(b, "false", 5); break;
    case J_NUM: bprintf(b, "%.17g", j->n); break;
    case J_STR: bstr(b, j->s); break;
    default:
        bput(b, j->t == J_OBJ ? "{" : "[", 1);
        for (int i = 0; i < j->len; i++) {
            if (i) bput(b, ",", 1);
            if (j->t == J_OBJ) { bstr(b, j->k[i]); bput(b, ":", 1); }
            bjson(b, j->v[i]);
        }
        bput(b, j->t == J_OBJ ? "}" : "]", 1);
    }
}

/* ---- time, log, state ------------------------------------------------------------------- */
static double deadline, margin = 0.8;
static double now(void) { struct timeval tv; gettimeofday(&tv, NULL); return (double)tv.tv_sec + tv.tv_usec / 1e6; }
static double left(void) { return deadline - now() - margin; }
static void nap(double s) { double l = left(); if (s > l) s = l; if (s > 0) usleep((useconds_t)(s * 1e6)); }
static void logf_(const char *fmt, ...) {
    va_list ap; va_start(ap, fmt); fprintf(stderr, "[rt45c-c] "); vfprintf(stderr, fmt, ap); fputc('\n', stderr); va_end(ap);
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb"); if (!f) return NULL;
    Buf b = {0}; char tmp[8192]; size_t n;
    while ((n = fread(tmp, 1, sizeof tmp, f)) > 0) bput(&b, tmp, n);
    fclose(f); if (!b.b) bput(&b, "", 0);
    return b.b;
}

static J *state;            /* {"step id": {"data": {...}, "token": "...", "sent": true, "attempts": n}} */
static char state_path[4096];
static void save(void) {
    char tmp[4200]; snprintf(tmp, sizeof tmp, "%s.%d.tmp", state_path, (int)getpid());
    Buf b = {0}; bjson(&b, state);
    FILE *f = fopen(tmp, "wb"); if (!f) return;
    fwrite(b.b, 1, b.n, f); fflush(f); fsync(fileno(f)); fclose(f);
    rename(tmp, state_path); free(b.b);
}
static void jset(J *o, const char *k, J *v) {
    for (int i = 0; i < o->len; i++) if (!strcmp(o->k[i], k)) { jfree(o->v[i]); o->v[i] = v; return; }
    jpush(o, strdup(k), v);
}
static void jdel(J *o, const char *k) {
    for (int i = 0; i < o->len; i++) if (!strcmp(o->k[i], k)) {
        jfree(o->v[i]); free(o->k[i]);
        memmove(o->v + i, o->v + i + 1, sizeof(J *) * (size_t)(o->len - i - 1));
        memmove(o->k + i, o->k + i + 1, sizeof(char *) * (size_t)(o->len - i - 1));
        o->len--; return;
    }
}
static J *jstrv(const char *s) { J *j = jnew(J_STR); j->s = strdup(s); return j; }
static J *jnum(double n) { J *j = jnew(J_NUM); j->n = n; return j; }
static J *jcopy(J *j) { Buf b = {0}; bjson(&b, j); J *c = jparse(b.b); free(b.b); return c; }

/* ---- the wire ----------------------------------------------------------------------------- */
static int fd = -1, next_id;
static Buf inbuf;
static char stop_why[600];
static int stopped;
static const char *session_id;

static void stop(const char *fmt, ...) {
    if (stopped) return;
    va_list ap; va_start(ap, fmt); vsnprintf(stop_why, sizeof stop_why, fmt, ap); va_end(ap); stopped = 1;
}

/* returns the result object (caller frees the whole message via *msgp), or NULL: error or gone */
static J *rpc(const char *method, J *params, J **msgp, int *refused) {
    *msgp = NULL; if (refused) *refused = 0;
    if (now() > deadline - 0.25) { stop("the deadline came before %s could be sent", method); return NULL; }
    int id = ++next_id;
    Buf b = {0};
    bprintf(&b, "{\"jsonrpc\":\"2.0\",\"id\":%d,\"method\":", id); bstr(&b, method);
    bput(&b, ",\"params\":", 10); bjson(&b, params); bput(&b, "}\n", 2);
    for (size_t off = 0; off < b.n;) {
        ssize_t w = send(fd, b.b + off, b.n - off, MSG_NOSIGNAL);
        if (w < 0) { if (errno == EINTR) continue; break; }
        off += (size_t)w;
    }
    free(b.b);
    for (;;) {
        char *nl;
        while (!inbuf.b || !(nl = memchr(inbuf.b, '\n', inbuf.n))) {
            struct pollfd p = {fd, POLLIN, 0};
            int ms = (int)((deadline + 1.0 - now()) * 1000);
            if (ms <= 0 || poll(&p, 1, ms) <= 0) { stop("no answer to %s before the deadline", method); return NULL; }
            char tmp[65536]; ssize_t n = recv(fd, tmp, sizeof tmp, 0);
            if (n <= 0) { stop("the vault closed the connection"); return NULL; }
            bput(&inbuf, tmp, (size_t)n);
        }
        *nl = 0;
        J *msg = jparse(inbuf.b);
        size_t used = (size_t)(nl - inbuf.b) + 1;
        memmove(inbuf.b, inbuf.b + used, inbuf.n - used); inbuf.n -= used; inbuf.b[inbuf.n] = 0;
        J *mid = jget(msg, "id");
        if (!mid || mid->t != J_NUM || (int)mid->n != id) { jfree(msg); continue; }
        *msgp = msg;
        if (jget(msg, "error")) { if (refused) *refused = 1; return NULL; }
        J *r = jget(msg, "result");
        return r ? r : msg;
    }
}

static J *req(const char *method, J *params, J **msgp, int *refused) {
    jset(params, "session_id", jstrv(session_id));
    J *r = rpc(method, params, msgp, refused);
    jfree(params);
    if (r) logf_("%s -> %s %s", method, jstr(r, "category") ? jstr(r, "category") : "?",
                 jstr(r, "reconciled") ? jstr(r, "reconciled") : "");
    return r;
}

/* ---- steps -------------------------------------------------------------------------------- */
static J *task, *steps;
static char waiting_msg[2048];
static const char *outcome_of(const char *id) {
    J *rec = jget(state, id);
    return rec && jget(rec, "data") ? "done" : NULL;
}

static int fill_str(const char *in, Buf *out) {
    const char *p = in;
    while (*p) {
        const char *s = strstr(p, "${");
        if (!s) { bput(out, p, strlen(p)); break; }
        const char *dot = strchr(s, '.'), *end = strchr(s, '}');
        if (!dot || !end || dot > end) { bput(out, p, strlen(p)); break; }
        bput(out, p, (size_t)(s - p));
        char id[256], field[256];
        snprintf(id, sizeof id, "%.*s", (int)(dot - s - 2), s + 2);
        snprintf(field, sizeof field, "%.*s", (int)(end - dot - 1), dot + 1);
        J *rec = jget(state, id), *d = rec ? jget(rec, "data") : NULL, *v = jget(d, field);
        if (!v) { stop("step %s gave no %s to use", id, field); return -1; }
        if (v->t == J_STR) bput(out, v->s, strlen(v->s));
        else bjson(out, v);
        p = end + 1;
    }
    return 0;
}
static J *fill(J *v) {
    if (!v) return jnew(J_NULL);
    if (v->t == J_STR) {
        Buf b = {0}; bput(&b, "", 0);
        if (fill_str(v->s, &b) < 0) { free(b.b); return NULL; }
        J *j = jnew(J_STR); j->s = b.b; return j;
    }
    if (v->t == J_OBJ || v->t == J_ARR) {
        J *c = jnew(v->t);
        for (int i = 0; i < v->len; i++) {
            J *x = fill(v->v[i]); if (!x) { jfree(c); return NULL; }
            jpush(c, v->t == J_OBJ ? strdup(v->k[i]) : NULL, x);
        }
        return c;
    }
    return jcopy(v);
}
static int refs_unmet(J *v) {
    if (!v) return 0;
    if (v->t == J_STR) {
        for (const char *p = v->s; (p = strstr(p, "${")); p += 2) {
            const char *dot = strchr(p, '.'); if (!dot) break;
            char id[256]; snprintf(id, sizeof id, "%.*s", (int)(dot - p - 2), p + 2);
            if (!outcome_of(id)) return 1;
        }
        return 0;
    }
    for (int i = 0; (v->t == J_OBJ || v->t == J_ARR) && i < v->len; i++) if (refs_unmet(v->v[i])) return 1;
    return 0;
}
static int retry_stops(J *r) { return jis(r, "retry", "never") || jis(r, "retry", "human_required"); }
static double num(J *r, const char *k, double dflt) { J *v = jget(r, k); return v && v->t == J_NUM ? v->n : dflt; }

/* ref: "correlation_id" or "idempotency_key" with its value */
static J *lookup(const char *op, const char *refk, const char *refv, J **msgp) {
    double pauses[] = {0, 0.1, 0.2, 0.4};
    J *r = NULL; *msgp = NULL;
    for (int i = 0; i < 4; i++) {
        if (pauses[i] > 0) { if (pauses[i] > left()) break; nap(pauses[i]); }
        if (*msgp) jfree(*msgp);
        J *p = jnew(J_OBJ); jset(p, "operation", jstrv(op)); jset(p, refk, jstrv(refv));
        int refused; r = req("lookup", p, msgp, &refused);
        if (!r) { if (refused) stop("%s: its lookup was refused", op); return NULL; }
        if (jis(r, "reconciled", "found") || jis(r, "reconciled", "not_found") || jget(r, "resume_token")
            || jis(r, "category", "rate_limited") || retry_stops(r)) return r;
    }
    return r;
}

enum { DONE, FAILED, WAITING, STOPPED };

static int run_step(J *step) {
    const char *id = jstr(step, "id"), *op = jstr(step, "call");
    char key[1024]; snprintf(key, sizeof key, "%s:%s:%s", jstr(task, "run_id"), jstr(task, "agent"), id);
    J *rec = jget(state, id);
    if (!rec) { jset(state, id, jnew(J_OBJ)); rec = jget(state, id); }
    J *params = fill(jget(step, "params"));
    if (!params) return STOPPED;
    char refk[32] = "idempotency_key", refv[1024]; snprintf(refv, sizeof refv, "%s", key);
    J *msg = NULL, *res = NULL;
    int rc = -1, refused;
    if (jstr(rec, "token")) {
        J *p = jnew(J_OBJ); jset(p, "resume_token", jstrv(jstr(rec, "token"))); jset(p, "wait_s", jnum(0));
        res = req("call.resume", p, &msg, &refused);
        if (!res && !refused) { rc = STOPPED; goto out; }
        if (!res) { jdel(rec, "token"); save(); }
    } else if (jget(rec, "sent")) {
        res = lookup(op, refk, refv, &msg);
        if (!res) { rc = STOPPED; goto out; }
    }
    for (;;) {
        if (!res) {
            if (num(rec, "attempts", 0) >= 3 || left() <= 0.2) { rc = FAILED; break; }
            jset(rec, "sent", jnew(J_BOOL)); jget(rec, "sent")->n = 1;
            jset(rec, "attempts", jnum(num(rec, "attempts", 0) + 1)); save();
            if (msg) { jfree(msg); msg = NULL; }
            J *p = jnew(J_OBJ); jset(p, "operation", jstrv(op)); jset(p, "params", jcopy(params));
            jset(p, "idempotency_key", jstrv(key)); jset(p, "wait_s", jnum(0));
            res = req("call", p, &msg, &refused);
            if (!res) { rc = refused ? FAILED : STOPPED; break; }
        }
        const char *cat = jstr(res, "category") ? jstr(res, "category") : "";
        const char *recon = jstr(res, "reconciled");
        const char *retry = jstr(res, "retry") ? jstr(res, "retry") : "";
        if (recon && !strcmp(cat, "success")) {                 /* a lookup answered (6) */
            if (!strcmp(recon, "found")) {
                J *cr = jget(jget(res, "data"), "created");
                J *first = cr && cr->t == J_ARR && cr->len ? cr->v[0] : NULL;
                jset(rec, "data", first && first->t == J_OBJ ? jcopy(first) : jnew(J_OBJ));
                jdel(rec, "token"); save(); rc = DONE; break;
            }
            if (!strcmp(recon, "not_found")) { res = NULL; continue; }
            if (!jget(res, "resume_token")) { stop("%s (%s): outcome unknown; a person must inspect it", op, id); rc = STOPPED; break; }
            cat = "approval_pending";
        } else if (recon && !strcmp(recon, "unknown") && strcmp(cat, "rate_limited") && strcmp(cat, "approval_pending")
                   && !retry_stops(res)) {
            if (!jget(res, "resume_token")) { stop("%s (%s): the lookup failed (%s); a person must inspect it", op, id, cat); rc = STOPPED; break; }
            cat = "approval_pending";
        }
        if (!strcmp(cat, "success")) {
            J *d = jget(res, "data");
            jset(rec, "data", d && d->t == J_OBJ ? jcopy(d) : jnew(J_OBJ));
            jdel(rec, "token"); save(); rc = DONE; break;
        }
        if (!strcmp(cat, "approval_pending")) {
            /* non-blocking: keep the token, poll with short resumes until it settles */
            char token[1024]; snprintf(token, sizeof token, "%s", jstr(res, "resume_token"));
            char owner[256]; snprintf(owner, sizeof owner, "%s", jstr(res, "owner") ? jstr(res, "owner") : "its owner");
            jset(rec, "token", jstrv(token)); save();
            J *nxt = NULL, *nmsg = NULL;
            for (;;) {
                if (left() <= 0.4) break;
                double w = left() - 0.4; if (w > 2.0) w = 2.0; if (w < 0) w = 0;
                J *p = jnew(J_OBJ); jset(p, "resume_token", jstrv(token)); jset(p, "wait_s", jnum((double)(int)(w * 100) / 100));
                if (nmsg) { jfree(nmsg); nmsg = NULL; }
                nxt = req("call.resume", p, &nmsg, &refused);
                if (!nxt) break;
                if (!jis(nxt, "category", "approval_pending")) break;
                nxt = NULL;
            }
            jfree(msg); msg = nmsg;
            if (nxt) { jdel(rec, "token"); save(); res = nxt; continue; }
            if (stopped) { rc = STOPPED; break; }
            if (msg && refused) { jdel(rec, "token"); save(); res = NULL; continue; }  /* forgotten: call again */
            snprintf(waiting_msg, sizeof waiting_msg, "%s (%s) awaits %s", op, id, owner);
            rc = WAITING; break;
        }
        if (retry_stops(res)) { stop("%s (%s) answered %s (retry: %s)", op, id, cat, retry); rc = STOPPED; break; }
        if (!strcmp(cat, "outcome_unknown")) {
            snprintf(refk, sizeof refk, "correlation_id");
            snprintf(refv, sizeof refv, "%s", jstr(res, "correlation_id") ? jstr(res, "correlation_id") : "");
            J *m2; res = lookup(op, refk, refv, &m2); jfree(msg); msg = m2;
            if (!res) { rc = STOPPED; break; }
            continue;
        }
        if (!strcmp(cat, "rate_limited")) {
            double after = num(res, "retry_after_s", 1.0);
            if (recon && !strcmp(recon, "unknown")) {
                if (after > left()) { stop("%s (%s): outcome unknown, no time to look it up again", op, id); rc = STOPPED; break; }
                nap(after);
                J *m2; res = lookup(op, refk, refv, &m2); jfree(msg); msg = m2;
                if (!res) { rc = STOPPED; break; }
                continue;
            }
            if (num(rec, "attempts", 0) >= 3 || after > left() - 0.3) { rc = FAILED; break; }
            nap(after); res = NULL; continue;
        }
        if (!strcmp(cat, "local_failure") || !strcmp(cat, "confirmed_failure")) {
            if (num(rec, "attempts", 0) >= 3) { rc = FAILED; break; }
            nap(0.2); res = NULL; continue;
        }
        if (!strcmp(cat, "vault_locked")) {
            for (;;) {
                J *m2; J *st = rpc("vault.status", jnew(J_OBJ), &m2, NULL);
                J *lk = jget(st, "locked");
                int locked = !st || !lk || lk->n;
                jfree(m2);
                if (!locked) break;
                if (left() < 0.5 || stopped) { stop("the vault stayed locked; %s (%s) not sent", op, id); break; }
                nap(0.3);
            }
            if (stopped) { rc = STOPPED; break; }
            res = NULL; continue;
        }
        stop("%s (%s) answered %s (%s)", op, id, cat, retry); rc = STOPPED; break;
    }
out:
    jfree(msg); jfree(params);
    return rc;
}

int main(void) {
    char *text = slurp(getenv("VAULTSIM_TASK"));
    if (!text) { printf("not done: no task file\n"); return 0; }
    task = jparse(text); free(text);
    deadline = num(task, "deadline", now() + 5);
    steps = jget(task, "steps");
    const char *sd = jstr(task, "state_dir");
    mkdir(sd, 0700);
    snprintf(state_path, sizeof state_path, "%s/rt45c-c.json", sd);
    char *st = slurp(state_path);
    state = st ? jparse(st) : NULL; free(st);
    if (!state || state->t != J_OBJ) { jfree(state); state = jnew(J_OBJ); }

    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", getenv("VAULTSIM_SOCKET"));
    for (double pause = 0.05;; pause = pause * 2 > 0.5 ? 0.5 : pause * 2) {
        fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0) break;
        int e = errno; close(fd);
        /* a full accept queue is not a missing vault: back off (3) */
        if (e != EAGAIN || now() + pause > deadline - 1) { printf("not done: cannot reach the vault (%s)\n", strerror(e)); return 0; }
        nap(pause);
    }
    J *p = jnew(J_OBJ), *client = jnew(J_OBJ), *msg;
    jset(p, "agent", jstrv(jstr(task, "agent"))); jset(p, "run_id", jstrv(jstr(task, "run_id")));
    jset(client, "name", jstrv("rt45c-c")); jset(client, "version", jstrv("45.0")); jset(p, "client", client);
    J *opened = rpc("session.open", p, &msg, NULL); jfree(p);
    if (!opened || !jstr(opened, "session_id")) { printf("not done: no session (%s)\n", stopped ? stop_why : "refused"); return 0; }
    session_id = strdup(jstr(opened, "session_id")); jfree(msg);

    int all_done = 1, waiting = 0;
    Buf undone = {0}; bput(&undone, "", 0);
    for (int i = 0; steps && i < steps->len && !stopped && !waiting; i++) {
        J *step = steps->v[i];
        const char *id = jstr(step, "id");
        if (outcome_of(id)) continue;
        int rc;
        if (refs_unmet(jget(step, "params"))) rc = FAILED;
        else rc = run_step(step);
        if (rc != DONE) { all_done = 0; bprintf(&undone, "%s%s", undone.n ? ", " : "", id); }
        if (rc == WAITING) waiting = 1;
    }
    for (int i = 0; steps && i < steps->len; i++) if (!outcome_of(jstr(steps->v[i], "id"))) all_done = 0;
    if (left() > -0.5) {
        J *cp = jnew(J_OBJ); jset(cp, "session_id", jstrv(session_id));
        stopped = 0; J *r = rpc("session.close", cp, &msg, NULL); (void)r; jfree(msg); jfree(cp);
    }
    close(fd);
    if (stop_why[0] && !all_done && !waiting) printf("not done: %s\n", stop_why);
    else if (all_done) printf("done: %d steps\n", steps ? steps->len : 0);
    else if (waiting) printf("waiting: %s (token kept in state_dir)\n", waiting_msg);
    else printf("not done: %s did not succeed\n", undone.b);
    return 0;
}
