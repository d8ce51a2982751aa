/* ZeRO engine (see zero.h): per-parameter chunk layout, bucketed reduce-scatter / all-reduce of
 * gradients, partitioned AdamW with fp32 master weights, all-gather of updated parameters, and
 * stage-3 gather/release of parameters. Device-agnostic: tensors move through the tensor API
 * and collectives through comm.h (MPI on the CPU, NCCL on GPUs). */
#include "zero/engine.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/autograd.h"
#include "ops/elementwise.h"
#include "ops/optim.h"
#include "ops/reduce.h"
#include "ops/util.h"
#include "zero/comm.h"
#include "zero/offload.h"
#ifdef ZR_HAVE_CUDA
#include "cuda/device.h"
#include "kernels/cuda/optim.h"
#include "kernels/cuda/zero_ops.h"
#endif

typedef struct {
    zr_tensor *p;   /* the parameter (retained) */
    int64_t n, c, off;
    int ndim;
    int64_t shape[ZR_MAX_DIMS];
    double wd;
    int gathered;   /* stage 3 */
    int persistent; /* stage 3: below stage3_param_persistence_threshold, never released */
    zr_tensor *g_out;  /* stage 3: an all-gather in flight (prefetch): its W chunks and handle */
    zr_comm_handle *g_h;
    int packed;   /* gradient already in a bucket this backward */
} zparam;

typedef struct {
    zr_zero *z;
    int i;
} hook_ctx;

struct zr_zero {
    zr_zero_config cfg;
    int W;  /* chunks per parameter: world size, or 1 at stage 0 */
    int n;
    zparam *ps;
    int64_t S, max_c;
    zr_device dev, opt_dev;
    zr_dtype pdt, cdt, gdt; /* parameters; gradient buckets and their reduction; gradient partition */
    zr_tensor *master, *m, *v, *gpart, *pshard;
    /* gradient bucket: W segments of cap elements each */
    int64_t cap, pos;
    int *bidx;            /* the bucket's pieces: parameter, offset in its chunk, length, place */
    int64_t *boff, *blen, *bpos;
    int nb;
    zr_tensor *send, *compact, *recv;
    int boundary;
    /* One chunk per parameter (stage 0, or world size 1) with the partition on the parameters'
     * device: gradients are views into gpart (fp32) and parameters views into one flat buffer, so
     * no bucket copies are needed and the CUDA AdamW writes the 16-bit weights directly. */
    int direct;
    zr_tensor *pflat;
    int pinned; /* how many host partitions are page-locked */
    zr_offload *host; /* master on the host: gradient intake, fused CPU passes, weights back */
    /* overlap_comm (W > 1, bucketed modes): a second buffer set, and the bucket whose
     * reduce-scatter is in flight (its parameters, where its result lands, its handle) */
    zr_tensor *send2, *compact2, *recv2;
    int *pidx;
    int64_t *poff, *plen, *ppos;
    int pnb;
    zr_tensor *pred;
    zr_comm_handle *ph;
    int64_t live; /* stage 3: elements of non-persistent parameters gathered or in flight */
};

static int64_t valid_len(int64_t n, int64_t c, int r) {
    int64_t lo = (int64_t)r * c, hi = lo + c < n ? lo + c : n;
    return hi > lo ? hi - lo : 0;
}

/* 1-D view of elements [start, start+len) of a contiguous tensor. */
static zr_tensor *flat_range(zr_tensor *t, int64_t start, int64_t len) {
    int64_t st = 1;
    return zr_tensor_as_strided(t, 1, &len, &st, t->offset + start);
}

static zr_status copy_range(zr_tensor *dst, int64_t doff, zr_tensor *src, int64_t soff, int64_t len) {
    if (len <= 0) return ZR_OK;
    zr_tensor *d = flat_range(dst, doff, len), *s = flat_range(src, soff, len);
    zr_status st = (d && s) ? zr_tensor_copy_(d, s) : ZR_ERR;
    zr_tensor_release(d);
    zr_tensor_release(s);
    return st;
}

static zr_status fill_range(zr_tensor *t, int64_t off, int64_t len, double v) {
    if (len <= 0) return ZR_OK;
    zr_tensor *d = flat_range(t, off, len);
    zr_status st = d ? zr_tensor_fill_(d, v) : ZR_ERR;
    zr_tensor_release(d);
    return st;
}

/* dst[doff:+len] += src[soff:+len], across devices if needed. Into the host gradient partition
 * (master on the host) through zero_offload.c, found from dst itself so that callers stay as
 * they are: async from a GPU, and overwriting instead of adding after zero_grad. */
static zr_status add_range(zr_tensor *dst, int64_t doff, zr_tensor *src, int64_t soff, int64_t len) {
    zr_offload *o = zr_offload_find(dst);
    if (o) {
        if (len <= 0) return ZR_OK;
        zr_tensor *sv = flat_range(src, soff, len);
        zr_status st = sv ? zr_offload_grad_add(o, doff, sv, soff) : ZR_ERR;
        zr_tensor_release(sv);
        return st;
    }
    zr_tensor *d = flat_range(dst, doff, len), *s = flat_range(src, soff, len), *h = NULL;
    zr_status st = ZR_ERR;
    if (d && s) {
        if (!zr_device_eq(zr_tensor_device(d), zr_tensor_device(s))) {
            h = zr_tensor_to_raw(s, d->dtype, zr_tensor_device(d));
            st = h ? zr_add_(d, h, 1.0) : ZR_ERR;
        } else
            st = zr_add_(d, s, 1.0);
    }
    zr_tensor_release(d);
    zr_tensor_release(s);
    zr_tensor_release(h);
    return st;
}

