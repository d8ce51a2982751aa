/* The TCP backend's data collectives (comm_tcp.h) on the ring comm_tcp.c forms: all-reduce is a
 * ring reduce-scatter then a ring all-gather (each rank sends and receives 2(W-1)/W of the buffer,
 * the bandwidth optimum), broadcast a pipeline of 1 MiB chunks along the ring. Every step sends to
 * the next rank while it receives from the previous one, under the deadline; a neighbour that
 * closes its connection (it stopped or died) is a failure named at once. The reduced values are the
 * same bits on every rank: each segment is reduced on one rank and then copied. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/util.h"
#include "zero/comm_tcp_link.h"

#define T zr_tcp

static int mod(int a) { return ((a % T.W) + T.W) % T.W; }

static _Noreturn void peer_closed(const zr_comm_desc *d, double t0, int peer, int err) {
    char why[256];
    if (err && err != EPIPE && err != ECONNRESET)
        snprintf(why, sizeof why, "the connection to rank %d failed: %s", peer, strerror(err));
    else
        snprintf(why, sizeof why, "rank %d closed its connection (it stopped, crashed or was killed)", peer);
    zr_tcp_fail(d, zr_tcp_now() - t0, why, -1);
}

/* Sends sn bytes to the next rank while receiving rn from the previous one. Both at once: a ring
 * of blocking sends would deadlock once a step is larger than the sockets' buffers. */
static void xfer(const void *sb, size_t sn, void *rb, size_t rn, const zr_comm_desc *d) {
    const char *s = sb;
    char *r = rb;
    double t0 = zr_tcp_now(), tmo = zr_watch_timeout(), limit = tmo > 0 ? t0 + tmo : 1e300, look_at = t0 + 0.1;
    while (sn || rn) {
        int moved = 0;
        if (sn) {
            ssize_t k = send(T.next, s, sn, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (k > 0) {
                s += k;
                sn -= (size_t)k;
                moved = 1;
            } else if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
                peer_closed(d, t0, mod(T.me + 1), errno);
        }
        if (rn) {
            ssize_t k = recv(T.prev, r, rn, MSG_DONTWAIT);
            if (k > 0) {
                r += k;
                rn -= (size_t)k;
                moved = 1;
            } else if (k == 0) peer_closed(d, t0, mod(T.me - 1), 0);
            else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) peer_closed(d, t0, mod(T.me - 1), errno);
        }
        if (moved || !(sn || rn)) continue;
        double t = zr_tcp_now();
        if (t >= limit) zr_tcp_fail(d, t - t0, NULL, rn ? mod(T.me - 1) : mod(T.me + 1));
        if (t >= look_at) { /* another rank's report, or the NCCL watchdog's */
            zr_watch_poll();
            look_at = t + 0.1;
        }
        struct pollfd pf[2];
        nfds_t n = 0;
        if (sn) pf[n++] = (struct pollfd){T.next, POLLOUT, 0};
        if (rn) pf[n++] = (struct pollfd){T.prev, POLLIN, 0};
        poll(pf, n, zr_tcp_ms(limit - t));
    }
}

#define REDUCE(type)                                                                                                   \
    do {                                                                                                               \
        type *a_ = acc;                                                                                                \
        const type *b_ = x;                                                                                            \
        if (op == ZR_RED_MAX)                                                                                          \
            for (int64_t i = 0; i < n; i++) a_[i] = b_[i] > a_[i] ? b_[i] : a_[i];                                     \
        else if (op == ZR_RED_MIN)                                                                                     \
            for (int64_t i = 0; i < n; i++) a_[i] = b_[i] < a_[i] ? b_[i] : a_[i];                                     \
        else                                                                                                           \
            for (int64_t i = 0; i < n; i++) a_[i] += b_[i];                                                            \
    } while (0)

/* acc (n,) = acc op x; AVG sums (the caller scales). */
static void reduce_into(void *acc, const void *x, int64_t n, zr_dtype dt, zr_reduce_op op) {
    switch (dt) {
    case ZR_F32: REDUCE(float); break;
    case ZR_F64: REDUCE(double); break;
    case ZR_I32: REDUCE(int32_t); break;
    case ZR_I64: REDUCE(int64_t); break;
    default: REDUCE(uint8_t); break;
    }
}
static zr_status check_dtype(const char *op, zr_dtype dt) {
    if (dt == ZR_F32 || dt == ZR_F64 || dt == ZR_I32 || dt == ZR_I64 || dt == ZR_U8) return ZR_OK;
    return zr_error("%s over TCP: dtype %s has no reduction here (f32, f64, i32, i64, u8; bf16/f16 go through f32)", op,
                    zr_dtype_name(dt));
}

