/* Host side of the ZeRO engine with the master partition on the CPU (see offload.h for the
 * design): gradient intake from device buckets through a copy stream and pinned staging, lazy
 * zeroing of the host gradient partition, and the step's chunk pipeline (ring of pinned slots:
 * D2H gradients, CPU optimizer, H2D weights). The CUDA parts run only for parameters on a GPU;
 * a CPU run uses the same bookkeeping with memcpy. */
#include "zero/offload.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/cpu/offload.h"
#include "ops/optim.h"
#include "ops/util.h"
#ifdef ZR_HAVE_CUDA
#include "cuda/device.h"
#endif

#define RING 3 /* pipeline slots: one landing, one being updated, one going back */

/* A gradient copy parked in the staging buffer, to be added into gpart[goff : goff+len]. */
typedef struct {
    int64_t goff, soff, len;
    zr_dtype dt;
    int overwrite;
} pending;

struct zr_offload {
    zr_offload *next; /* registry of live states (zr_offload_find) */
    zr_tensor *gpart; /* f32, bf16 or f16 (S, gdt: data_types.grad_accum_dtype), host, retained */
    char *g;
    zr_dtype gdt;
    size_t ges; /* bytes of a gpart element */
    int64_t S, cap;
    zr_device dev;
    zr_dtype pdt;
    int n;
    zr_offload_segment *segs;
    offload_adamw_piece *pieces; /* one chunk's AdamW pieces (n), for offload_adamw_pieces_cpu */
    int stream;                  /* ZRUN_OFFLOAD_STREAM: new weights with streaming stores (default 1) */
    unsigned char *fresh; /* per segment: its gpart range is logically zero but not yet written */
    int lazy, pinned;
    zr_tensor *stage; /* host staging for D2H copies: >= cap f32 elements; slot = bucket offset */
    int stage_pinned;
    pending *pend;
    int npend, pend_cap;
    int64_t hiwater;  /* end (bytes) of the highest staging slot in use since the last drain */
    /* the step's ring: RING slots of `chunk` elements; in: gradients (any dtype, f32-sized),
     * out: new weights (pdt) */
    int64_t chunk;
    zr_tensor *ring_in, *ring_out;
    int in_pinned, out_pinned;
    const char *mode; /* "device" or "host" gradients (the engine's choice) */
#ifdef ZR_HAVE_CUDA
    cudaStream_t copy, up;       /* D2H gradients; H2D weights; both beside the compute stream */
    cudaEvent_t ready, d2h, done; /* compute -> copy ordering; last gradient D2H; last upload */
    cudaEvent_t mark;             /* zr_offload_mark's point of the compute stream, when marked */
    int marked;
    cudaEvent_t fetched[RING], uploaded[RING]; /* per ring slot: its D2H landed; its H2D read it */
    int d2h_busy, up_busy[RING];
#endif
    /* ZRUN_OFFLOAD_PROFILE: host milliseconds since the last optimizer step */
    int profile;
    double t_add, t_wait, t_accum, t_zero, t_norm, t_fetch, t_adam, t_put, t_slot, t_up, t_step;
    int64_t d2h_bytes, n_d2h, fetch_bytes, up_bytes, steps;
};

static zr_offload *registry;

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* A host buffer of n elements, page-locked when pin (CUDA builds). */
static zr_tensor *host_buf(zr_dtype dt, int64_t n, zr_mem_category cat, int pin, int *pinned) {
    zr_tensor *t = zr_tensor_new_cat(dt, zr_cpu(), 1, &n, cat, 0);
    *pinned = 0;
#ifdef ZR_HAVE_CUDA
    if (t && pin && t->storage->nbytes) {
        if (zr_cuda_page_lock(t->storage->data, t->storage->nbytes, "offload_optimizer.pin_memory",
                              "an offload buffer")) {
            zr_tensor_release(t);
            return NULL;
        }
        *pinned = 1;
    }
#else
    (void)pin;
#endif
    return t;
}

static void host_buf_free(zr_tensor *t, int pinned) {
#ifdef ZR_HAVE_CUDA
    if (t && pinned) cudaHostUnregister(t->storage->data);
#else
    (void)pinned;
#endif
    zr_tensor_release(t);
}