/* Direct mode: parameters whose gradient is still stale (none arrived since zero_grad) get
 * their partition range zeroed before anything reads the partition. */
static zr_status flush_stale(zr_zero *z) {
    if (!z->direct) return ZR_OK;
    for (int i = 0; i < z->n; i++) {
        zparam *q = &z->ps[i];
        if (!q->p->grad_stale) continue;
        ZR_CHECK(fill_range(z->gpart, q->off, q->c, 0));
        q->p->grad_stale = 0;
    }
    return ZR_OK;
}

static zr_tensor *new_buf(zr_dtype dt, zr_device dev, int64_t n, zr_mem_category cat) {
    return zr_tensor_new_cat(dt, dev, 1, &n, cat, 1);
}

static void hook(zr_tensor *leaf, void *ctx);

/* Page-locks the host partitions so device<->host copies run at full DMA speed. */
static zr_status pin(zr_zero *z) {
#ifdef ZR_HAVE_CUDA
    zr_tensor *ts[4] = {z->master, z->m, z->v, z->gpart};
    for (int k = 0; k < 4; k++) {
        cudaError_t e = cudaHostRegister(ts[k]->storage->data, ts[k]->storage->nbytes, cudaHostRegisterDefault);
        if (e != cudaSuccess)
            return zr_error("offload_optimizer.pin_memory: page-locking %.2f GiB of host memory failed (%s); raise "
                            "the locked-memory limit (ulimit -l) or set pin_memory to false",
                            (double)ts[k]->storage->nbytes / (1 << 30), cudaGetErrorString(e));
        z->pinned = k + 1;
    }
#endif
    return ZR_OK;
}
static void unpin(zr_zero *z) {
#ifdef ZR_HAVE_CUDA
    zr_tensor *ts[4] = {z->master, z->m, z->v, z->gpart};
    for (int k = 0; k < z->pinned; k++) cudaHostUnregister(ts[k]->storage->data);
#endif
    z->pinned = 0;
}

/* Direct mode: parameter i's .grad is gpart[off : off+n] viewed with its shape. */
static zr_status attach_grad(zr_zero *z, int i) {
    zparam *q = &z->ps[i];
    zr_tensor *g = q->p->grad;
    if (g && g->storage == z->gpart->storage) return ZR_OK;
    int64_t st[ZR_MAX_DIMS], s = 1;
    for (int d = q->ndim - 1; d >= 0; d--) {
        st[d] = s;
        s *= q->shape[d];
    }
    zr_tensor *v = zr_tensor_as_strided(z->gpart, q->ndim, q->shape, st, z->gpart->offset + q->off);
    if (!v) return ZR_ERR;
    zr_tensor_release(q->p->grad);
    q->p->grad = v;
    return ZR_OK;
}

/* Direct mode set-up: one flat buffer holds every parameter (each a view at its offset) and
 * gradients are views into the fp32 partition. */
static zr_status attach_direct(zr_zero *z) {
    z->pflat = new_buf(z->pdt, z->dev, z->S, ZR_MEM_PARAMS);
    if (!z->pflat) return ZR_ERR;
    for (int i = 0; i < z->n; i++) {
        zparam *q = &z->ps[i];
        ZR_CHECK(copy_range(z->pflat, q->off, q->p, 0, q->n));
        zr_storage_retain(z->pflat->storage);
        zr_storage_release(q->p->storage);
        q->p->storage = z->pflat->storage;
        q->p->offset = q->off;
        ZR_CHECK(attach_grad(z, i));
    }
    return ZR_OK;
}