/* Segment k of n elements split W ways (the first n % W get one more). */
static void segment(int64_t n, int k, int64_t *off, int64_t *len) {
    int64_t b = n / T.W, rem = n % T.W;
    *off = k * b + (k < rem ? k : rem);
    *len = b + (k < rem);
}

zr_status zr_tcp_all_reduce(void *buf, int64_t n, zr_dtype dt, zr_reduce_op op, const zr_comm_desc *d) {
    ZR_CHECK(check_dtype("all_reduce", dt));
    if (T.W < 2) return ZR_OK;
    size_t es = zr_dtype_size(dt);
    char *b = buf, *tmp = malloc((size_t)(n / T.W + 1) * es);
    if (!tmp) return zr_error("all_reduce over TCP: out of host memory (%lld bytes)", (long long)((n / T.W + 1) * (int64_t)es));
    int64_t so, sl, ro, rl;
    for (int s = 0; s < T.W - 1; s++) { /* reduce-scatter: rank r ends with segment r reduced */
        segment(n, mod(T.me - 1 - s), &so, &sl);
        segment(n, mod(T.me - 2 - s), &ro, &rl);
        xfer(b + so * (int64_t)es, (size_t)sl * es, tmp, (size_t)rl * es, d);
        reduce_into(b + ro * (int64_t)es, tmp, rl, dt, op);
    }
    for (int s = 0; s < T.W - 1; s++) { /* all-gather: pass the reduced segments around */
        segment(n, mod(T.me - s), &so, &sl);
        segment(n, mod(T.me - 1 - s), &ro, &rl);
        xfer(b + so * (int64_t)es, (size_t)sl * es, b + ro * (int64_t)es, (size_t)rl * es, d);
    }
    free(tmp);
    return ZR_OK;
}

zr_status zr_tcp_reduce_scatter(void *out, const void *in, int64_t n, zr_dtype dt, zr_reduce_op op, const zr_comm_desc *d) {
    ZR_CHECK(check_dtype("reduce_scatter", dt));
    size_t bytes = (size_t)n * zr_dtype_size(dt);
    const char *src = in;
    if (T.W < 2) {
        memcpy(out, in, bytes);
        return ZR_OK;
    }
    /* block k of in, summed along the ring: the partial sum travels, `in` stays as it was */
    char *tmp = malloc(bytes ? 3 * bytes : 1), *acc[2] = {tmp + bytes, tmp + 2 * bytes};
    if (!tmp) return zr_error("reduce_scatter over TCP: out of host memory (%zu bytes)", 3 * bytes);
    const char *send = src + (size_t)mod(T.me - 1) * bytes;
    for (int s = 0; s < T.W - 1; s++) {
        xfer(send, bytes, tmp, bytes, d);
        char *dst = s == T.W - 2 ? out : acc[s & 1];
        memcpy(dst, src + (size_t)mod(T.me - 2 - s) * bytes, bytes);
        reduce_into(dst, tmp, n, dt, op);
        send = dst;
    }
    free(tmp);
    return ZR_OK;
}

zr_status zr_tcp_all_gather(void *out, const void *in, size_t bytes, const zr_comm_desc *d) {
    char *o = out;
    memmove(o + (size_t)T.me * bytes, in, bytes);
    for (int s = 0; s < T.W - 1; s++)
        xfer(o + (size_t)mod(T.me - s) * bytes, bytes, o + (size_t)mod(T.me - 1 - s) * bytes, bytes, d);
    return ZR_OK;
}

zr_status zr_tcp_broadcast(void *buf, size_t bytes, int root, const zr_comm_desc *d) {
    const size_t chunk = (size_t)1 << 20;
    char *b = buf;
    int pos = mod(T.me - root); /* along the chain root -> root+1 -> ... */
    int64_t nch = (int64_t)((bytes + chunk - 1) / chunk);
    for (int64_t i = 0; i <= nch && T.W > 1; i++) { /* send chunk i-1 (root: i) while chunk i comes */
        int64_t si = pos == 0 ? i : i - 1, ri = pos == 0 ? -1 : i;
        size_t sn = 0, rn = 0;
        if (pos < T.W - 1 && si >= 0 && si < nch) sn = bytes - (size_t)si * chunk < chunk ? bytes - (size_t)si * chunk : chunk;
        if (ri >= 0 && ri < nch) rn = bytes - (size_t)ri * chunk < chunk ? bytes - (size_t)ri * chunk : chunk;
        if (sn || rn) xfer(b + (sn ? si : 0) * (int64_t)chunk, sn, b + (rn ? ri : 0) * (int64_t)chunk, rn, d);
    }
    return ZR_OK;
}