zr_offload *zr_offload_new(int64_t S, zr_tensor *gpart, zr_device dev, zr_dtype pdt, int n,
                           const zr_offload_segment *segs, int64_t cap, int pinned, int lazy) {
    if (gpart && (!zr_is_cpu(gpart) || !zr_tensor_is_contiguous(gpart) || zr_tensor_numel(gpart) != S ||
                  (gpart->dtype != ZR_F32 && gpart->dtype != ZR_BF16 && gpart->dtype != ZR_F16)))
        return zr_error_null("ZeRO offload: the gradient partition must be a contiguous f32, bf16 or f16 host tensor "
                             "of %lld elements", (long long)S);
    if (pdt != ZR_F32 && pdt != ZR_BF16 && pdt != ZR_F16)
        return zr_error_null("ZeRO offload: parameters must be f32, bf16 or f16, got %s", zr_dtype_name(pdt));
    int64_t chunk = 1 << 24;
    const char *ce = getenv("ZRUN_OFFLOAD_CHUNK");
    if (ce && *ce) {
        char *end;
        long long v = strtoll(ce, &end, 10);
        if (*end || v < 1)
            return zr_error_null("ZRUN_OFFLOAD_CHUNK must be a positive number of elements per offload pipeline "
                                 "chunk, got \"%s\"; unset it for the default (16777216)", ce);
        chunk = v;
    }
    const char *se = getenv("ZRUN_OFFLOAD_STREAM");
    if (se && *se && strcmp(se, "0") != 0 && strcmp(se, "1") != 0)
        return zr_error_null("ZRUN_OFFLOAD_STREAM must be 1 (write the new weights with streaming stores) or 0 "
                             "(normal stores), got \"%s\"; unset it for the default (1)", se);
    zr_offload *o = calloc(1, sizeof *o);
    if (!o) return zr_error_null("out of host memory");
    o->segs = malloc(sizeof *o->segs * (size_t)(n > 0 ? n : 1));
    o->fresh = calloc((size_t)(n > 0 ? n : 1), 1);
    o->pieces = malloc(sizeof *o->pieces * (size_t)(n > 0 ? n : 1));
    o->pend_cap = n > 16 ? n : 16;
    o->pend = malloc(sizeof *o->pend * (size_t)o->pend_cap);
    if (!o->segs || !o->fresh || !o->pend || !o->pieces) {
        zr_offload_free(o);
        return zr_error_null("out of host memory");
    }
    memcpy(o->segs, segs, sizeof *o->segs * (size_t)n);
    o->n = n;
    o->gpart = gpart ? zr_tensor_retain(gpart) : NULL;
    o->g = gpart ? zr_tensor_data(gpart) : NULL;
    o->gdt = gpart ? gpart->dtype : ZR_F32;
    o->ges = zr_dtype_size(o->gdt);
    o->S = S;
    o->cap = cap;
    o->dev = dev;
    o->pdt = pdt;
    o->pinned = pinned;
    o->lazy = lazy;
    o->stream = !(se && strcmp(se, "0") == 0);
    o->chunk = chunk < S ? chunk : S > 0 ? S : 1;
    o->mode = gpart ? "host" : "device";
    const char *e = getenv("ZRUN_OFFLOAD_PROFILE");
    o->profile = e && *e && strcmp(e, "0") != 0;
    o->next = registry;
    registry = o;
    return o;
}

void zr_offload_free(zr_offload *o) {
    if (!o) return;
    for (zr_offload **p = &registry; *p; p = &(*p)->next)
        if (*p == o) {
            *p = o->next;
            break;
        }
#ifdef ZR_HAVE_CUDA
    if (o->copy) { /* never free or unpin buffers a copy still uses */
        zr_cuda_use(o->dev.index);
        cudaStreamSynchronize(o->copy);
        cudaStreamDestroy(o->copy);
    }
    if (o->up) {
        cudaStreamSynchronize(o->up);
        cudaStreamDestroy(o->up);
    }
    zr_cuda_event_free(o->ready);
    zr_cuda_event_free(o->d2h);
    zr_cuda_event_free(o->done);
    zr_cuda_event_free(o->mark);
    for (int k = 0; k < RING; k++) {
        zr_cuda_event_free(o->fetched[k]);
        zr_cuda_event_free(o->uploaded[k]);
    }
#endif
    host_buf_free(o->stage, o->stage_pinned);
    host_buf_free(o->ring_in, o->in_pinned);
    host_buf_free(o->ring_out, o->out_pinned);
    zr_tensor_release(o->gpart);
    free(o->segs);
    free(o->fresh);
    free(o->pieces);
    free(o->pend);
    free(o);
}

zr_offload *zr_offload_find(const zr_tensor *gpart) {
    for (zr_offload *o = registry; o; o = o->next)
        if (o->gpart == gpart) return o;
    return NULL;
}

#ifdef ZR_HAVE_CUDA
/* The copy and upload streams and their events, made on first use (on the parameters' device). */
static zr_status cuda_ready(zr_offload *o) {
    if (o->up) return ZR_OK;
    ZR_CHECK(zr_cuda_use(o->dev.index));
    if (!o->copy)
        ZR_CHECK(ZR_CUDA_CHECK(cudaStreamCreateWithFlags(&o->copy, cudaStreamNonBlocking), "ZeRO offload copy stream"));
    cudaEvent_t *evs[4 + 2 * RING] = {&o->ready, &o->d2h, &o->done, &o->mark};
    for (int k = 0; k < RING; k++) evs[4 + k] = &o->fetched[k], evs[4 + RING + k] = &o->uploaded[k];
    for (int k = 0; k < 4 + 2 * RING; k++)
        if (!*evs[k] && !(*evs[k] = zr_cuda_event_new(0))) return ZR_ERR;
    return ZR_CUDA_CHECK(cudaStreamCreateWithFlags(&o->up, cudaStreamNonBlocking), "ZeRO offload upload stream");
}