zr_zero *zr_zero_new(const zr_zero_config *cfg, int n, zr_tensor *const *params, const double *wd) {
    if (cfg->stage < 0 || cfg->stage > 3)
        return zr_error_null("zero_optimization.stage must be 0, 1, 2 or 3, got %d", cfg->stage);
    if (cfg->offload_param && cfg->stage != 3)
        return zr_error_null("zero_optimization.offload_param needs stage 3 (got stage %d)", cfg->stage);
    if (n <= 0) return zr_error_null("ZeRO: no parameters to optimize");
    zr_zero *z = calloc(1, sizeof *z);
    if (!z) return zr_error_null("out of host memory");
    z->cfg = *cfg;
    z->W = cfg->stage == 0 ? 1 : cfg->world_size;
    z->n = n;
    z->ps = calloc((size_t)n, sizeof *z->ps);
    z->bidx = calloc((size_t)n, sizeof *z->bidx);
    z->boff = calloc((size_t)n, sizeof *z->boff);
    z->blen = calloc((size_t)n, sizeof *z->blen);
    z->bpos = calloc((size_t)n, sizeof *z->bpos);
    if (!z->ps || !z->bidx || !z->boff || !z->blen || !z->bpos) {
        zr_zero_free(z);
        return zr_error_null("out of host memory");
    }
    z->dev = zr_tensor_device(params[0]);
    z->pdt = params[0]->dtype;
    /* one process communicates nothing: its bucket only stages gradients (fp32, so that offload's
     * first copy of a step lands straight in the partition) */
    z->cdt = cfg->world_size <= 1 ? ZR_F32 : cfg->comm_dtype >= 0 ? (zr_dtype)cfg->comm_dtype : z->pdt;
    z->opt_dev = cfg->offload_optimizer ? zr_cpu() : z->dev;
    z->gdt = cfg->grad_dtype >= 0 ? (zr_dtype)cfg->grad_dtype : ZR_F32;
    if (z->gdt != ZR_F32 && (z->gdt != ZR_BF16 && z->gdt != ZR_F16)) {
        zr_zero_free(z);
        return zr_error_null("ZeRO: data_types.grad_accum_dtype must be fp32, bf16 or fp16 (got %s)",
                             zr_dtype_name(z->gdt));
    }
    if (z->gdt != ZR_F32 && z->opt_dev.type != ZR_CUDA) {
        zr_zero_free(z);
        return zr_error_null("ZeRO: data_types.grad_accum_dtype=%s needs the optimizer states on a GPU; here they "
                             "are on the host (%s): remove grad_accum_dtype (fp32 gradients) or keep the "
                             "optimizer on the GPU",
                             z->gdt == ZR_BF16 ? "bf16" : "fp16",
                             cfg->offload_optimizer ? "offload_optimizer" : "a CPU run");
    }
    for (int i = 0; i < n; i++) {
        zr_tensor *p = params[i];
        char b[192];
        if (!zr_tensor_is_contiguous(p) || p->grad_fn) {
            zr_zero_free(z);
            return zr_error_null("ZeRO: parameter %d (%s) must be a contiguous leaf tensor", i + 1, zr_tensor_describe(p, b));
        }
        if (!zr_device_eq(zr_tensor_device(p), z->dev) || p->dtype != z->pdt) {
            char b0[192];
            zr_zero_free(z);
            return zr_error_null("ZeRO: all parameters must share one device and dtype: parameter 1 is %s, "
                                 "parameter %d is %s", zr_tensor_describe(params[0], b0), i + 1, zr_tensor_describe(p, b));
        }
        zparam *q = &z->ps[i];
        q->p = zr_tensor_retain(p);
        q->n = zr_tensor_numel(p);
        q->c = (q->n + z->W - 1) / z->W;
        q->off = z->S;
        q->ndim = p->ndim;
        memcpy(q->shape, p->shape, sizeof q->shape);
        q->wd = wd ? wd[i] : 0;
        q->gathered = 1;
        q->persistent = cfg->stage == 3 && q->n < cfg->persistence_threshold;
        if (!q->persistent) z->live += q->n;
        z->S += q->c;
        if (q->c > z->max_c) z->max_c = q->c;
    }
    if (z->W > 1 && z->S < 1) {
        zr_zero_free(z);
        return zr_error_null("ZeRO: nothing to partition");
    }
    /* Every rank starts from rank 0's weights, as DeepSpeed broadcasts the module at start. */
    if (cfg->world_size > 1)
        for (int i = 0; i < n; i++)
            if (zr_broadcast(z->ps[i].p, 0)) goto fail;
    z->master = new_buf(ZR_F32, z->opt_dev, z->S, ZR_MEM_OPTIMIZER);
    z->m = new_buf(ZR_F32, z->opt_dev, z->S, ZR_MEM_OPTIMIZER);
    z->v = new_buf(ZR_F32, z->opt_dev, z->S, ZR_MEM_OPTIMIZER);
    z->gpart = new_buf(z->gdt, z->opt_dev, z->S, ZR_MEM_GRADS);
    if (!z->master || !z->m || !z->v || !z->gpart) goto fail;
    if (cfg->offload_optimizer && cfg->pin_memory && z->dev.type == ZR_CUDA && pin(z)) goto fail;
    int r = z->W > 1 ? cfg->rank : 0;
    for (int i = 0; i < n; i++) {
        zparam *q = &z->ps[i];
        if (copy_range(z->master, q->off, q->p, (int64_t)r * q->c, valid_len(q->n, q->c, r))) goto fail;
    }
    z->direct = z->W == 1 && cfg->stage <= 2 && zr_device_eq(z->opt_dev, z->dev);
    if (z->direct && attach_direct(z)) goto fail;
    z->cap = cfg->reduce_bucket_size / z->W;
    if (z->cap < z->max_c) z->cap = z->max_c;
    if (z->cap > z->S) z->cap = z->S;
    if (z->opt_dev.type == ZR_CPU) { /* gradients, norm, AdamW and weights back through zero_offload.c */
        zr_offload_segment *segs = malloc(sizeof *segs * (size_t)n);
        if (!segs) {
            zr_error("out of host memory");
            goto fail;
        }
        for (int i = 0; i < n; i++) segs[i] = (zr_offload_segment){z->ps[i].off, z->ps[i].c, z->ps[i].wd};
        /* direct mode: gpart holds the parameters' .grad views, so it is zeroed for real */
        z->host = zr_offload_new(z->gpart, z->dev, z->pdt, n, segs, z->cap, z->pinned == 4, !z->direct);
        free(segs);
        if (!z->host) goto fail;
    }
    if (!z->direct) { /* direct mode reduces gpart in place: no buckets */
        z->send = new_buf(z->cdt, z->dev, z->cap * z->W, ZR_MEM_COMM);
        z->compact = z->W > 1 ? new_buf(z->cdt, z->dev, z->cap * z->W, ZR_MEM_COMM) : NULL;
        z->recv = z->W > 1 ? new_buf(z->cdt, z->dev, z->cap, ZR_MEM_COMM) : NULL;
        if (!z->send || (z->W > 1 && (!z->compact || !z->recv))) goto fail;
        if (cfg->overlap_comm && z->W > 1) {
            z->send2 = new_buf(z->cdt, z->dev, z->cap * z->W, ZR_MEM_COMM);
            z->compact2 = new_buf(z->cdt, z->dev, z->cap * z->W, ZR_MEM_COMM);
            z->recv2 = new_buf(z->cdt, z->dev, z->cap, ZR_MEM_COMM);
            z->pidx = calloc((size_t)n, sizeof *z->pidx);
            z->poff = calloc((size_t)n, sizeof *z->poff);
            z->plen = calloc((size_t)n, sizeof *z->plen);
            z->ppos = calloc((size_t)n, sizeof *z->ppos);
            if (!z->send2 || !z->compact2 || !z->recv2 || !z->pidx || !z->poff || !z->plen || !z->ppos) goto fail;
        }
    }
    for (int i = 0; i < n; i++) {
        zparam *q = &z->ps[i];
        hook_ctx *h = malloc(sizeof *h);
        if (!h) goto fail;
        h->z = z;
        h->i = i;
        zr_tensor_set_grad_hook(q->p, hook, h, free);
        if (cfg->stage <= 1 && !z->direct) { /* gradients accumulate in the parameters' .grad (fp32, or
                                                * data_types.grad_accum_dtype) */
            zr_tensor_release(q->p->grad);
            q->p->grad = zr_tensor_new_cat(z->gdt, z->dev, q->ndim, q->shape, ZR_MEM_GRADS, 1);
            if (!q->p->grad) goto fail;
        }
    }
    if (cfg->stage == 3) {
        zr_device sdev = cfg->offload_param ? zr_cpu() : z->dev;
        z->pshard = new_buf(z->pdt, sdev, z->S, ZR_MEM_PARAMS);
        if (!z->pshard) goto fail;
        for (int i = 0; i < n; i++) {
            zparam *q = &z->ps[i];
            if (copy_range(z->pshard, q->off, q->p, (int64_t)r * q->c, valid_len(q->n, q->c, r))) goto fail;
        }
        if (zr_zero_release_all(z)) goto fail;
    }
    return z;
fail:
    zr_error_prefix("ZeRO stage %d setup: ", cfg->stage);
    zr_zero_free(z);
    return NULL;
}

