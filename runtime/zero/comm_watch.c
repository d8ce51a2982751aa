/* The deadline of every collective, the side channel that finds the ranks a stuck collective
 * waits for, and the debug-mode descriptor check (see comm_watch.h). The collectives themselves
 * are in comm.c (MPI) and comm_nccl.c.
 *
 * Arrival: each blocking MPI collective first all-reduces 16 bytes without blocking (a hash of
 * the call), polled against the deadline; that is where ranks wait for each other, and where a rank
 * calling something else shows. Asynchronous ones are polled the same way. Polling costs what
 * MPI_Wait does (it spins on MPI_Test too); the arrival step costs a barrier.
 *
 * Side channel: a duplicate of MPI_COMM_WORLD on which every rank keeps one receive posted for a
 * question. Nothing travels on it while collectives complete; a wait tests it each millisecond.
 * When a wait passes its deadline, the rank asks every other rank "where are you?"; ranks waiting
 * in a collective answer from their poll loop with the number of collectives they have issued and
 * the one they wait in; a rank that does not answer within the grace period is outside every
 * collective (computing, or stuck). The lowest rank that asks reports; the others defer to it. */
#include "zero/comm_watch.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ops/util.h"
#include "zero/comm_tcp.h"

enum { TAG_QUERY = 1, TAG_REPLY = 2 };

typedef struct {
    int64_t issued;   /* collectives this rank has issued */
    zr_comm_desc cur; /* the one it waits in */
} reply_t;

static double timeout_s = 1800; /* torch's default for CPU process groups: generous */
static int debug_mode;
static int64_t issued, cur_step = -1;
static char pending_label[sizeof ((zr_comm_desc *)0)->label];
static const zr_comm_desc *waiting_on; /* main thread: the collective it waits in now */
static int failing;                    /* main thread: inside zr_watch_fail */
static int queried_by = -1;            /* lowest rank that asked this rank where it is */
static double queried_at;

/* a failure posted by another thread (the NCCL watchdog), taken over by the main thread */
static pthread_mutex_t post_mu = PTHREAD_MUTEX_INITIALIZER;
static int posted, taken; /* __atomic */
static zr_comm_desc posted_desc;
static double posted_waited;
static char posted_why[512];
static pthread_t main_thread; /* the one that called zr_comm_init: the only one that calls MPI */

#ifdef ZR_HAVE_MPI
static MPI_Comm side = MPI_COMM_NULL;
static MPI_Request query_req = MPI_REQUEST_NULL;
static int64_t query_buf;
#endif

double zr_watch_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
double zr_watch_timeout(void) { return timeout_s; }
void zr_comm_set_timeout(double seconds) { timeout_s = seconds; }
double zr_comm_timeout(void) { return timeout_s; }
void zr_comm_set_step(int64_t step) { cur_step = step; }
int zr_comm_debug(void) { return debug_mode; }

void zr_comm_label(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pending_label, sizeof pending_label, fmt, ap);
    va_end(ap);
}

/* How long the asking rank waits for answers. */
double zr_watch_grace(void) {
    double g = timeout_s / 10;
    return timeout_s <= 0 ? 5 : g < 0.5 ? 0.5 : g > 10 ? 10 : g;
}

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* --- descriptors --- */

void zr_watch_desc(zr_comm_desc *d, zr_coll c, const zr_tensor *t, const zr_tensor *other, int arg) {
    memset(d, 0, sizeof *d);
    d->coll = c;
    d->arg = arg;
    d->step = cur_step;
    d->other = other ? zr_tensor_numel(other) : -1;
    d->dtype = t ? (int32_t)t->dtype : -1;
    d->device = t && !zr_is_cpu(t) ? zr_tensor_device(t).index : -1;
    if (t) {
        d->ndim = t->ndim;
        memcpy(d->shape, t->shape, sizeof(int64_t) * (size_t)t->ndim);
    }
    memcpy(d->label, pending_label, sizeof d->label);
    pending_label[0] = 0;
}

static const char *coll_name(int c) {
    static const char *names[] = {"?", "all_reduce", "reduce_scatter", "all_gather", "broadcast",
                                  "barrier", "all_gather_bytes", "NCCL communicator setup"};
    return c >= 0 && c <= ZR_COLL_NCCL_INIT ? names[c] : "?";
}