/* Orders the copy stream after everything queued so far on dev's compute stream. */
static zr_status after_compute(zr_offload *o, zr_device dev) {
    ZR_CHECK(zr_cuda_event_record(o->ready, zr_cuda_stream(dev)));
    return zr_cuda_stream_wait(o->copy, o->ready);
}
#endif

/* gpart[off : off+n] += src (n, src_dt), or = src when overwrite; a 16-bit gpart rounds each sum. */
static void accumulate(zr_offload *o, int64_t off, const void *src, zr_dtype src_dt, int64_t n, int overwrite) {
    if (o->gdt == ZR_F32) offload_accumulate_cpu((float *)o->g + off, src, src_dt, n, overwrite);
    else offload_accumulate16_cpu((uint16_t *)o->g + off, o->gdt, src, src_dt, n, overwrite);
}

/* gpart[off : off+n] = 0. */
static void zero_range(zr_offload *o, int64_t off, int64_t n) {
    if (o->gdt == ZR_F32) offload_fill_cpu((float *)o->g + off, n, 0);
    else memset(o->g + (size_t)off * o->ges, 0, (size_t)n * o->ges);
}

/* Waits for the gradient copies in flight and adds the staged ones into gpart. */
static zr_status drain(zr_offload *o) {
#ifdef ZR_HAVE_CUDA
    if (o->d2h_busy) {
        double t0 = now_ms();
        ZR_CHECK(zr_cuda_event_sync(o->d2h));
        o->d2h_busy = 0;
        o->t_wait += now_ms() - t0;
    }
#endif
    if (o->npend) {
        double t0 = now_ms();
        const char *st = zr_tensor_data(o->stage);
        for (int k = 0; k < o->npend; k++) {
            pending *p = &o->pend[k];
            accumulate(o, p->goff, st + (size_t)p->soff * zr_dtype_size(p->dt), p->dt, p->len, p->overwrite);
        }
        o->npend = 0;
        o->t_accum += now_ms() - t0;
    }
    o->hiwater = 0;
    return ZR_OK;
}

/* Writes the zeros of a segment still marked fresh. */
static void materialize(zr_offload *o, int k) {
    if (!o->fresh[k]) return;
    double t0 = now_ms();
    zero_range(o, o->segs[k].off, o->segs[k].n);
    o->fresh[k] = 0;
    o->t_zero += now_ms() - t0;
}

/* Before gpart[doff : doff+len] is written: 1 when it is exactly one fresh segment, which the
 * copy may then overwrite; else 0, after zeroing any fresh segment it touches. */
static int claim(zr_offload *o, int64_t doff, int64_t len) {
    int lo = 0, hi = o->n; /* first segment ending after doff (ends never decrease) */
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (o->segs[mid].off + o->segs[mid].n <= doff) lo = mid + 1;
        else hi = mid;
    }
    if (lo < o->n && o->segs[lo].off == doff && o->segs[lo].n == len && o->fresh[lo]) {
        o->fresh[lo] = 0;
        return 1;
    }
    for (int k = lo; k < o->n && o->segs[k].off < doff + len; k++) materialize(o, k);
    return 0;
}

#ifdef ZR_HAVE_CUDA
/* Staging of at least need f32 elements (cap on first use). Drains first when it must grow. */
static zr_status ensure_stage(zr_offload *o, int64_t need) {
    if (o->stage && zr_tensor_numel(o->stage) >= need) return ZR_OK;
    ZR_CHECK(drain(o));
    host_buf_free(o->stage, o->stage_pinned);
    o->stage = host_buf(ZR_F32, need > o->cap ? need : o->cap, ZR_MEM_COMM, o->pinned, &o->stage_pinned);
    return o->stage ? ZR_OK : ZR_ERR;
}

static zr_status push_pending(zr_offload *o, pending p) {
    if (o->npend == o->pend_cap) {
        pending *np = realloc(o->pend, sizeof *np * (size_t)o->pend_cap * 2);
        if (!np) return zr_error("out of host memory");
        o->pend = np;
        o->pend_cap *= 2;
    }
    o->pend[o->npend++] = p;
    return ZR_OK;
}