void zr_zero_free(zr_zero *z) {
    if (!z) return;
    for (int i = 0; i < z->n; i++) {
        if (!z->ps[i].p) continue;
        if (z->ps[i].g_h) zr_comm_wait(z->ps[i].g_h); /* a prefetch still in flight */
        zr_tensor_release(z->ps[i].g_out);
        zr_tensor_set_grad_hook(z->ps[i].p, NULL, NULL, NULL);
        zr_tensor_release(z->ps[i].p);
    }
    zr_offload_free(z->host); /* first: it waits for copies into gpart and its own buffers */
    unpin(z);
    zr_tensor_release(z->master);
    zr_tensor_release(z->m);
    zr_tensor_release(z->v);
    zr_tensor_release(z->gpart);
    zr_tensor_release(z->pshard);
    zr_tensor_release(z->pflat);
    if (z->ph) zr_comm_wait(z->ph); /* never free buffers a collective still uses */
    zr_tensor_release(z->send);
    zr_tensor_release(z->compact);
    zr_tensor_release(z->recv);
    zr_tensor_release(z->send2);
    zr_tensor_release(z->compact2);
    zr_tensor_release(z->recv2);
    free(z->pidx);
    free(z->poff);
    free(z->plen);
    free(z->ppos);
    free(z->ps);
    free(z->bidx);
    free(z->boff);
    free(z->blen);
    free(z->bpos);
    free(z);
}

int64_t zr_zero_partition_numel(const zr_zero *z) { return z->S; }
int zr_zero_num_params(const zr_zero *z) { return z->n; }
void zr_zero_param_layout(const zr_zero *z, int i, int64_t *offset, int64_t *chunk) {
    *offset = z->ps[i].off;
    *chunk = z->ps[i].c;
}
zr_tensor *zr_zero_state(zr_zero *z, int which) {
    if (which == 3 && flush_stale(z)) return NULL;
    if (which == 3 && z->host && zr_offload_grad_sync(z->host)) return NULL; /* lazily zeroed ranges */
    zr_tensor *t = which == 0 ? z->master : which == 1 ? z->m : which == 2 ? z->v : z->gpart;
    return zr_tensor_retain(t);
}

/* --- gradient buckets --- */

/* overlap_comm: waits for the bucket in flight and adds its reduced segment into the partition. */
static zr_status complete_pending(zr_zero *z) {
    if (!z->ph) return ZR_OK;
    zr_comm_handle *h = z->ph;
    z->ph = NULL;
    ZR_CHECK(zr_comm_wait(h));
    for (int k = 0; k < z->pnb; k++)
        ZR_CHECK(add_range(z->gpart, z->ps[z->pidx[k]].off + z->poff[k], z->pred, z->ppos[k], z->plen[k]));
    z->pnb = 0;
    return ZR_OK;
}

static void swap_tensors(zr_tensor **a, zr_tensor **b) {
    zr_tensor *t = *a;
    *a = *b;
    *b = t;
}