/* "all_reduce #2 (f32 (4,5), sum, grad bucket lm_head.weight, step 3)" */
void zr_watch_describe(char *buf, size_t n, const zr_comm_desc *d) {
    static const char *ops[] = {"sum", "avg", "max", "min"};
    int k = snprintf(buf, n, "%s #%lld (", coll_name(d->coll), (long long)d->seq);
#define PUT(...) (k += (size_t)k < n ? snprintf(buf + k, n - (size_t)k, __VA_ARGS__) : 0)
    if (d->coll == ZR_COLL_ALL_GATHER_BYTES) PUT("%lld bytes", (long long)d->shape[0]);
    else if (d->dtype >= 0) {
        PUT("%s (", zr_dtype_name((zr_dtype)d->dtype));
        for (int i = 0; i < d->ndim && i < ZR_MAX_DIMS; i++) PUT(i ? ",%lld" : "%lld", (long long)d->shape[i]);
        PUT(")");
        if (d->other >= 0) PUT(d->coll == ZR_COLL_ALL_GATHER ? " into %lld" : " from %lld", (long long)d->other);
    }
    if ((d->coll == ZR_COLL_ALL_REDUCE || d->coll == ZR_COLL_REDUCE_SCATTER) && d->arg >= 0 && d->arg < 4)
        PUT(", %s", ops[d->arg]);
    if (d->coll == ZR_COLL_BROADCAST) PUT(", root %d", d->arg);
    if (d->device >= 0) PUT(", cuda:%d", d->device);
    if (d->label[0]) PUT(", %.*s", (int)sizeof d->label, d->label);
    if (d->step >= 0) PUT(", step %lld", (long long)d->step);
    PUT(")");
#undef PUT
    if (buf[0] && k > 0 && (size_t)k >= n && n > 4) strcpy(buf + n - 4, "...");
}

int zr_watch_same(const zr_comm_desc *a, const zr_comm_desc *b) {
    if (a->seq != b->seq || a->coll != b->coll || a->dtype != b->dtype || a->ndim != b->ndim ||
        a->arg != b->arg || a->other != b->other || (a->device >= 0) != (b->device >= 0))
        return 0;
    for (int i = 0; i < a->ndim && i < ZR_MAX_DIMS; i++)
        if (a->shape[i] != b->shape[i]) return 0;
    return 1;
}

/* "rank 1" / "ranks 1,3-5" (the first 16 runs, then "..."). */
void zr_watch_ranks_str(char *buf, size_t n, const int *r, int k) {
    int p = snprintf(buf, n, k == 1 ? "rank " : "ranks "), runs = 0;
    for (int i = 0; i < k && (size_t)p < n; runs++) {
        int j = i;
        while (j + 1 < k && r[j + 1] == r[j] + 1) j++;
        if (runs == 16) {
            snprintf(buf + p, n - (size_t)p, ",... (%d ranks)", k);
            return;
        }
        p += j > i ? snprintf(buf + p, n - (size_t)p, "%s%d-%d", i ? "," : "", r[i], r[j])
                   : snprintf(buf + p, n - (size_t)p, "%s%d", i ? "," : "", r[i]);
        i = j + 1;
    }
}

/* --- side channel --- */

void zr_watch_poll(void) {
    if (zr_comm_get()->tcp) zr_tcp_poll();
#ifdef ZR_HAVE_MPI
    while (query_req != MPI_REQUEST_NULL) {
        int done = 0;
        MPI_Status s;
        if (MPI_Test(&query_req, &done, &s) != MPI_SUCCESS || !done) break;
        if (queried_by < 0 || s.MPI_SOURCE < queried_by) queried_by = s.MPI_SOURCE;
        queried_at = zr_watch_now();
        /* The job stops soon: each answer gets its own buffer, never freed, so no send can
         * overwrite one still in flight. */
        reply_t *a = calloc(1, sizeof *a);
        if (a) {
            a->issued = issued;
            if (waiting_on) a->cur = *waiting_on;
            MPI_Request r;
            if (MPI_Isend(a, sizeof *a, MPI_BYTE, s.MPI_SOURCE, TAG_REPLY, side, &r) == MPI_SUCCESS)
                MPI_Request_free(&r);
        }
        MPI_Irecv(&query_buf, 1, MPI_INT64_T, MPI_ANY_SOURCE, TAG_QUERY, side, &query_req);
    }
#endif
    zr_watch_take_over();
}

