/* Host side of the ZeRO engine with the master partition on the CPU (see offload.h):
 * gradient intake from device buckets through a copy stream and pinned staging, lazy zeroing of
 * the gradient partition, the fused CPU passes, and the 16-bit weights sent back to the device.
 * The CUDA parts run only for parameters on a GPU; a CPU run uses the same bookkeeping. */
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

/* A gradient copy parked in the staging buffer, to be added into gpart[goff : goff+len]. */
typedef struct {
    int64_t goff, soff, len;
    zr_dtype dt;
    int overwrite;
} pending;

struct zr_offload {
    zr_offload *next; /* registry of live states (zr_offload_find) */
    zr_tensor *gpart; /* f32 (S), host, retained */
    float *g;
    int64_t S, cap;
    zr_device dev;
    zr_dtype pdt;
    int n;
    zr_offload_segment *segs;
    unsigned char *fresh; /* per segment: its gpart range is logically zero but not yet written */
    int lazy, pinned;
    zr_tensor *stage; /* host staging for D2H copies: >= cap f32 elements; slot = bucket offset */
    int stage_pinned;
    pending *pend;
    int npend, pend_cap;
    int64_t hiwater;  /* end (bytes) of the highest staging slot in use since the last drain */
    zr_tensor *w16;   /* new weights as pdt (S), host; source of the uploads */
    int w16_pinned;
#ifdef ZR_HAVE_CUDA
    cudaStream_t copy;               /* D2H gradients and H2D weights, beside the compute stream */
    cudaEvent_t ready, d2h, h2d;     /* compute -> copy ordering; last D2H; last H2D */
    int d2h_busy, h2d_busy, up_open; /* events recorded and not yet waited for; upload batch open */
#endif
    /* ZRUN_OFFLOAD_PROFILE: host milliseconds since the last optimizer step */
    int profile;
    double t_add, t_wait, t_accum, t_zero, t_norm, t_adam, t_back;
    int64_t d2h_bytes, n_d2h, steps;
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
        cudaError_t e = cudaHostRegister(t->storage->data, t->storage->nbytes, cudaHostRegisterDefault);
        if (e != cudaSuccess) {
            size_t nb = t->storage->nbytes;
            zr_tensor_release(t);
            return zr_error_null("ZeRO offload: page-locking a %.2f GiB host buffer failed (%s); raise the "
                                 "locked-memory limit (ulimit -l) or set offload_optimizer.pin_memory to false",
                                 (double)nb / (1 << 30), cudaGetErrorString(e));
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

zr_offload *zr_offload_new(zr_tensor *gpart, zr_device dev, zr_dtype pdt, int n, const zr_offload_segment *segs,
                           int64_t cap, int pinned, int lazy) {
    if (!zr_is_cpu(gpart) || gpart->dtype != ZR_F32 || !zr_tensor_is_contiguous(gpart))
        return zr_error_null("ZeRO offload: the gradient partition must be a contiguous f32 host tensor");
    zr_offload *o = calloc(1, sizeof *o);
    if (!o) return zr_error_null("out of host memory");
    o->segs = malloc(sizeof *o->segs * (size_t)(n > 0 ? n : 1));
    o->fresh = calloc((size_t)(n > 0 ? n : 1), 1);
    o->pend_cap = n > 16 ? n : 16;
    o->pend = malloc(sizeof *o->pend * (size_t)o->pend_cap);
    if (!o->segs || !o->fresh || !o->pend) {
        zr_offload_free(o);
        return zr_error_null("out of host memory");
    }
    memcpy(o->segs, segs, sizeof *o->segs * (size_t)n);
    o->n = n;
    o->gpart = zr_tensor_retain(gpart);
    o->g = zr_tensor_data(gpart);
    o->S = zr_tensor_numel(gpart);
    o->cap = cap;
    o->dev = dev;
    o->pdt = pdt;
    o->pinned = pinned;
    o->lazy = lazy;
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
    zr_cuda_event_free(o->ready);
    zr_cuda_event_free(o->d2h);
    zr_cuda_event_free(o->h2d);
#endif
    host_buf_free(o->stage, o->stage_pinned);
    host_buf_free(o->w16, o->w16_pinned);
    zr_tensor_release(o->gpart);
    free(o->segs);
    free(o->fresh);
    free(o->pend);
    free(o);
}

zr_offload *zr_offload_find(const zr_tensor *gpart) {
    for (zr_offload *o = registry; o; o = o->next)
        if (o->gpart == gpart) return o;
    return NULL;
}

#ifdef ZR_HAVE_CUDA
/* The copy stream and events, made on first use (on the parameters' device). */
static zr_status cuda_ready(zr_offload *o) {
    if (o->copy) return ZR_OK;
    ZR_CHECK(zr_cuda_use(o->dev.index));
    ZR_CHECK(ZR_CUDA_CHECK(cudaStreamCreateWithFlags(&o->copy, cudaStreamNonBlocking), "ZeRO offload copy stream"));
    o->ready = zr_cuda_event_new(0);
    o->d2h = o->ready ? zr_cuda_event_new(0) : NULL;
    o->h2d = o->d2h ? zr_cuda_event_new(0) : NULL;
    return o->h2d ? ZR_OK : ZR_ERR;
}

/* Orders the copy stream after everything queued so far on dev's compute stream. */
static zr_status after_compute(zr_offload *o, zr_device dev) {
    ZR_CHECK(zr_cuda_event_record(o->ready, zr_cuda_stream(dev)));
    return zr_cuda_stream_wait(o->copy, o->ready);
}
#endif

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
            offload_accumulate_cpu(o->g + p->goff, st + (size_t)p->soff * zr_dtype_size(p->dt), p->dt, p->len,
                                   p->overwrite);
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
    offload_fill_cpu(o->g + o->segs[k].off, o->segs[k].n, 0);
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
    if (ow && src->dtype == ZR_F32) { /* first gradient of this step: straight into the partition */
        ZR_CHECK(ZR_CUDA_CHECK(cudaMemcpyAsync(o->g + doff, zr_tensor_data(src), (size_t)len * es,
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
        return zr_error("ZeRO offload: cannot add %s (bucket offset %lld) into the f32 gradient partition at %lld "
                        "(size %lld): expected a contiguous f32/bf16/f16 range inside it",
                        zr_tensor_describe(src, b), (long long)soff, (long long)doff, (long long)o->S);
    }
    double t0 = now_ms();
    int ow = claim(o, doff, len);
    zr_status st;
    if (zr_is_cpu(src)) {
        st = drain(o); /* keep the order of additions */
        if (!st) offload_accumulate_cpu(o->g + doff, zr_tensor_data(src), dt, len, ow);
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
    ZR_CHECK(drain(o));
    for (int k = 0; k < o->n; k++) materialize(o, k);
    return ZR_OK;
}

zr_status zr_offload_grad_zero(zr_offload *o) {
    ZR_CHECK(drain(o)); /* copies in flight land before their ranges are forgotten */
    if (o->lazy) {
        memset(o->fresh, 1, (size_t)o->n);
        return ZR_OK;
    }
    double t0 = now_ms();
    offload_fill_cpu(o->g, o->S, 0);
    o->t_zero += now_ms() - t0;
    return ZR_OK;
}

zr_status zr_offload_sumsq(zr_offload *o, double *out) {
    ZR_CHECK(zr_offload_grad_sync(o));
    double t0 = now_ms();
    *out = offload_sumsq_cpu(o->g, o->S);
    o->t_norm += now_ms() - t0;
    return ZR_OK;
}

zr_status zr_offload_adamw(zr_offload *o, float *master, float *m, float *v, double grad_scale, int64_t step,
                           const zr_adamw_config *c, const double *lr, const double *lamb_sums, void *out) {
    return zr_offload_adamw_range(o, 0, o->n, master, m, v, grad_scale, step, c, lr, lamb_sums, out);
}

zr_status zr_offload_lamb_sums(zr_offload *o, const float *master, float *m, float *v, double grad_scale,
                               const zr_adamw_config *c, const zr_adamw_segment *segs, double *sums) {
    ZR_CHECK(zr_adamw_config_check(c));
    ZR_CHECK(zr_offload_grad_sync(o));
    double t0 = now_ms();
    const float gs = (float)grad_scale;
    lamb_sums_cpu(master, m, v, o->g, ZR_F32, segs, o->n, c, &gs, sums);
    o->t_adam += now_ms() - t0;
    return ZR_OK;
}

/* c with segment k's learning rate and weight decay. */
static zr_adamw_config segment_config(const zr_offload *o, const zr_adamw_config *c, const double *lr, int k) {
    zr_adamw_config s = *c;
    s.lr = lr[k], s.weight_decay = o->segs[k].wd;
    return s;
}

zr_status zr_offload_adamw_range(zr_offload *o, int k0, int k1, float *master, float *m, float *v, double grad_scale,
                                 int64_t step, const zr_adamw_config *c, const double *lr, const double *lamb_sums,
                                 void *out) {
    if (step < 1) return zr_error("adamw: step must be >= 1 (the count including this step), got %lld", (long long)step);
    if (k0 < 0 || k1 > o->n || k0 > k1) return zr_error("adamw: segment range %d..%d outside 0..%d", k0, k1, o->n);
    for (int k = k0; k < k1; k++) {
        zr_adamw_config sc = segment_config(o, c, lr, k);
        ZR_CHECK(zr_adamw_config_check(&sc));
    }
    ZR_CHECK(zr_offload_grad_sync(o));
    double t0 = now_ms();
    size_t es = zr_dtype_size(o->pdt);
    for (int k = k0; k < k1; k++) {
        const zr_offload_segment *s = &o->segs[k];
        if (s->n == 0) continue;
        zr_adamw_config sc = segment_config(o, c, lr, k);
        if (c->kind == ZR_OPTIM_LAMB) { /* the second pass: the sums came from zr_offload_lamb_sums */
            if (!lamb_sums) return zr_error("lamb: the step needs the sums of its first pass");
            zr_adamw_segment seg = {s->off, s->n, (float)s->wd, (float)lr[k]};
            lamb_apply_cpu(master, m, v, out, o->pdt, &seg, 1, c, step, lamb_sums + 2 * k);
            continue;
        }
        if (c->kind != ZR_OPTIM_ADAMW) { /* Lion, Adagrad, SGD: one segment at its partition offset */
            zr_adamw_segment seg = {s->off, s->n, (float)s->wd, (float)lr[k]};
            float gs = (float)grad_scale;
            optim_step_cpu(master, m, out, o->pdt, o->g, ZR_F32, &seg, 1, c, step, &gs);
            continue;
        }
        offload_adamw_cpu(master + s->off, m + s->off, v + s->off, o->g + s->off, s->n, &sc, step, grad_scale,
                          out ? (char *)out + (size_t)s->off * es : NULL, o->pdt);
    }
    o->t_adam += now_ms() - t0;
    return ZR_OK;
}

zr_status zr_offload_cast(zr_offload *o, void *out, const float *master) {
    double t0 = now_ms();
    offload_cast_cpu(out, o->pdt, master, o->S);
    o->t_adam += now_ms() - t0;
    return ZR_OK;
}

/* Waits until the last upload has read the weights buffer. */
static zr_status wait_h2d(zr_offload *o) {
#ifdef ZR_HAVE_CUDA
    if (o->h2d_busy) {
        ZR_CHECK(zr_cuda_event_sync(o->h2d));
        o->h2d_busy = 0;
    }
#else
    (void)o;
#endif
    return ZR_OK;
}

void *zr_offload_weights16(zr_offload *o) {
    if (wait_h2d(o)) return NULL;
    if (!o->w16) {
        if (o->pdt != ZR_F32 && o->pdt != ZR_BF16 && o->pdt != ZR_F16)
            return zr_error_null("ZeRO offload: parameters must be f32, bf16 or f16, got %s", zr_dtype_name(o->pdt));
        o->w16 = host_buf(o->pdt, o->S, ZR_MEM_PARAMS, o->pinned && o->dev.type == ZR_CUDA, &o->w16_pinned);
        if (!o->w16) return NULL;
    }
    return zr_tensor_data(o->w16);
}

zr_status zr_offload_upload(zr_offload *o, zr_tensor *dst, int64_t hoff, int64_t n) {
    if (n <= 0) return ZR_OK;
    char b[192];
    if (!o->w16 || dst->dtype != o->pdt || !zr_tensor_is_contiguous(dst) || zr_tensor_numel(dst) < n || hoff < 0 ||
        hoff + n > o->S)
        return zr_error("ZeRO offload: cannot upload %lld weights from offset %lld into %s", (long long)n,
                        (long long)hoff, zr_tensor_describe(dst, b));
    double t0 = now_ms();
    size_t es = zr_dtype_size(o->pdt);
    const char *src = (const char *)zr_tensor_data(o->w16) + (size_t)hoff * es;
    if (zr_is_cpu(dst)) {
        memcpy(zr_tensor_data(dst), src, (size_t)n * es);
        o->t_back += now_ms() - t0;
        return ZR_OK;
    }
#ifdef ZR_HAVE_CUDA
    ZR_CHECK(cuda_ready(o));
    if (!o->up_open) { /* the parameters may still be read by queued kernels */
        ZR_CHECK(after_compute(o, zr_tensor_device(dst)));
        o->up_open = 1;
    }
    ZR_CHECK(ZR_CUDA_CHECK(cudaMemcpyAsync(zr_tensor_data(dst), src, (size_t)n * es, cudaMemcpyHostToDevice, o->copy),
                           "ZeRO offload weights copy to the device"));
    o->t_back += now_ms() - t0;
    return ZR_OK;
#else
    return zr_no_cuda("ZeRO offload weights copy");
#endif
}

zr_status zr_offload_upload_end(zr_offload *o) {
#ifdef ZR_HAVE_CUDA
    if (!o->up_open) return ZR_OK;
    o->up_open = 0;
    double t0 = now_ms();
    ZR_CHECK(zr_cuda_event_record(o->h2d, o->copy));
    ZR_CHECK(zr_cuda_stream_wait(zr_cuda_stream(o->dev), o->h2d)); /* the next forward reads them */
    o->h2d_busy = 1;
    if (o->profile) ZR_CHECK(wait_h2d(o)); /* so that copy-back shows the transfer itself */
    o->t_back += now_ms() - t0;
#else
    (void)o;
#endif
    return ZR_OK;
}

void zr_offload_step_end(zr_offload *o) {
    o->steps++;
    if (o->profile)
        fprintf(stderr,
                "[zrun offload] step %lld: grads out %.1f ms enqueue + %.1f ms wait (%.2f GB in %lld copies), "
                "accumulate %.1f ms, zero %.1f ms, norm %.1f ms, adam %.1f ms, copy-back %.1f ms\n",
                (long long)o->steps, o->t_add, o->t_wait, (double)o->d2h_bytes / 1e9, (long long)o->n_d2h,
                o->t_accum, o->t_zero, o->t_norm, o->t_adam, o->t_back);
    o->t_add = o->t_wait = o->t_accum = o->t_zero = o->t_norm = o->t_adam = o->t_back = 0;
    o->d2h_bytes = o->n_d2h = 0;
}