static zr_status flush(zr_zero *z) {
    if (z->nb == 0) return ZR_OK;
    int64_t L = z->pos;
    zr_tensor *red = z->send; /* where the reduced segment of this rank ends up */
    if (z->W == 1) {
        zr_tensor *s = flat_range(z->send, 0, L);
        zr_status st = s ? (z->cfg.world_size > 1 ? zr_all_reduce(s, ZR_RED_SUM) : ZR_OK) : ZR_ERR;
        zr_tensor_release(s);
        ZR_CHECK(st);
    } else {
        zr_tensor *src = z->send;
        if (L < z->cap) { /* gather the W used prefixes into one contiguous buffer */
            for (int r = 0; r < z->W; r++) ZR_CHECK(copy_range(z->compact, (int64_t)r * L, z->send, (int64_t)r * z->cap, L));
            src = z->compact;
        }
        zr_tensor *in = flat_range(src, 0, L * z->W), *out = flat_range(z->recv, 0, L);
        if (z->send2 && in && out) { /* overlap_comm: start it, finish the previous one, go on */
            zr_status st = complete_pending(z);
            zr_comm_handle *h = st ? NULL : zr_reduce_scatter_async(out, in, ZR_RED_SUM);
            zr_tensor_release(in);
            zr_tensor_release(out);
            if (!h) return ZR_ERR;
            z->ph = h;
            z->pred = z->recv;
            memcpy(z->pidx, z->bidx, sizeof *z->pidx * (size_t)z->nb);
            memcpy(z->poff, z->boff, sizeof *z->poff * (size_t)z->nb);
            memcpy(z->plen, z->blen, sizeof *z->plen * (size_t)z->nb);
            memcpy(z->ppos, z->bpos, sizeof *z->ppos * (size_t)z->nb);
            z->pnb = z->nb;
            swap_tensors(&z->send, &z->send2); /* the next bucket fills the other buffers */
            swap_tensors(&z->compact, &z->compact2);
            swap_tensors(&z->recv, &z->recv2);
            z->nb = 0;
            z->pos = 0;
            return ZR_OK;
        }
        zr_status st = (in && out) ? zr_reduce_scatter(out, in, ZR_RED_SUM) : ZR_ERR;
        zr_tensor_release(in);
        zr_tensor_release(out);
        ZR_CHECK(st);
        red = z->recv;
    }
    for (int k = 0; k < z->nb; k++)
        ZR_CHECK(add_range(z->gpart, z->ps[z->bidx[k]].off + z->boff[k], red, z->bpos[k], z->blen[k]));
    z->nb = 0;
    z->pos = 0;
    return ZR_OK;
}

/* Copies parameter i's gradient chunks into the bucket. A chunk that does not fit is split: the
 * bucket is filled and flushed when full, so every bucket but a backward's last is reduced in
 * place, without the compaction copy a partly filled one needs. */
static zr_status pack(zr_zero *z, int i) {
    zparam *q = &z->ps[i];
    zr_tensor *g = q->p->grad;
    if (!g || q->packed) return ZR_OK;
    zr_tensor *gc = zr_tensor_contiguous_raw(g);
    if (!gc) return ZR_ERR;
    zr_status st = ZR_OK;
    for (int64_t co = 0; co < q->c && !st;) {
        int64_t take = q->c - co < z->cap - z->pos ? q->c - co : z->cap - z->pos;
        for (int r = 0; r < z->W && !st; r++) { /* rank r's piece: its valid part, then zeros */
            int64_t v = valid_len(q->n, q->c, r) - co, base = (int64_t)r * z->cap + z->pos;
            v = v < 0 ? 0 : v > take ? take : v;
            st = copy_range(z->send, base, gc, (int64_t)r * q->c + co, v);
            if (!st) st = fill_range(z->send, base + v, take - v, 0);
        }
        if (st) break;
        z->bidx[z->nb] = i;
        z->boff[z->nb] = co;
        z->blen[z->nb] = take;
        z->bpos[z->nb++] = z->pos;
        z->pos += take;
        co += take;
        if (z->pos == z->cap) st = flush(z);
    }
    zr_tensor_release(gc);
    ZR_CHECK(st);
    q->packed = 1;
    if (z->cfg.stage >= 2) { /* the partition keeps it now */
        zr_tensor_release(q->p->grad);
        q->p->grad = NULL;
    }
    return ZR_OK;
}

static zr_status hook_error = ZR_OK;
static char hook_msg[512];

static void hook(zr_tensor *leaf, void *ctx) {
    hook_ctx *h = ctx;
    zr_zero *z = h->z;
    (void)leaf;
    if (z->cfg.stage < 2 || z->direct || hook_error) return;
    if (pack(z, h->i)) {
        hook_error = ZR_ERR;
        snprintf(hook_msg, sizeof hook_msg, "%s", zr_last_error_message());
    }
}

zr_status zr_zero_backward_begin(zr_zero *z, int is_boundary) {
    z->boundary = is_boundary;
    hook_error = ZR_OK;
    for (int i = 0; i < z->n; i++) {
        z->ps[i].packed = 0;
        if (z->direct) ZR_CHECK(attach_grad(z, i)); /* someone may have set .grad to nil */
    }
    return ZR_OK;
}

zr_status zr_zero_backward_end(zr_zero *z) {
    if (hook_error) {
        hook_error = ZR_OK;
        return zr_error("ZeRO gradient reduction during backward failed: %s", hook_msg);
    }
    if (z->cfg.stage < 2 || z->direct) return ZR_OK;
    for (int i = z->n - 1; i >= 0; i--) ZR_CHECK(pack(z, i)); /* grads whose hook did not fire */
    ZR_CHECK(flush(z));
    ZR_CHECK(complete_pending(z));
    if (z->cfg.stage == 3) ZR_CHECK(zr_zero_release_all(z));
    return ZR_OK;
}

zr_status zr_zero_reduce(zr_zero *z) {
    ZR_CHECK(flush_stale(z));
    if (z->direct) { /* gradients already sit in gpart: sum them over ranks in place (stage 0) */
        if (z->cfg.world_size == 1) return ZR_OK;
        int64_t cap = z->cfg.reduce_bucket_size > 0 ? z->cfg.reduce_bucket_size : z->S;
        for (int64_t a = 0; a < z->S; a += cap) {
            zr_tensor *b = flat_range(z->gpart, a, a + cap < z->S ? cap : z->S - a);
            zr_status st = b ? zr_all_reduce(b, ZR_RED_SUM) : ZR_ERR;
            zr_tensor_release(b);
            ZR_CHECK(st);
        }
        return ZR_OK;
    }
    if (z->cfg.stage >= 2) return ZR_OK;
    for (int i = 0; i < z->n; i++) z->ps[i].packed = 0;
    for (int i = z->n - 1; i >= 0; i--) ZR_CHECK(pack(z, i));
    ZR_CHECK(flush(z));
    return complete_pending(z);
}