/* The device half of grad_add: async D2H into gpart (a fresh f32 segment) or into staging. */
static zr_status grad_add_cuda(zr_offload *o, int64_t doff, zr_tensor *src, int64_t soff, int ow) {
    zr_device sdev = zr_tensor_device(src);
    if (sdev.index != o->dev.index) return zr_error("ZeRO offload: gradient bucket on cuda:%d, parameters on cuda:%d", sdev.index, o->dev.index);
    int64_t len = zr_tensor_numel(src);
    size_t es = zr_dtype_size(src->dtype);
    const char *op = "ZeRO offload gradient copy to the host";
    ZR_CHECK(cuda_ready(o));
    ZR_CHECK(after_compute(o, sdev));
    if (ow && src->dtype == o->gdt) { /* first gradient of this step: straight into the partition */
        ZR_CHECK(ZR_CUDA_CHECK(cudaMemcpyAsync(o->g + (size_t)doff * es, zr_tensor_data(src), (size_t)len * es,
                                               cudaMemcpyDeviceToHost, o->copy), op));
    } else {
        int64_t lo = soff * (int64_t)es, hi = lo + len * (int64_t)es; /* the slot, in bytes */
        if (lo < o->hiwater) ZR_CHECK(drain(o)); /* it may still hold an earlier bucket's copy */
        ZR_CHECK(ensure_stage(o, (hi + 3) / 4));
        ZR_CHECK(push_pending(o, (pending){doff, soff, len, src->dtype, ow}));
        char *slot = (char *)zr_tensor_data(o->stage) + (size_t)soff * es;
        ZR_CHECK(ZR_CUDA_CHECK(cudaMemcpyAsync(slot, zr_tensor_data(src), (size_t)len * es, cudaMemcpyDeviceToHost,
                                               o->copy), op));
        if (hi > o->hiwater) o->hiwater = hi;
    }
    /* the bucket may be refilled (on the compute stream) once the copy has read it */
    ZR_CHECK(zr_cuda_event_record(o->d2h, o->copy));
    ZR_CHECK(zr_cuda_stream_wait(zr_cuda_stream(sdev), o->d2h));
    o->d2h_busy = 1;
    o->d2h_bytes += len * (int64_t)es;
    o->n_d2h++;
    /* pageable memory: nothing to overlap with, finish now */
    return o->pinned ? ZR_OK : drain(o);
}
#endif

zr_status zr_offload_grad_add(zr_offload *o, int64_t doff, zr_tensor *src, int64_t soff) {
    int64_t len = zr_tensor_numel(src);
    if (len <= 0) return ZR_OK;
    zr_dtype dt = src->dtype;
    if ((dt != ZR_F32 && dt != ZR_BF16 && dt != ZR_F16) || !zr_tensor_is_contiguous(src) || doff < 0 ||
        doff + len > o->S || soff < 0) {
        char b[192];
        return zr_error("ZeRO offload: cannot add %s (bucket offset %lld) into the gradient partition at %lld "
                        "(size %lld): expected a contiguous f32/bf16/f16 range inside it",
                        zr_tensor_describe(src, b), (long long)soff, (long long)doff, (long long)o->S);
    }
    if (!o->gpart) return zr_error("ZeRO offload: no host gradient partition (device-gradient mode)");
    double t0 = now_ms();
    int ow = claim(o, doff, len);
    zr_status st;
    if (zr_is_cpu(src)) {
        st = drain(o); /* keep the order of additions */
        if (!st) accumulate(o, doff, zr_tensor_data(src), dt, len, ow);
        o->t_accum += now_ms() - t0;
        return st;
    }
#ifdef ZR_HAVE_CUDA
    st = grad_add_cuda(o, doff, src, soff, ow);
    o->t_add += now_ms() - t0;
    return st;
#else
    return zr_no_cuda("ZeRO offload gradient copy");
#endif
}

zr_status zr_offload_grad_sync(zr_offload *o) {
    if (!o->gpart) return ZR_OK;
    ZR_CHECK(drain(o));
    for (int k = 0; k < o->n; k++) materialize(o, k);
    return ZR_OK;
}

zr_status zr_offload_grad_zero(zr_offload *o) {
    if (!o->gpart) return ZR_OK;
    ZR_CHECK(drain(o)); /* copies in flight land before their ranges are forgotten */
    if (o->lazy) {
        memset(o->fresh, 1, (size_t)o->n);
        return ZR_OK;
    }
    double t0 = now_ms();
    zero_range(o, 0, o->S);
    o->t_zero += now_ms() - t0;
    return ZR_OK;
}

zr_status zr_offload_sumsq(zr_offload *o, double *out) {
    if (!o->gpart) return zr_error("ZeRO offload: no host gradient partition (device-gradient mode)");
    ZR_CHECK(zr_offload_grad_sync(o));
    double t0 = now_ms();
    *out = offload_sumsq_cpu(o->g, o->gdt, o->S);
    o->t_norm += now_ms() - t0;
    return ZR_OK;
}