void zr_watch_take_over(void) {
    if (failing || !__atomic_load_n(&posted, __ATOMIC_ACQUIRE) || !pthread_equal(pthread_self(), main_thread)) return;
    __atomic_store_n(&taken, 1, __ATOMIC_RELEASE);
    zr_watch_fail(&posted_desc, posted_waited, posted_why[0] ? posted_why : NULL);
}

#ifdef ZR_HAVE_MPI
/* Another rank asked first and reports: answer questions until its abort arrives. */
static void defer_until(double end) {
    while (zr_watch_now() < end) {
        zr_watch_poll();
        sleep_s(1e-3);
    }
}

/* Asks every rank where it is (seq k is the collective this rank waits in) and writes what is
 * known about those that have not arrived into out ("" when every rank answered from #k). */
static void ask(const zr_comm_desc *d, char *out, size_t n) {
    const zr_comm_info *in = zr_comm_get();
    int W = in->world_size, me = in->rank;
    /* GPU ranks answer once their own watchdog has freed their main thread: give them longer */
    double grace = zr_watch_grace() + (d->device >= 0 ? 5 : 0);
    zr_watch_poll();
    if (queried_by >= 0 && queried_by < me) defer_until(queried_at + 3 * grace + 1);
    static int64_t k;
    k = d->seq;
    reply_t *rep = calloc((size_t)W, sizeof *rep);
    MPI_Request *rq = calloc((size_t)W, sizeof *rq);
    int *got = calloc((size_t)W, sizeof *got), *idx = calloc((size_t)W, sizeof *idx);
    if (!rep || !rq || !got || !idx) {
        snprintf(out, n, "; out of host memory while asking the other ranks");
        return;
    }
    for (int r = 0; r < W; r++) {
        rq[r] = MPI_REQUEST_NULL;
        if (r == me) continue;
        MPI_Request s;
        if (MPI_Isend(&k, 1, MPI_INT64_T, r, TAG_QUERY, side, &s) == MPI_SUCCESS) MPI_Request_free(&s);
        MPI_Irecv(&rep[r], sizeof *rep, MPI_BYTE, r, TAG_REPLY, side, &rq[r]);
    }
    int left = W - 1;
    double end = zr_watch_now() + grace;
    while (left > 0 && zr_watch_now() < end) {
        int cnt = 0;
        if (MPI_Testsome(W, rq, &cnt, idx, MPI_STATUSES_IGNORE) != MPI_SUCCESS || cnt == MPI_UNDEFINED) break;
        for (int i = 0; i < cnt; i++) got[idx[i]] = 1;
        left -= cnt;
        zr_watch_poll();
        if (queried_by >= 0 && queried_by < me && queried_at + 3 * grace + 1 > end) end = queried_at + 3 * grace + 1;
        if (!cnt) sleep_s(2e-4);
    }
    /* not arrived: no answer, or fewer collectives issued; arrived but in a different collective */
    int *silent = idx, ns = 0, nb = 0, nm = 0;
    char behind[1024] = "", other[1024] = "", what[320], rs[160];
    for (int r = 0; r < W; r++) {
        if (r == me) continue;
        if (!got[r]) {
            silent[ns++] = r;
            continue;
        }
        int late = rep[r].issued < k;
        if (!late && !(rep[r].cur.seq == k && !zr_watch_same(&rep[r].cur, d))) continue;
        char *b = late ? behind : other;
        size_t len = strlen(b);
        if ((late ? nb++ : nm++) >= 4) continue;
        zr_watch_describe(what, sizeof what, &rep[r].cur);
        if (late)
            snprintf(b + len, sizeof behind - len, "%srank %d (waits in %s)", len ? ", " : "", r,
                     rep[r].cur.seq ? what : "no collective");
        else
            snprintf(b + len, sizeof other - len, "; rank %d calls %s instead", r, what);
    }
    int p = 0;
    if (ns || nb) {
        p += snprintf(out + p, n - (size_t)p, "; not arrived: ");
        if (ns) {
            zr_watch_ranks_str(rs, sizeof rs, silent, ns);
            p += snprintf(out + p, n - (size_t)p, "%s (no answer within %.1f s: busy outside any collective, stuck, or exited)%s",
                          rs, grace, nb ? ", " : "");
        }
        if (nb && (size_t)p < n) p += snprintf(out + p, n - (size_t)p, "%s%s", behind, nb > 4 ? ", ..." : "");
    } else
        p += snprintf(out + p, n - (size_t)p, "; every rank has arrived");
    if (nm && (size_t)p < n) snprintf(out + p, n - (size_t)p, "%s%s", other, nm > 4 ? "; ..." : "");
}
#endif