/* Sum of squares of this rank's reduced gradient partition. */
static zr_status local_sumsq(zr_zero *z, double *out) {
#ifdef ZR_HAVE_CUDA
    if (!zr_is_cpu(z->gpart)) { /* one read of the partition, no squared temporary */
        int64_t nw = (int64_t)zero_sumsq_workspace(z->S);
        zr_tensor *ws = zr_tensor_new_cat(ZR_F64, zr_tensor_device(z->gpart), 1, &nw, ZR_MEM_WORKSPACE, 0);
        if (!ws) return ZR_ERR;
        double *w = zr_tensor_data(ws);
        zr_status st = zero_sumsq_cuda(w + nw - 1, zr_tensor_data(z->gpart), z->gdt, z->S, w,
                                       zr_cuda_stream(zr_tensor_device(z->gpart)));
        if (!st) st = zr_tensor_get(ws, nw - 1, out);
        zr_tensor_release(ws);
        return st;
    }
#endif
    /* host partition: one parallel read in double (waits for gradient copies still in flight) */
    return zr_offload_sumsq(z->host, out);
}

zr_status zr_zero_grad_norm(zr_zero *z, double scale, double *norm) {
    ZR_CHECK(flush_stale(z));
    double local;
    ZR_CHECK(local_sumsq(z, &local));
    if (z->W > 1) { /* partitions are disjoint: the squares add up over ranks */
        zr_tensor *t = zr_tensor_scalar(local, ZR_F64, zr_cpu());
        if (!t) return ZR_ERR;
        zr_status st = zr_all_reduce(t, ZR_RED_SUM);
        if (!st) st = zr_tensor_get(t, 0, &local);
        zr_tensor_release(t);
        ZR_CHECK(st);
    }
    *norm = sqrt(local) * scale;
    return ZR_OK;
}

static zr_status regather_persistent(zr_zero *z) {
    for (int i = 0; i < z->n; i++) { /* persistent parameters stay whole: gather them afresh */
        if (!z->ps[i].persistent) continue;
        z->ps[i].gathered = 0;
        ZR_CHECK(zr_zero_gather(z, 1, &i));
    }
    return ZR_OK;
}

/* Master on the host: where the new weights (pdt, S elements in partition layout) are written
 * by the CPU pass: the parameters' flat buffer (direct mode on the CPU), a host shard (stage 3),
 * or the pinned host buffer that is then uploaded. NULL when they travel by all-gather instead
 * (stages 1–2 over several ranks). */
static zr_status host_weights_out(zr_zero *z, void **out) {
    *out = NULL;
    if (z->pdt != ZR_F32 && z->pdt != ZR_BF16 && z->pdt != ZR_F16) return ZR_OK; /* f64: generic copies */
    if (z->cfg.stage == 3 && zr_is_cpu(z->pshard)) *out = zr_tensor_data(z->pshard);
    else if (z->cfg.stage < 3 && z->W > 1) return ZR_OK;
    else if (z->direct) *out = zr_tensor_data(z->pflat);
    else if (!(*out = zr_offload_weights16(z->host))) return ZR_ERR;
    return ZR_OK;
}

/* Whether host_weights_out's buffer has to go to the device (not when the parameters or the
 * stage-3 shard live on the host and were written in place). */
static int uploads(const zr_zero *z) {
    return z->cfg.stage == 3 ? !zr_is_cpu(z->pshard) : !z->direct;
}

/* Async H2D of parameters k0 .. k1-1 from the weights buffer: into the shard at stage 3, into
 * each parameter otherwise. */
static zr_status upload_params(zr_zero *z, int k0, int k1) {
    if (z->cfg.stage < 3) {
        for (int i = k0; i < k1; i++) ZR_CHECK(zr_offload_upload(z->host, z->ps[i].p, z->ps[i].off, z->ps[i].n));
        return ZR_OK;
    }
    int64_t a = z->ps[k0].off, b = k1 < z->n ? z->ps[k1].off : z->S;
    zr_tensor *dst = flat_range(z->pshard, a, b - a);
    zr_status st = dst ? zr_offload_upload(z->host, dst, a, b - a) : ZR_ERR;
    zr_tensor_release(dst);
    return st;
}

/* After host_weights_out's buffer was written: the device gets it (async H2D that the compute
 * stream waits for). */
static zr_status host_weights_done(zr_zero *z) {
    if (uploads(z)) {
        ZR_CHECK(upload_params(z, 0, z->n));
        ZR_CHECK(zr_offload_upload_end(z->host));
    }
    return z->cfg.stage == 3 ? regather_persistent(z) : ZR_OK;
}