zr_status zr_offload_sumsq_tensor(zr_tensor *t, double *out) {
    zr_dtype dt = t->dtype;
    if (!zr_is_cpu(t) || !zr_tensor_is_contiguous(t) || (dt != ZR_F32 && dt != ZR_BF16 && dt != ZR_F16)) {
        char b[192];
        return zr_error("ZeRO offload: sum of squares of %s: expected a contiguous f32/bf16/f16 host tensor",
                        zr_tensor_describe(t, b));
    }
    *out = offload_sumsq_cpu(zr_tensor_data(t), dt, zr_tensor_numel(t));
    return ZR_OK;
}

void zr_offload_set_mode(zr_offload *o, const char *mode) { o->mode = mode; }

/* --- the step's pipeline --- */

/* The ring's host slots, made on first use (pinned when the partition is and a GPU is involved):
 * in-slots when the gradients come through the ring, out-slots when the new weights go out
 * through it (a sink), not when they are written in place. */
static zr_status ring_ready(zr_offload *o, int need_in, int need_out) {
    int pin = o->pinned && o->dev.type == ZR_CUDA;
    if (need_in && !o->ring_in) {
        o->ring_in = host_buf(ZR_F32, RING * o->chunk, ZR_MEM_COMM, pin, &o->in_pinned);
        if (!o->ring_in) return ZR_ERR;
    }
    if (need_out && !o->ring_out) {
        o->ring_out = host_buf(o->pdt, RING * o->chunk, ZR_MEM_COMM, pin, &o->out_pinned);
        if (!o->ring_out) return ZR_ERR;
    }
    return ZR_OK;
}

zr_status zr_offload_prepare(zr_offload *o) { return ring_ready(o, 1, 0); }

static char *slot_in(zr_offload *o, int k) { return (char *)zr_tensor_data(o->ring_in) + (size_t)k * o->chunk * 4; }
static char *slot_out(zr_offload *o, int k) {
    return (char *)zr_tensor_data(o->ring_out) + (size_t)k * o->chunk * zr_dtype_size(o->pdt);
}

/* Starts the copy of grads[a : a+n] into ring slot k: async D2H on the copy stream from a GPU,
 * memcpy from the host. */
static zr_status fetch(zr_offload *o, zr_tensor *grads, int k, int64_t a, int64_t n) {
    size_t es = zr_dtype_size(grads->dtype);
    const char *src = (const char *)zr_tensor_data(grads) + (size_t)a * es;
    o->fetch_bytes += n * (int64_t)es;
    if (zr_is_cpu(grads)) {
        memcpy(slot_in(o, k), src, (size_t)n * es);
        return ZR_OK;
    }
#ifdef ZR_HAVE_CUDA
    ZR_CHECK(ZR_CUDA_CHECK(cudaMemcpyAsync(slot_in(o, k), src, (size_t)n * es, cudaMemcpyDeviceToHost, o->copy),
                           "ZeRO offload gradient chunk copy to the host"));
    return zr_cuda_event_record(o->fetched[k], o->copy);
#else
    return zr_no_cuda("ZeRO offload gradient copy");
#endif
}

/* Waits until ring slot k's gradients have landed. */
static zr_status fetched(zr_offload *o, zr_tensor *grads, int k) {
#ifdef ZR_HAVE_CUDA
    if (!zr_is_cpu(grads)) {
        double t0 = now_ms();
        ZR_CHECK(zr_cuda_event_sync(o->fetched[k]));
        o->t_fetch += now_ms() - t0;
    }
#else
    (void)o, (void)grads, (void)k;
#endif
    return ZR_OK;
}

/* Waits until out slot k's last upload has read it. */
static zr_status out_free(zr_offload *o, int k) {
#ifdef ZR_HAVE_CUDA
    if (o->up_busy[k]) {
        double t0 = now_ms();
        ZR_CHECK(zr_cuda_event_sync(o->uploaded[k]));
        o->up_busy[k] = 0;
        o->t_slot += now_ms() - t0;
    }
#else
    (void)o, (void)k;
#endif
    return ZR_OK;
}

zr_status zr_offload_put(zr_offload *o, zr_tensor *dst, const void *src, int64_t n) {
    if (n <= 0) return ZR_OK;
    char b[192];
    if (dst->dtype != o->pdt || !zr_tensor_is_contiguous(dst) || zr_tensor_numel(dst) < n)
        return zr_error("ZeRO offload: cannot upload %lld %s weights into %s", (long long)n, zr_dtype_name(o->pdt),
                        zr_tensor_describe(dst, b));
    size_t bytes = (size_t)n * zr_dtype_size(o->pdt);
    o->up_bytes += (int64_t)bytes;
    if (zr_is_cpu(dst)) {
        memcpy(zr_tensor_data(dst), src, bytes);
        return ZR_OK;
    }
#ifdef ZR_HAVE_CUDA
    if (zr_tensor_device(dst).index != o->dev.index)
        return zr_error("ZeRO offload: weights for cuda:%d uploaded to %s", o->dev.index, zr_tensor_describe(dst, b));
    return ZR_CUDA_CHECK(cudaMemcpyAsync(zr_tensor_data(dst), src, bytes, cudaMemcpyHostToDevice, o->up),
                         "ZeRO offload weights copy to the device");
#else
    return zr_no_cuda("ZeRO offload weights copy");
#endif
}