void zr_watch_line(char *line, size_t n, const zr_comm_desc *d, double waited, const char *why, const char *tail) {
    char what[320];
    zr_watch_describe(what, sizeof what, d);
    if (why)
        snprintf(line, n, "comm error: %s failed after %.1f s: %s%s; stopping all ranks", what, waited, why, tail);
    else
        snprintf(line, n, "comm timeout: %s did not complete within %g s (ZRUN_COMM_TIMEOUT)%s; stopping all ranks",
                 what, timeout_s, tail);
}

_Noreturn void zr_watch_fail(const zr_comm_desc *d, double waited, const char *why) {
    failing = 1;
    if (zr_comm_get()->tcp) zr_tcp_fail(d, waited, why, -1);
    char tail[3072] = "", line[4096];
#ifdef ZR_HAVE_MPI
    if (side != MPI_COMM_NULL) ask(d, tail, sizeof tail);
#endif
    zr_watch_line(line, sizeof line, d, waited, why, tail);
    zr_comm_abort(line, 1);
    abort(); /* zr_comm_abort does not return */
}

_Noreturn void zr_watch_fail_alone(const zr_comm_desc *d, double waited, const char *why) {
    char what[320], line[1024];
    zr_watch_describe(what, sizeof what, d);
    snprintf(line, sizeof line, "comm %s: %s %s after %.1f s%s%s (this rank's main thread did not come back to a "
             "collective, so the other ranks were not asked); stopping all ranks", why ? "error" : "timeout", what,
             why ? "failed" : "did not complete", waited, why ? ": " : "", why ? why : "");
    zr_comm_abort(line, 1);
    abort();
}