/* Parameters from the master partition: copy (stage 0), all-gather (1–2), or into the shard (3). */
zr_status zr_zero_refresh_params(zr_zero *z) {
    if (z->host && (z->cfg.stage == 3 || z->W == 1)) { /* one parallel cast on the host, then upload */
        void *out;
        ZR_CHECK(host_weights_out(z, &out));
        if (out) {
            ZR_CHECK(zr_offload_cast(z->host, out, zr_tensor_data(z->master)));
            return host_weights_done(z);
        }
    }
    if (z->cfg.stage == 3) {
        ZR_CHECK(copy_range(z->pshard, 0, z->master, 0, z->S));
        return regather_persistent(z);
    }
    if (z->W == 1) {
        for (int i = 0; i < z->n; i++) {
            zparam *q = &z->ps[i];
            ZR_CHECK(copy_range(q->p, 0, z->master, q->off, q->n));
        }
        return ZR_OK;
    }
    /* bucketed all-gather: send = my chunks (param dtype), recv = W segments */
    int64_t cap = z->cap;
    zr_tensor *send = new_buf(z->pdt, z->dev, cap, ZR_MEM_COMM);
    zr_tensor *recv = send ? new_buf(z->pdt, z->dev, cap * z->W, ZR_MEM_COMM) : NULL;
    zr_status st = recv ? ZR_OK : ZR_ERR;
    int first = 0;
    while (!st && first < z->n) {
        int last = first;
        int64_t L = 0;
        while (last < z->n && L + z->ps[last].c <= cap) L += z->ps[last++].c;
        st = copy_range(send, 0, z->master, z->ps[first].off, L);
        zr_tensor *in = st ? NULL : flat_range(send, 0, L), *out = st ? NULL : flat_range(recv, 0, L * z->W);
        if (!st) st = (in && out) ? zr_all_gather(out, in) : ZR_ERR;
        zr_tensor_release(in);
        zr_tensor_release(out);
        for (int i = first; i < last && !st; i++) {
            zparam *q = &z->ps[i];
            for (int r = 0; r < z->W && !st; r++)
                st = copy_range(q->p, (int64_t)r * q->c, recv, (int64_t)r * L + (q->off - z->ps[first].off),
                                valid_len(q->n, q->c, r));
        }
        first = last;
    }
    zr_tensor_release(send);
    zr_tensor_release(recv);
    return st;
}

zr_status zr_zero_step(zr_zero *z, double grad_scale, int64_t step, const zr_adamw_config *c,
                       const double *lr) {
    ZR_CHECK(flush_stale(z));
    if (!zr_is_cpu(z->master)) {
#ifdef ZR_HAVE_CUDA
        /* the scale rides into the kernel as a device scalar: no separate pass over the grads */
        zr_tensor *gs = zr_tensor_full(ZR_F32, zr_tensor_device(z->master), 0, NULL, grad_scale);
        if (!gs) return ZR_ERR;
        zr_adamw_segment *segs = malloc(sizeof *segs * (size_t)z->n);
        if (!segs) {
            zr_tensor_release(gs);
            return zr_error("out of host memory");
        }
        for (int i = 0; i < z->n; i++)
            segs[i] = (zr_adamw_segment){z->ps[i].off, z->ps[i].c, (float)z->ps[i].wd, (float)lr[i]};
        /* direct mode with 16-bit weights: the kernel writes them as it updates the master */
        int lp = z->direct && (z->pdt == ZR_BF16 || z->pdt == ZR_F16);
        int rc = adamw_step_cuda(zr_tensor_data(z->master), zr_tensor_data(z->m), zr_tensor_data(z->v),
                                 lp ? zr_tensor_data(z->pflat) : NULL, lp ? z->pdt : ZR_F32,
                                 zr_tensor_data(z->gpart), z->gdt, segs, z->n, c, step, zr_tensor_data(gs),
                                 zr_cuda_stream(zr_tensor_device(z->master)));
        free(segs);
        zr_tensor_release(gs);
        if (rc) return ZR_ERR;
        return lp ? ZR_OK : zr_zero_refresh_params(z);
#else
        return zr_no_cuda("ZeRO optimizer step");
#endif
    }
    /* master on the host: one fused pass scales the gradients, updates master and moments, and
     * writes the new weights where the parameters read them, or into the buffer to upload */
    void *out;
    ZR_CHECK(host_weights_out(z, &out));
    if (!out || !uploads(z)) {
        ZR_CHECK(zr_offload_adamw(z->host, zr_tensor_data(z->master), zr_tensor_data(z->m), zr_tensor_data(z->v),
                                  grad_scale, step, c, lr, out));
        zr_status st = out ? host_weights_done(z) : zr_zero_refresh_params(z);
        zr_offload_step_end(z->host);
        return st;
    }
    /* the new weights go to the device while AdamW updates the next parameters: groups of about
     * UPLOAD_GROUP elements, each uploaded (async, copy stream) as soon as it is written */
    enum { UPLOAD_GROUP = 1 << 24 };
    for (int k0 = 0; k0 < z->n;) {
        int k1 = k0;
        int64_t acc = 0;
        while (k1 < z->n && (k1 == k0 || acc + z->ps[k1].c <= UPLOAD_GROUP)) acc += z->ps[k1++].c;
        ZR_CHECK(zr_offload_adamw_range(z->host, k0, k1, zr_tensor_data(z->master), zr_tensor_data(z->m),
                                        zr_tensor_data(z->v), grad_scale, step, c, lr, out));
        ZR_CHECK(upload_params(z, k0, k1));
        k0 = k1;
    }
    ZR_CHECK(zr_offload_upload_end(z->host));
    zr_status st = z->cfg.stage == 3 ? regather_persistent(z) : ZR_OK;
    zr_offload_step_end(z->host);
    return st;
}

zr_status zr_zero_zero_grad(zr_zero *z) {
    if (z->direct) { /* gradients are views into gpart: no fill, the next ones overwrite instead */
        for (int i = 0; i < z->n; i++) z->ps[i].p->grad_stale = 1;
        return ZR_OK;
    }
    if (z->host) ZR_CHECK(zr_offload_grad_zero(z->host)); /* lazily, or a parallel fill */
    else ZR_CHECK(zr_tensor_fill_(z->gpart, 0));
    for (int i = 0; i < z->n; i++) {
        zr_tensor *g = z->ps[i].p->grad;
        if (g && z->cfg.stage <= 1) ZR_CHECK(zr_tensor_fill_(g, 0));
        else if (g) {
            zr_tensor_release(g);
            z->ps[i].p->grad = NULL;
        }
    }
    return ZR_OK;
}