/* The first segment that ends after partition element a (segments sorted, ends never decrease). */
static int first_segment(const zr_offload *o, int64_t a) {
    int lo = 0, hi = o->n;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (o->segs[mid].off + o->segs[mid].n <= a) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

void zr_offload_update(float *master, float *m, float *v, const void *g, zr_dtype g_dt, int64_t n, void *w,
                       zr_dtype w_dt, const zr_adamw_config *c, double lr, double wd, double grad_scale, int64_t step) {
    zr_adamw_config sc = *c;
    sc.lr = lr, sc.weight_decay = wd;
    if (sc.kind != ZR_OPTIM_ADAMW) { /* Lion, Adagrad, SGD: one segment, offsets relative to master */
        zr_adamw_segment seg = {0, n, (float)wd, (float)lr};
        float gs = (float)grad_scale;
        optim_step_cpu(master, m, w, w_dt, g, g_dt, &seg, 1, &sc, step, &gs);
    } else
        offload_adamw_cpu(master, m, v, g, g_dt, n, &sc, step, grad_scale, w, w_dt);
}

/* The AdamW pieces of chunk [a, a + n) into o->pieces: each segment's part of it, with its rate and
 * weight decay, offsets relative to a; returns how many. */
static int adamw_pieces(zr_offload *o, const zr_offload_pass *p, int64_t a, int64_t n) {
    int np = 0;
    for (int k = first_segment(o, a); k < o->n && o->segs[k].off < a + n; k++) {
        const zr_offload_segment *s = &o->segs[k];
        int64_t x = s->off > a ? s->off : a, y = s->off + s->n < a + n ? s->off + s->n : a + n;
        if (y > x) o->pieces[np++] = (offload_adamw_piece){x - a, y - x, p->lr[k], s->wd};
    }
    return np;
}

/* The optimizer on partition elements [a, a+n): master/m/v at a - base, gradients g (g_dt) and new
 * weights w (pdt, or NULL) relative to a; every segment that overlaps it, with its own lr and
 * weight decay. */
static zr_status update_chunk(zr_offload *o, const zr_offload_pass *p, int64_t a, int64_t n, const void *g,
                              zr_dtype g_dt, void *w) {
    size_t ge = zr_dtype_size(g_dt), we = zr_dtype_size(o->pdt);
    if (p->c->kind == ZR_OPTIM_LAMB) { /* each parameter's valid piece within the chunk */
        for (int k = first_segment(o, a); k < o->n && o->segs[k].off < a + n; k++) {
            const zr_adamw_segment *s = &p->lamb_segs[k];
            int64_t x = s->offset > a ? s->offset : a, y = s->offset + s->n < a + n ? s->offset + s->n : a + n;
            if (y <= x) continue;
            zr_adamw_segment piece = {0, y - x, s->weight_decay, s->lr};
            int64_t i = x - p->base;
            if (p->lamb == 1) {
                double sums[2];
                float gs = (float)p->grad_scale;
                lamb_sums_cpu(p->master + i, p->m + i, p->v + i, (const char *)g + (size_t)(x - a) * ge, g_dt, &piece,
                              1, p->c, &gs, sums);
                p->lamb_sums[2 * k] += sums[0], p->lamb_sums[2 * k + 1] += sums[1];
            } else
                lamb_apply_cpu(p->master + i, p->m + i, p->v + i, w ? (char *)w + (size_t)(x - a) * we : NULL, o->pdt,
                               &piece, 1, p->c, p->step, p->lamb_sums + 2 * k);
        }
        return ZR_OK;
    }
    if (p->master_dt != ZR_F32 || p->state_dt != ZR_F32) { /* bf16 master or moments: AdamW only */
        int np = adamw_pieces(o, p, a, n);
        size_t me = zr_dtype_size(p->master_dt), se = zr_dtype_size(p->state_dt);
        size_t at = (size_t)(a - p->base);
        if (p->c->kind != ZR_OPTIM_ADAMW || (w && o->pdt != p->master_dt) ||
            offload_adamw_lp_pieces_cpu((char *)p->master + at * me, p->master_dt, (char *)p->m + at * se,
                                        (char *)p->v + at * se, p->state_dt, g, g_dt, o->pieces, np, p->c, p->step,
                                        p->grad_scale, w))
            return zr_error("ZeRO offload: bf16 master weights or optimizer states need AdamW, a %s master and "
                            "parameters of the master's dtype", zr_dtype_name(p->master_dt));
        return ZR_OK;
    }
    if (p->c->kind == ZR_OPTIM_ADAMW) { /* every segment of the chunk in one parallel region */
        int np = adamw_pieces(o, p, a, n);
        offload_adamw_pieces_cpu(p->master + (a - p->base), p->m + (a - p->base), p->v + (a - p->base), g, g_dt,
                                 o->pieces, np, p->c, p->step, p->grad_scale, w, o->pdt, o->stream);
        return ZR_OK;
    }
    for (int k = first_segment(o, a); k < o->n && o->segs[k].off < a + n; k++) {
        const zr_offload_segment *s = &o->segs[k];
        int64_t x = s->off > a ? s->off : a, y = s->off + s->n < a + n ? s->off + s->n : a + n;
        if (y <= x) continue;
        int64_t i = x - p->base;
        zr_offload_update(p->master + i, p->m ? p->m + i : NULL, p->v ? p->v + i : NULL,
                          (const char *)g + (size_t)(x - a) * ge, g_dt, y - x,
                          w ? (char *)w + (size_t)(x - a) * we : NULL, o->pdt, p->c, p->lr[k], s->wd, p->grad_scale,
                          p->step);
    }
    return ZR_OK;
}

/* Checks a pass's arguments before anything is touched. */
static zr_status check_pass(zr_offload *o, const zr_offload_pass *p) {
    if (p->lo < 0 || p->hi > o->S || p->lo > p->hi || p->base < 0 || p->base > p->lo)
        return zr_error("ZeRO offload: range %lld..%lld (states from %lld) outside the partition (%lld elements)",
                        (long long)p->lo, (long long)p->hi, (long long)p->base, (long long)o->S);
    if (p->grads) {
        zr_dtype dt = p->grads->dtype;
        char b[192];
        if (!zr_tensor_is_contiguous(p->grads) || zr_tensor_numel(p->grads) != o->S ||
            (dt != ZR_F32 && dt != ZR_BF16 && dt != ZR_F16))
            return zr_error("ZeRO offload: gradient partition %s: expected %lld contiguous f32/bf16/f16 elements",
                            zr_tensor_describe(p->grads, b), (long long)o->S);
    } else if (p->c && p->lamb != 2 && !o->gpart)
        return zr_error("ZeRO offload: a step without gradients (device-gradient mode needs pass.grads)");
    if (!p->c) return ZR_OK;
    if ((p->c->kind == ZR_OPTIM_LAMB) != (p->lamb == 1 || p->lamb == 2) || (p->lamb && (!p->lamb_sums || !p->lamb_segs)))
        return zr_error("ZeRO offload: Lamb runs as two passes (lamb 1, then 2) with its sums and segments");
    if (p->step < 1)
        return zr_error("adamw: step must be >= 1 (the count including this step), got %lld", (long long)p->step);
    for (int k = 0; k < o->n; k++) {
        zr_adamw_config sc = *p->c;
        sc.lr = p->lr[k], sc.weight_decay = o->segs[k].wd;
        ZR_CHECK(zr_adamw_config_check(&sc));
    }
    return ZR_OK;
}

zr_status zr_offload_mark(zr_offload *o) {
#ifdef ZR_HAVE_CUDA
    if (o->dev.type != ZR_CUDA) return ZR_OK;
    ZR_CHECK(cuda_ready(o));
    ZR_CHECK(zr_cuda_event_record(o->mark, zr_cuda_stream(o->dev)));
    o->marked = 1;
#else
    (void)o;
#endif
    return ZR_OK;
}

zr_status zr_offload_run(zr_offload *o, const zr_offload_pass *p) {
#ifdef ZR_HAVE_CUDA
    const int marked = o->marked;
    o->marked = 0;
#endif
    ZR_CHECK(check_pass(o, p));
    if (p->lo == p->hi) return ZR_OK; /* partial offload at ratio 0: nothing on the host */
    double t0 = now_ms();
    /* NULL: no ring copy (host gpart, a cast, or Lamb's second pass) */
    zr_tensor *grads = p->c && p->lamb != 2 ? p->grads : NULL;
    if (p->c && p->lamb != 2 && !grads) ZR_CHECK(zr_offload_grad_sync(o));
    int gpu = o->dev.type == ZR_CUDA && ((grads && !zr_is_cpu(grads)) || (!p->out && p->sink));
    ZR_CHECK(ring_ready(o, grads != NULL, !p->out && p->sink));
#ifdef ZR_HAVE_CUDA
    if (gpu) { /* copies start after what the compute stream has queued (backward; reads of the weights),
                * or after the mark */
        ZR_CHECK(cuda_ready(o));
        cudaEvent_t after = marked ? o->mark : o->ready;
        if (!marked) ZR_CHECK(zr_cuda_event_record(o->ready, zr_cuda_stream(o->dev)));
        ZR_CHECK(zr_cuda_stream_wait(o->copy, after));
        ZR_CHECK(zr_cuda_stream_wait(o->up, after));
    }
#else
    if (gpu) return zr_no_cuda("ZeRO offload step");
#endif
    int64_t C = o->chunk, nch = (p->hi - p->lo + C - 1) / C;
    zr_dtype g_dt = grads ? grads->dtype : o->gdt;
    size_t we = zr_dtype_size(o->pdt), ge = zr_dtype_size(g_dt);
    /* chunk j lives in slot j % RING; RING-1 fetches run ahead of the update */
    for (int64_t j = 0; grads && j < RING - 1 && j < nch; j++) {
        int64_t a = p->lo + j * C;
        ZR_CHECK(fetch(o, grads, (int)(j % RING), a, p->hi - a < C ? p->hi - a : C));
    }
    for (int64_t j = 0; j < nch; j++) {
        int k = (int)(j % RING);
        int64_t a = p->lo + j * C, n = p->hi - a < C ? p->hi - a : C;
        const void *g = grads ? (const void *)slot_in(o, k) : o->g ? (const void *)(o->g + (size_t)a * o->ges) : NULL;
        if (grads) ZR_CHECK(fetched(o, grads, k));
        void *w = NULL;
        if (p->out) w = (char *)p->out + (size_t)a * we;
        else if (p->sink) {
            ZR_CHECK(out_free(o, k));
            w = slot_out(o, k);
        }
        double t1 = now_ms();
        if (p->c) ZR_CHECK(update_chunk(o, p, a, n, g, g_dt, w));
        else if (w && p->master_dt == ZR_F32) offload_cast_cpu(w, o->pdt, p->master + (a - p->base), n);
        else if (w && p->master_dt == o->pdt) /* a bf16 master: the weights are its bits */
            memcpy(w, (char *)p->master + (size_t)(a - p->base) * we, (size_t)n * we);
        else if (w)
            return zr_error("ZeRO offload: a %s master into %s parameters (expected the same dtype)",
                            zr_dtype_name(p->master_dt), zr_dtype_name(o->pdt));
        o->t_adam += now_ms() - t1;
        if (grads && j + RING - 1 < nch) { /* slot (j-1) % RING: chunk j-1 is done with it */
            int64_t b = p->lo + (j + RING - 1) * C;
            ZR_CHECK(fetch(o, grads, (int)((j + RING - 1) % RING), b, p->hi - b < C ? p->hi - b : C));
        }
        if (!p->out && p->sink) {
            t1 = now_ms();
            ZR_CHECK(p->sink(p->ctx, o, a, n, w));
#ifdef ZR_HAVE_CUDA
            if (gpu) {
                ZR_CHECK(zr_cuda_event_record(o->uploaded[k], o->up));
                o->up_busy[k] = 1;
            }
#endif
            o->t_put += now_ms() - t1;
        }
    }
#ifdef ZR_HAVE_CUDA
    if (gpu) { /* the next kernels read the new weights; every D2H already landed (waited above) */
        ZR_CHECK(zr_cuda_event_record(o->done, o->up));
        ZR_CHECK(zr_cuda_stream_wait(zr_cuda_stream(o->dev), o->done));
        if (o->profile) { /* so that the profile shows the uploads' tail */
            double t1 = now_ms();
            ZR_CHECK(zr_cuda_event_sync(o->done));
            o->t_up += now_ms() - t1;
        }
    }
#endif
    (void)ge;
    o->t_step += now_ms() - t0;
    return ZR_OK;
}

void zr_offload_step_end(zr_offload *o) {
    o->steps++;
    if (o->profile)
        fprintf(stderr,
                "[zrun offload] step %lld (gradients on the %s): backward: grads out %.1f ms enqueue + %.1f ms wait "
                "(%.2f GB in %lld copies), accumulate %.1f ms, zero %.1f ms, norm %.1f ms; step %.1f ms (GPU idle): "
                "D2H %.2f GB, waited %.1f ms; optimizer %.1f ms; H2D %.2f GB, enqueue %.1f ms, slot waits %.1f ms, "
                "tail %.1f ms\n",
                (long long)o->steps, o->mode, o->t_add, o->t_wait, (double)o->d2h_bytes / 1e9, (long long)o->n_d2h,
                o->t_accum, o->t_zero, o->t_norm, o->t_step, (double)o->fetch_bytes / 1e9, o->t_fetch, o->t_adam,
                (double)o->up_bytes / 1e9, o->t_put, o->t_slot, o->t_up);
    o->t_add = o->t_wait = o->t_accum = o->t_zero = o->t_norm = o->t_fetch = o->t_adam = 0;
    o->t_put = o->t_slot = o->t_up = o->t_step = 0;
    o->d2h_bytes = o->n_d2h = o->fetch_bytes = o->up_bytes = 0;
}