int zr_watch_post(const zr_comm_desc *d, double waited, const char *why, double patience) {
    pthread_mutex_lock(&post_mu);
    if (!__atomic_load_n(&posted, __ATOMIC_ACQUIRE)) {
        posted_desc = *d;
        posted_waited = waited;
        snprintf(posted_why, sizeof posted_why, "%s", why ? why : "");
        __atomic_store_n(&posted, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&post_mu);
    for (double end = zr_watch_now() + patience; zr_watch_now() < end;) {
        if (__atomic_load_n(&taken, __ATOMIC_ACQUIRE)) return 1;
        sleep_s(0.01);
    }
    return __atomic_load_n(&taken, __ATOMIC_ACQUIRE);
}

/* --- debug mode: every rank's descriptor before each collective --- */

int zr_watch_mismatch(char *line, size_t n, const zr_comm_desc *all, int W) {
    int *grp = malloc(sizeof *grp * (size_t)W), *first = malloc(sizeof *first * (size_t)W),
        *cnt = calloc((size_t)W, sizeof *cnt), *members = malloc(sizeof *members * (size_t)W);
    if (!grp || !first || !cnt || !members) zr_comm_abort("comm check: out of host memory", 1);
    int ng = 0, ref = 0;
    for (int q = 0; q < W; q++) { /* group the ranks by what they call */
        int g = 0;
        while (g < ng && !zr_watch_same(&all[first[g]], &all[q])) g++;
        if (g == ng) first[ng++] = q;
        grp[q] = g;
        if (++cnt[g] > cnt[ref]) ref = g;
    }
    if (ng > 1) {
        char what[320], rs[160];
        int p = snprintf(line, n, "comm mismatch: collective #%lld differs between ranks: ", (long long)all[0].seq);
        for (int g = 0, shown = 0; g < ng && (size_t)p < n; g++) {
            if (g == ref) continue;
            if (shown++ == 4) {
                p += snprintf(line + p, n - (size_t)p, "..., ");
                break;
            }
            int k = 0;
            for (int q = 0; q < W; q++)
                if (grp[q] == g) members[k++] = q;
            zr_watch_ranks_str(rs, sizeof rs, members, k);
            zr_watch_describe(what, sizeof what, &all[first[g]]);
            p += snprintf(line + p, n - (size_t)p, "%s call%s %s, ", rs, k == 1 ? "s" : "", what);
        }
        int k = 0;
        for (int q = 0; q < W; q++)
            if (grp[q] == ref) members[k++] = q;
        zr_watch_ranks_str(rs, sizeof rs, members, k);
        zr_watch_describe(what, sizeof what, &all[first[ref]]);
        if ((size_t)p < n) snprintf(line + p, n - (size_t)p, "but %s call%s %s; stopping all ranks", rs, k == 1 ? "s" : "", what);
    }
    free(grp);
    free(first);
    free(cnt);
    free(members);
    return ng > 1;
}

static void debug_check(const zr_comm_desc *d) {
    const zr_comm_info *in = zr_comm_get();
    int W = in->world_size;
    if (in->tcp) { /* the TCP arrival compares every rank's whole descriptor */
        if (zr_tcp_arrive(d)) zr_comm_abort(zr_last_error_message(), 1);
        return;
    }
#ifdef ZR_HAVE_MPI
    if (!in->mpi || W < 2) return;
    zr_comm_desc *all = malloc(sizeof *all * (size_t)W);
    MPI_Request r;
    if (!all || MPI_Iallgather(d, sizeof *d, MPI_BYTE, all, sizeof *d, MPI_BYTE, MPI_COMM_WORLD, &r) != MPI_SUCCESS)
        zr_comm_abort("ZRUN_COMM_DEBUG: could not gather the collectives' descriptors (out of memory or MPI error)", 1);
    if (zr_watch_mpi(&r, d)) zr_comm_abort(zr_last_error_message(), 1);
    char line[4096];
    if (zr_watch_mismatch(line, sizeof line, all, W)) {
        /* every rank holds the same table: rank 0 speaks, the others wait for its abort */
        if (in->rank != 0) sleep_s(3 * zr_watch_grace() + 1);
        zr_comm_abort(line, 1);
    }
    free(all);
#else
    (void)d;
    (void)W;
#endif
}

static zr_comm_desc last;
const zr_comm_desc *zr_watch_last(void) { return &last; }

void zr_watch_issue(zr_comm_desc *d) {
    d->seq = ++issued;
    last = *d;
    if (__atomic_load_n(&posted, __ATOMIC_ACQUIRE)) zr_watch_take_over();
    if (debug_mode) debug_check(d);
}

/* --- waiting --- */

#ifdef ZR_HAVE_MPI
zr_status zr_watch_mpi(MPI_Request *req, const zr_comm_desc *d) {
    int done = 0, rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
    if (rc == MPI_SUCCESS && !done) {
        const zr_comm_desc *outer = waiting_on;
        waiting_on = d;
        double t0 = zr_watch_now(), side_at = t0 + 1e-3, limit = timeout_s > 0 ? t0 + timeout_s : 1e300;
        while ((rc = MPI_Test(req, &done, MPI_STATUS_IGNORE)) == MPI_SUCCESS && !done) {
            double t = zr_watch_now();
            if (t >= side_at) {
                zr_watch_poll();
                side_at = t + 1e-3;
            }
            if (t >= limit) zr_watch_fail(d, t - t0, NULL);
        }
        waiting_on = outer;
    }
    if (rc == MPI_SUCCESS) return ZR_OK;
    char s[MPI_MAX_ERROR_STRING], what[320];
    int n = 0;
    MPI_Error_string(rc, s, &n);
    zr_watch_describe(what, sizeof what, d);
    return zr_error("%s failed on rank %d: %s", what, zr_comm_get()->rank, s);
}
#endif

/* --- arrival: every blocking CPU collective starts here --- */

#ifdef ZR_HAVE_MPI
/* FNV-1a over what zr_watch_same() compares. */
static uint64_t desc_hash(const zr_comm_desc *d) {
    int64_t v[6 + ZR_MAX_DIMS] = {d->seq, d->coll, d->dtype, d->arg, d->other, d->device >= 0};
    int k = 6;
    for (int i = 0; i < d->ndim && i < ZR_MAX_DIMS; i++) v[k++] = d->shape[i];
    uint64_t h = 1469598103934665603ull;
    const unsigned char *p = (const unsigned char *)v;
    for (size_t i = 0; i < sizeof(int64_t) * (size_t)k; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

/* One 16-byte non-blocking all-reduce, polled against the deadline, costs what a barrier does
 * (+0.5 us on 2 ranks of one host) and checks that every rank calls the same collective: the
 * maximum of {h, ~h} equals this rank's pair only when every rank's h is the same. All ranks then
 * see a difference together, and the descriptor all-gather names it. */
static zr_status mpi_arrive(const zr_comm_desc *d) {
    uint64_t h = desc_hash(d), mine[2] = {h, ~h}, all[2];
    MPI_Request r;
    int rc = MPI_Iallreduce(mine, all, 2, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD, &r);
    if (rc != MPI_SUCCESS) return zr_error("%s: MPI_Iallreduce failed on rank %d", coll_name(d->coll), zr_comm_get()->rank);
    ZR_CHECK(zr_watch_mpi(&r, d));
    if (all[0] != mine[0] || all[1] != mine[1]) {
        debug_check(d); /* stops every rank, naming the difference */
        zr_comm_abort("the ranks disagree on a collective (ZRUN_COMM_DEBUG=1 names each one)", 1);
    }
    return ZR_OK;
}
#endif

zr_status zr_watch_arrive(const zr_comm_desc *d) {
    if (zr_comm_get()->tcp) return debug_mode ? ZR_OK : zr_tcp_arrive(d); /* in debug mode zr_watch_issue arrived */
#ifdef ZR_HAVE_MPI
    return mpi_arrive(d);
#else
    return ZR_OK;
#endif
}

/* --- set-up --- */

static zr_status read_env(void) {
    const char *v = getenv("ZRUN_COMM_TIMEOUT"), *m = getenv("DEEPSPEED_TIMEOUT"), *name = "ZRUN_COMM_TIMEOUT";
    double scale = 1;
    if (!(v && *v) && m && *m) { /* DeepSpeed's variable, in minutes */
        v = m;
        name = "DEEPSPEED_TIMEOUT";
        scale = 60;
    }
    if (v && *v) {
        char *end;
        double x = strtod(v, &end);
        /* (a negative number would silently mean no deadline, as 0 does: refused, so a sign typo is seen) */
        if (end == v || *end || x != x || x < 0)
            return zr_error("%s must be a number of %s >= 0 (0: no deadline), got '%s'", name,
                            scale == 1 ? "seconds" : "minutes", v);
        timeout_s = x * scale;
    }
    const char *dbg = getenv("ZRUN_COMM_DEBUG");
    debug_mode = dbg && *dbg && strcmp(dbg, "0") != 0;
    return ZR_OK;
}

zr_status zr_watch_init(void) {
    main_thread = pthread_self();
    ZR_CHECK(read_env());
#ifdef ZR_HAVE_MPI
    const zr_comm_info *in = zr_comm_get();
    if (!in->mpi || in->world_size < 2 || side != MPI_COMM_NULL) return ZR_OK;
    if (MPI_Comm_dup(MPI_COMM_WORLD, &side) != MPI_SUCCESS) return zr_error("MPI_Comm_dup failed");
    MPI_Comm_set_errhandler(side, MPI_ERRORS_RETURN);
    if (MPI_Irecv(&query_buf, 1, MPI_INT64_T, MPI_ANY_SOURCE, TAG_QUERY, side, &query_req) != MPI_SUCCESS)
        return zr_error("posting the collectives' side channel failed");
    /* A rank in debug mode all-gathers before each collective: every rank must agree on it. */
    int mine = debug_mode, *all = malloc(sizeof *all * (size_t)in->world_size);
    zr_comm_desc d;
    zr_watch_desc(&d, ZR_COLL_ALL_GATHER_BYTES, NULL, NULL, 0);
    d.ndim = 1;
    d.shape[0] = sizeof mine;
    snprintf(d.label, sizeof d.label, "ZRUN_COMM_DEBUG agreement");
    MPI_Request r;
    if (!all || MPI_Iallgather(&mine, 1, MPI_INT, all, 1, MPI_INT, side, &r) != MPI_SUCCESS || zr_watch_mpi(&r, &d)) {
        free(all);
        return zr_error("comm init: gathering ZRUN_COMM_DEBUG from every rank failed");
    }
    for (int q = 1; q < in->world_size; q++)
        if (all[q] != all[0]) {
            int first = all[0];
            free(all);
            return zr_error("ZRUN_COMM_DEBUG is %s for rank 0 but %s for rank %d: set it for every rank (mpirun -x "
                            "ZRUN_COMM_DEBUG=1)", first ? "on" : "off", first ? "off" : "on", q);
        }
    free(all);
#endif
    return ZR_OK;
}

void zr_watch_finalize(void) {
#ifdef ZR_HAVE_MPI
    if (query_req != MPI_REQUEST_NULL) {
        MPI_Cancel(&query_req);
        MPI_Wait(&query_req, MPI_STATUS_IGNORE);
    }
    if (side != MPI_COMM_NULL) MPI_Comm_free(&side);
#endif
}