/* --- stage 3 --- */

static void set_storage(zr_tensor *p, zr_storage *s, int ndim, const int64_t *shape) {
    zr_storage_release(p->storage);
    p->storage = s;
    p->offset = 0;
    p->ndim = ndim;
    int64_t st = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        p->shape[d] = shape[d];
        p->stride[d] = st;
        st *= shape[d];
    }
}

int zr_zero_is_gathered(const zr_zero *z, int i) { return z->ps[i].gathered; }
int64_t zr_zero_live_numel(const zr_zero *z) { return z->live; }

static zr_status check_index(const zr_zero *z, int i) {
    if (i < 0 || i >= z->n) return zr_error("ZeRO gather: parameter index %d out of range (1..%d)", i + 1, z->n);
    return ZR_OK;
}

/* Starts the all-gather of parameter i's chunks straight into its new storage (W chunks of c
 * elements: the parameter is the first n of them), async: on a GPU on the comm stream, with MPI
 * as a non-blocking collective. */
static zr_status start_gather(zr_zero *z, int i) {
    zparam *q = &z->ps[i];
    if (q->gathered || q->g_h) return ZR_OK;
    zr_tensor *out = new_buf(z->pdt, z->dev, q->c * z->W, ZR_MEM_PARAMS), *in = NULL;
    if (!out) return ZR_ERR;
    if (zr_device_eq(zr_tensor_device(z->pshard), z->dev)) {
        in = flat_range(z->pshard, q->off, q->c); /* the shard's slice itself: no copy */
    } else { /* offload_param: the shard is on the host; stage the slice on the device */
        in = new_buf(z->pdt, z->dev, q->c, ZR_MEM_COMM);
        if (in && copy_range(in, 0, z->pshard, q->off, q->c)) {
            zr_tensor_release(in);
            in = NULL;
        }
    }
    zr_comm_handle *h = in ? zr_all_gather_async(out, in) : NULL;
    zr_tensor_release(in);
    if (!h) {
        zr_tensor_release(out);
        return ZR_ERR;
    }
    q->g_out = out;
    q->g_h = h;
    if (!q->persistent) z->live += q->n;
    return ZR_OK;
}

/* Waits for parameter i's all-gather and makes the parameter whole. */
static zr_status finish_gather(zr_zero *z, int i) {
    zparam *q = &z->ps[i];
    zr_comm_handle *h = q->g_h;
    zr_tensor *out = q->g_out;
    q->g_h = NULL;
    q->g_out = NULL;
    zr_status st = zr_comm_wait(h);
    if (!st) {
        zr_storage_retain(out->storage);
        set_storage(q->p, out->storage, q->ndim, q->shape);
        q->gathered = 1;
    } else if (!q->persistent)
        z->live -= q->n;
    zr_tensor_release(out);
    return st;
}

zr_status zr_zero_gather(zr_zero *z, int n, const int *idx) {
    if (z->cfg.stage != 3) return ZR_OK;
    for (int k = 0; k < n; k++) { /* all of them in flight at once, then each completed */
        ZR_CHECK(check_index(z, idx[k]));
        ZR_CHECK(start_gather(z, idx[k]));
    }
    for (int k = 0; k < n; k++)
        if (z->ps[idx[k]].g_h) ZR_CHECK(finish_gather(z, idx[k]));
    return ZR_OK;
}

zr_status zr_zero_prefetch(zr_zero *z, int n, const int *idx, int64_t budget) {
    if (z->cfg.stage != 3) return ZR_OK;
    int64_t max_live = z->cfg.max_live_parameters > 0 ? z->cfg.max_live_parameters : INT64_MAX;
    for (int k = 0; k < n; k++) {
        ZR_CHECK(check_index(z, idx[k]));
        zparam *q = &z->ps[idx[k]];
        if (q->gathered || q->g_h) continue;
        if (q->n > budget || (!q->persistent && z->live + q->n > max_live)) break;
        budget -= q->n;
        ZR_CHECK(start_gather(z, idx[k]));
    }
    return ZR_OK;
}

zr_status zr_zero_release(zr_zero *z, int n, const int *idx) {
    if (z->cfg.stage != 3) return ZR_OK;
    for (int k = 0; k < n; k++) {
        ZR_CHECK(check_index(z, idx[k]));
        zparam *q = &z->ps[idx[k]];
        if (q->persistent) continue;
        if (q->g_h) { /* prefetched, never used: finish the collective (every rank takes part), drop it */
            zr_comm_handle *h = q->g_h;
            q->g_h = NULL;
            zr_status st = zr_comm_wait(h);
            zr_tensor_release(q->g_out);
            q->g_out = NULL;
            z->live -= q->n;
            ZR_CHECK(st);
            continue;
        }
        if (!q->gathered) continue;
        zr_storage *empty = zr_storage_new(z->dev, 0, ZR_MEM_PARAMS, 0);
        if (!empty) return ZR_ERR;
        int64_t zero = 0;
        set_storage(q->p, empty, 1, &zero);
        q->gathered = 0;
        z->live -= q->n;
    }
    return ZR_OK;
}

zr_status zr_zero_release_all(zr_zero *z) {
    for (int i = 0; i < z->n; i++) ZR_CHECK(zr_zero_release(z, 1, &i));
    return ZR_OK;
}
