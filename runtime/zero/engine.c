/* ZeRO engine (see zero/engine.h): per-parameter chunk layout and set-up, the optimizer states'
 * checkpoint access, bucketed reduce-scatter / all-reduce of gradients and their norm, and stage-3
 * gather/release of parameters. The optimizer step is engine_step.c, ZenFlow's background step
 * engine_async.c. Device-agnostic: tensors move through the tensor API and collectives through
 * comm.h (MPI on the CPU, NCCL on GPUs). */
#include "zero/engine_internal.h"

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
#include "kernels/cuda/zero_ops.h"
#endif

typedef struct {
    zr_zero *z;
    int i;
} hook_ctx;

/* The parameter holding partition element `off` (direct mode: one chunk per parameter). */
int zero_param_at(const zr_zero *z, int64_t off) {
    int lo = 0, hi = z->nparams - 1; /* the last parameter starting at or before off */
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        if (z->params[mid].offset <= off) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* Names parameters a..b (indices) in the next collective's timeout and debug messages. */
void zero_label_params(const zr_zero *z, const char *what, int a, int b) {
    char x[24], y[24];
    snprintf(x, sizeof x, "param %d", a + 1);
    snprintf(y, sizeof y, "param %d", b + 1);
    const char *na = z->names && z->names[a] ? z->names[a] : x, *nb = z->names && z->names[b] ? z->names[b] : y;
    if (a == b) zr_comm_label("%s %s", what, na);
    else zr_comm_label("%s of %d params %s..%s", what, (a < b ? b - a : a - b) + 1, na, nb);
}

zr_status zero_copy_range(zr_tensor *dst, int64_t doff, zr_tensor *src, int64_t soff, int64_t len) {
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

/* The device and host parts of state st (0 master, 1 m, 2 v). */
static zr_tensor *dev_state(const zr_zero *z, int st) { return st == 0 ? z->dmaster : st == 1 ? z->dm : z->dv; }
static zr_tensor *host_state(const zr_zero *z, int st) { return st == 0 ? z->master : st == 1 ? z->m : z->v; }

/* How many of partition elements [off, off+len) lie in the device part (below split). */
static int64_t dev_share(const zr_zero *z, int64_t off, int64_t len) {
    return off >= z->split ? 0 : off + len <= z->split ? len : z->split - off;
}

/* dst[doff : doff+len] = state st's partition elements [off, off+len), read from the device part
 * below split and from the host part above it (cast to dst's dtype, across devices if needed). */
zr_status zero_state_get(zr_zero *z, int st, zr_tensor *dst, int64_t doff, int64_t off, int64_t len) {
    int64_t a = dev_share(z, off, len);
    ZR_CHECK(zero_copy_range(dst, doff, dev_state(z, st), off, a));
    return zero_copy_range(dst, doff + a, host_state(z, st), off + a - z->split, len - a);
}

/* The reverse: state st's partition elements [off, off+len) = src[soff : soff+len]. */
static zr_status state_put(zr_zero *z, int st, int64_t off, zr_tensor *src, int64_t soff, int64_t len) {
    int64_t a = dev_share(z, off, len);
    ZR_CHECK(zero_copy_range(dev_state(z, st), off, src, soff, a));
    return zero_copy_range(host_state(z, st), off + a - z->split, src, soff + a, len - a);
}

/* dst[doff:+len] += src[soff:+len], across devices if needed. Into the host gradient partition
 * (master on the host) through zero/offload.c, found from dst itself so that callers stay as
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
zr_status zero_flush_stale(zr_zero *z) {
    if (!z->direct) return ZR_OK;
    for (int i = 0; i < z->nparams; i++) {
        zparam *q = &z->params[i];
        if (!q->p->grad_stale) continue;
        ZR_CHECK(fill_range(z->gpart, q->offset, q->chunk, 0));
        q->p->grad_stale = 0;
    }
    return ZR_OK;
}

/* Partial offload's boundary for offload_optimizer.ratio r: the first (1 - r) x S partition
 * elements stay on the device, as DeepSpeed keeps the first int((1 - r) x n) of its n sub-groups on
 * the GPU. Moved to the nearest parameter boundary when one lies within 2% of the partition (so
 * parameters stay whole), else cut there (one parameter then has part of its states on each side:
 * the optimizer is elementwise, so nothing else changes). */
static int64_t split_point(const zr_zero *z, double r) {
    const int64_t S = z->part_numel, t = (int64_t)floor((1 - r) * (double)S);
    if (t <= 0 || t >= S) return t <= 0 ? 0 : S;
    int64_t best = S;
    for (int i = 0; i < z->nparams; i++) {
        int64_t b = z->params[i].offset;
        if (llabs(b - t) < llabs(best - t)) best = b;
    }
    return llabs(best - t) * 50 <= S ? best : t;
}

static void hook(zr_tensor *leaf, void *ctx);

/* Page-locks the host gradient partition (host-gradient mode), which bucket copies from the GPU
 * land in by DMA. Only DMA needs page-locked memory: the master and the optimizer states are read
 * and written by the CPU alone (the step's copies go through offload.c's pinned ring and staging,
 * and any other copy to or from them is staged by the tensor copy), so they stay pageable. */
static zr_status pin(zr_zero *z) {
#ifdef ZR_HAVE_CUDA
    zr_tensor *g = z->gpart;
    if (!zr_is_cpu(g) || !g->storage->nbytes) return ZR_OK; /* device-gradient mode */
    ZR_CHECK(zr_cuda_page_lock(g->storage->data, g->storage->nbytes, "offload_optimizer.pin_memory",
                               "the host gradient partition"));
    z->pinned = 1;
#endif
    return ZR_OK;
}
/* offload_param.pin_memory on a GPU: page-locks the host parameter shard, so that each gathered
 * slice goes up by DMA beside the compute (shard_upload) instead of through the driver's pageable
 * staging, which waits for the compute stream and runs at a fraction of the link's rate. */
static zr_status pin_shard(zr_zero *z) {
#ifdef ZR_HAVE_CUDA
    zr_tensor *t = z->pshard;
    if (!zr_is_cpu(t) || !t->storage->nbytes || z->dev.type != ZR_CUDA) return ZR_OK;
    ZR_CHECK(zr_cuda_page_lock(t->storage->data, t->storage->nbytes, "offload_param.pin_memory",
                               "the host parameter shard"));
    z->pshard_pinned = 1;
    if (!(z->pshard_ev = zr_cuda_event_new(0))) return ZR_ERR;
#endif
    return ZR_OK;
}

zr_status zero_shard_idle(zr_zero *z) {
#ifdef ZR_HAVE_CUDA
    if (z->pshard_ev) return zr_cuda_event_sync((cudaEvent_t)z->pshard_ev);
#endif
    (void)z;
    return ZR_OK;
}

static void unpin(zr_zero *z) {
#ifdef ZR_HAVE_CUDA
    if (z->pinned) cudaHostUnregister(z->gpart->storage->data);
    if (z->pshard_ev) {
        zero_shard_idle(z); /* no DMA still reading the shard */
        zr_cuda_event_free((cudaEvent_t)z->pshard_ev);
    }
    if (z->pshard_pinned) cudaHostUnregister(z->pshard->storage->data);
    z->pshard_ev = NULL;
    z->pshard_pinned = 0;
#endif
    z->pinned = 0;
}

/* Direct mode: parameter i's .grad is gpart[offset : offset+numel] viewed with its shape. */
static zr_status attach_grad(zr_zero *z, int i) {
    zparam *q = &z->params[i];
    zr_tensor *g = q->p->grad;
    if (g && g->storage == z->gpart->storage) return ZR_OK;
    int64_t st[ZR_MAX_DIMS], s = 1;
    for (int d = q->ndim - 1; d >= 0; d--) {
        st[d] = s;
        s *= q->shape[d];
    }
    zr_tensor *v =
        zr_tensor_as_strided(z->gpart, q->ndim, q->shape, st, z->gpart->offset + q->offset);
    if (!v) return ZR_ERR;
    zr_tensor_release(q->p->grad);
    q->p->grad = v;
    return ZR_OK;
}

/* Direct mode set-up: one flat buffer holds every parameter (each a view at its offset; the
 * parameters' own storage is freed as it goes). Before the gradient partition is made, so that
 * the set-up peak is the flat copy or the partition, not both. */
static zr_status flatten_params(zr_zero *z) {
    z->pflat = new_buf(z->param_dtype, z->dev, z->part_numel, ZR_MEM_PARAMS);
    if (!z->pflat) return ZR_ERR;
    for (int i = 0; i < z->nparams; i++) {
        zparam *q = &z->params[i];
        ZR_CHECK(zero_copy_range(z->pflat, q->offset, q->p, 0, q->numel));
        zr_storage_retain(z->pflat->storage);
        zr_storage_release(q->p->storage);
        q->p->storage = z->pflat->storage;
        q->p->offset = q->offset;
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
    z->cfg.names = NULL;
    if (cfg->names) {
        z->names = calloc((size_t)n, sizeof *z->names);
        for (int i = 0; z->names && i < n; i++)
            z->names[i] = cfg->names[i] ? strdup(cfg->names[i]) : NULL;
    }
    z->chunks = cfg->stage == 0 ? 1 : cfg->world_size;
    z->nparams = n;
    z->params = calloc((size_t)n, sizeof *z->params);
    z->bucket_param = calloc((size_t)n, sizeof *z->bucket_param);
    z->bucket_off = calloc((size_t)n, sizeof *z->bucket_off);
    z->bucket_len = calloc((size_t)n, sizeof *z->bucket_len);
    z->bucket_place = calloc((size_t)n, sizeof *z->bucket_place);
    if (!z->params || !z->bucket_param || !z->bucket_off || !z->bucket_len || !z->bucket_place) {
        zr_zero_free(z);
        return zr_error_null("out of host memory");
    }
    z->dev = zr_tensor_device(params[0]);
    z->param_dtype = params[0]->dtype;
    /* one process communicates nothing: its bucket only stages gradients (fp32, so that offload's
     * first copy of a step lands straight in the partition) */
    z->comm_dtype = cfg->world_size <= 1   ? ZR_F32
                    : cfg->comm_dtype >= 0 ? (zr_dtype)cfg->comm_dtype
                                           : z->param_dtype;
    z->opt_dev = cfg->offload_optimizer ? zr_cpu() : z->dev;
    z->grad_dtype = cfg->grad_dtype >= 0 ? (zr_dtype)cfg->grad_dtype : ZR_F32;
    if (z->grad_dtype != ZR_F32 && (z->grad_dtype != ZR_BF16 && z->grad_dtype != ZR_F16)) {
        zr_zero_free(z);
        return zr_error_null(
            "ZeRO: data_types.grad_accum_dtype must be fp32, bf16 or fp16 (got %s)",
            zr_dtype_name(z->grad_dtype));
    }
    z->master_dtype = cfg->master_dtype == ZR_BF16 ? ZR_BF16 : ZR_F32;
    z->state_dtype = cfg->state_dtype == ZR_BF16 ? ZR_BF16 : ZR_F32;
    if ((cfg->master_dtype != ZR_F32 && cfg->master_dtype != ZR_BF16) ||
        (cfg->state_dtype != ZR_F32 && cfg->state_dtype != ZR_BF16)) {
        zr_zero_free(z);
        return zr_error_null("ZeRO: the master weights and optimizer states are f32 or bf16");
    }
    if (z->master_dtype == ZR_BF16 || z->state_dtype == ZR_BF16) {
        const char *why = cfg->optimizer != ZR_OPTIM_ADAMW ? "AdamW (optimizer type Adam or AdamW)"
                          : z->param_dtype != ZR_BF16 ? "bf16 parameters (bf16.enabled)"
                          : z->state_dtype == ZR_BF16 && z->master_dtype != ZR_BF16 ? "a bf16 master"
                          : cfg->offload_optimizer && cfg->offload_ratio < 1 ? "offload_optimizer.ratio 1"
                          : NULL;
        if (why) {
            zr_zero_free(z);
            return zr_error_null("ZeRO: bf16 master weights or optimizer states (bf16.bf16_master_weights_and_grads, "
                                 "bf16_optimizer_states) need %s", why);
        }
    }
    z->grads_dev = cfg->offload_optimizer && cfg->offload_grads_on_device;
    if (cfg->offload_optimizer && !(cfg->offload_ratio >= 0 && cfg->offload_ratio <= 1)) {
        zr_zero_free(z);
        return zr_error_null("ZeRO: offload_optimizer.ratio must be between 0 and 1, got %g", cfg->offload_ratio);
    }
    if (cfg->offload_optimizer && cfg->offload_ratio < 1 && !z->grads_dev) {
        zr_zero_free(z);
        return zr_error_null("ZeRO: offload_optimizer.ratio = %g keeps part of the optimizer on the device, which "
                             "reads the gradient partition there: set offload_grads_on_device (ZRUN_OFFLOAD_GRADS "
                             "device) or ratio 1", cfg->offload_ratio);
    }
    /* with offload_optimizer the host gradient partition may be 16-bit too (zero/offload.c rounds
     * each addition as a device partition would) */
    if (z->grad_dtype != ZR_F32 && z->opt_dev.type != ZR_CUDA && !z->grads_dev && !cfg->offload_optimizer &&
        z->master_dtype == ZR_F32) { /* a bf16 master keeps bf16 gradients on a CPU run too */
        const char *dt = z->grad_dtype == ZR_BF16 ? "bf16" : "fp16";
        zr_zero_free(z);
        return zr_error_null("ZeRO: data_types.grad_accum_dtype=%s needs the optimizer states on a GPU; here they "
                             "are on the host (a CPU run): remove grad_accum_dtype (fp32 gradients) or keep the "
                             "optimizer on the GPU", dt);
    }
    /* Stage 3 in one process with the parameters on their device: the shard would be the whole
     * model, so gathering and releasing would only copy it back and forth (and keep it twice).
     * The engine runs in direct mode instead and every parameter stays resident.
     * ZRUN_STAGE3_GATHER=1 keeps the partitioned path (gather, release, prefetch) in one process,
     * to see what a rank of a multi-rank run does (the memory tests use it). */
    const char *g3 = getenv("ZRUN_STAGE3_GATHER");
    const int solo3 = cfg->stage == 3 && z->chunks == 1 && !cfg->offload_param &&
                      zr_device_eq(z->opt_dev, z->dev) && !(g3 && *g3 && strcmp(g3, "0") != 0);
    for (int i = 0; i < n; i++) {
        zr_tensor *p = params[i];
        char b[192];
        if (!zr_tensor_is_contiguous(p) || p->grad_fn) {
            zr_zero_free(z);
            return zr_error_null("ZeRO: parameter %d (%s) must be a contiguous leaf tensor", i + 1, zr_tensor_describe(p, b));
        }
        if (!zr_device_eq(zr_tensor_device(p), z->dev) || p->dtype != z->param_dtype) {
            char b0[192];
            zr_zero_free(z);
            return zr_error_null("ZeRO: all parameters must share one device and dtype: parameter 1 is %s, "
                                 "parameter %d is %s", zr_tensor_describe(params[0], b0), i + 1, zr_tensor_describe(p, b));
        }
        zparam *q = &z->params[i];
        q->p = zr_tensor_retain(p);
        q->numel = zr_tensor_numel(p);
        q->chunk = (q->numel + z->chunks - 1) / z->chunks;
        q->offset = z->part_numel;
        q->ndim = p->ndim;
        memcpy(q->shape, p->shape, sizeof q->shape);
        q->wd = wd ? wd[i] : 0;
        q->gathered = 1;
        q->persistent = cfg->stage == 3 && (q->numel < cfg->persistence_threshold || solo3);
        if (!q->persistent) z->live += q->numel;
        z->part_numel += q->chunk;
        if (q->chunk > z->max_chunk) z->max_chunk = q->chunk;
    }
    if (z->chunks > 1 && z->part_numel < 1) {
        zr_zero_free(z);
        return zr_error_null("ZeRO: nothing to partition");
    }
    /* Every rank starts from rank 0's weights, as DeepSpeed broadcasts the module at start. */
    if (cfg->world_size > 1)
        for (int i = 0; i < n; i++) {
            zero_label_params(z, "initial weights of", i, i);
            if (zr_broadcast(z->params[i].p, 0)) goto fail;
        }
    z->split = cfg->offload_optimizer ? split_point(z, cfg->offload_ratio) : 0;
    const int64_t hn = z->part_numel - z->split; /* host part (all of it without a split) */
    z->master = new_buf(z->master_dtype, z->opt_dev, hn, ZR_MEM_OPTIMIZER);
    /* only the states the optimizer keeps: AdamW m and v; Lion, Adagrad, SGD with momentum m */
    z->nstates = zr_optim_states(cfg->optimizer, cfg->momentum);
    if (z->nstates >= 1) z->m = new_buf(z->state_dtype, z->opt_dev, hn, ZR_MEM_OPTIMIZER);
    if (z->nstates >= 2) z->v = new_buf(z->state_dtype, z->opt_dev, hn, ZR_MEM_OPTIMIZER);
    if (z->split) {
        z->dmaster = new_buf(ZR_F32, z->dev, z->split, ZR_MEM_OPTIMIZER);
        if (z->nstates >= 1) z->dm = new_buf(ZR_F32, z->dev, z->split, ZR_MEM_OPTIMIZER);
        if (z->nstates >= 2) z->dv = new_buf(ZR_F32, z->dev, z->split, ZR_MEM_OPTIMIZER);
        if (!z->dmaster || (z->nstates >= 1 && !z->dm) || (z->nstates >= 2 && !z->dv)) goto fail;
    }
    if (!z->master || (z->nstates >= 1 && !z->m) || (z->nstates >= 2 && !z->v)) goto fail;
    if (cfg->optimizer == ZR_OPTIM_ADAGRAD && cfg->initial_accumulator_value != 0 &&
        (zr_tensor_fill_(z->m, cfg->initial_accumulator_value) ||
         (z->dm && zr_tensor_fill_(z->dm, cfg->initial_accumulator_value))))
        goto fail;
    int r = z->chunks > 1 ? cfg->rank : 0;
    for (int i = 0; i < n; i++) {
        zparam *q = &z->params[i];
        if (state_put(z, 0, q->offset, q->p, (int64_t)r * q->chunk, valid_len(q->numel, q->chunk, r)))
            goto fail;
    }
    /* direct also with optimizer offload when the gradients stay on the device (gpart is there) */
    z->direct = z->chunks == 1 && (cfg->stage <= 2 || solo3) && (zr_device_eq(z->opt_dev, z->dev) || z->grads_dev);
    if (z->direct && flatten_params(z)) goto fail;
    z->gpart = new_buf(z->grad_dtype, z->grads_dev ? z->dev : z->opt_dev, z->part_numel, ZR_MEM_GRADS);
    if (!z->gpart) goto fail;
    for (int i = 0; z->direct && i < n; i++)
        if (attach_grad(z, i)) goto fail;
    if (cfg->offload_optimizer && cfg->pin_memory && z->dev.type == ZR_CUDA && pin(z)) goto fail;
    z->bucket_cap = cfg->reduce_bucket_size / z->chunks;
    if (z->bucket_cap < z->max_chunk) z->bucket_cap = z->max_chunk;
    if (z->bucket_cap > z->part_numel) z->bucket_cap = z->part_numel;
    /* the stage 1-2 all-gather of the new weights, allgather_bucket_size elements at a time (all ranks'
     * segments together, as reduce_bucket_size), at least one parameter's chunk */
    z->gather_cap = cfg->allgather_bucket_size / z->chunks;
    if (z->gather_cap < z->max_chunk) z->gather_cap = z->max_chunk;
    if (z->gather_cap > z->part_numel) z->gather_cap = z->part_numel;
    if (z->opt_dev.type == ZR_CPU) { /* gradients, norm, AdamW and weights back through zero/offload.c */
        zr_offload_segment *segs = malloc(sizeof *segs * (size_t)n);
        if (!segs) {
            zr_error("out of host memory");
            goto fail;
        }
        for (int i = 0; i < n; i++)
            segs[i] =
                (zr_offload_segment){z->params[i].offset, z->params[i].chunk, z->params[i].wd};
        /* direct mode: gpart holds the parameters' .grad views, so it is zeroed for real */
        z->host = zr_offload_new(z->part_numel, z->grads_dev ? NULL : z->gpart, z->dev, z->param_dtype, n, segs,
                                 z->bucket_cap, cfg->pin_memory && z->dev.type == ZR_CUDA, !z->direct);
        free(segs);
        if (!z->host) goto fail;
    }
    if (!z->direct) { /* direct mode reduces gpart in place: no buckets */
        z->send = new_buf(z->comm_dtype, z->dev, z->bucket_cap * z->chunks, ZR_MEM_COMM);
        z->compact = z->chunks > 1
                         ? new_buf(z->comm_dtype, z->dev, z->bucket_cap * z->chunks, ZR_MEM_COMM)
                         : NULL;
        z->recv = z->chunks > 1 ? new_buf(z->comm_dtype, z->dev, z->bucket_cap, ZR_MEM_COMM) : NULL;
        if (!z->send || (z->chunks > 1 && (!z->compact || !z->recv))) goto fail;
        if (cfg->overlap_comm && z->chunks > 1) {
            z->send2 = new_buf(z->comm_dtype, z->dev, z->bucket_cap * z->chunks, ZR_MEM_COMM);
            z->compact2 = new_buf(z->comm_dtype, z->dev, z->bucket_cap * z->chunks, ZR_MEM_COMM);
            z->recv2 = new_buf(z->comm_dtype, z->dev, z->bucket_cap, ZR_MEM_COMM);
            z->pending_param = calloc((size_t)n, sizeof *z->pending_param);
            z->pending_off = calloc((size_t)n, sizeof *z->pending_off);
            z->pending_len = calloc((size_t)n, sizeof *z->pending_len);
            z->pending_place = calloc((size_t)n, sizeof *z->pending_place);
            if (!z->send2 || !z->compact2 || !z->recv2 || !z->pending_param || !z->pending_off ||
                !z->pending_len || !z->pending_place)
                goto fail;
        }
    }
    for (int i = 0; i < n; i++) {
        zparam *q = &z->params[i];
        hook_ctx *h = malloc(sizeof *h);
        if (!h) goto fail;
        h->z = z;
        h->i = i;
        zr_tensor_set_grad_hook(q->p, hook, h, free);
        if (cfg->stage <= 1 && !z->direct) { /* gradients accumulate in the parameters' .grad (fp32, or
                                                * data_types.grad_accum_dtype) */
            zr_tensor_release(q->p->grad);
            q->p->grad =
                zr_tensor_new_cat(z->grad_dtype, z->dev, q->ndim, q->shape, ZR_MEM_GRADS, 1);
            if (!q->p->grad) goto fail;
        }
    }
    if (cfg->stage == 3 && !z->direct) {
        zr_device sdev = cfg->offload_param ? zr_cpu() : z->dev;
        z->pshard = new_buf(z->param_dtype, sdev, z->part_numel, ZR_MEM_PARAMS);
        if (!z->pshard) goto fail;
        for (int i = 0; i < n; i++) {
            zparam *q = &z->params[i];
            if (zero_copy_range(z->pshard, q->offset, q->p, (int64_t)r * q->chunk,
                           valid_len(q->numel, q->chunk, r)))
                goto fail;
        }
        if (cfg->offload_param && cfg->param_pin_memory && pin_shard(z)) goto fail;
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
    for (int i = 0; i < z->nparams; i++) {
        if (!z->params[i].p) continue;
        if (z->params[i].g_h) zr_comm_wait(z->params[i].g_h); /* a prefetch still in flight */
        zr_tensor_release(z->params[i].g_out);
        zr_tensor_set_grad_hook(z->params[i].p, NULL, NULL, NULL);
        zr_tensor_release(z->params[i].p);
    }
    zero_async_free(z); /* before all: the background step reads the master, the moments and the ring */
    zr_offload_free(z->host); /* first: it waits for copies into gpart and its own buffers */
    unpin(z);
    zr_tensor_release(z->master);
    zr_tensor_release(z->m);
    zr_tensor_release(z->v);
    zr_tensor_release(z->lamb_sums);
    zr_tensor_release(z->dmaster);
    zr_tensor_release(z->dm);
    zr_tensor_release(z->dv);
    zr_tensor_release(z->gpart);
    zr_tensor_release(z->pshard);
    zr_tensor_release(z->pflat);
    if (z->pending_handle)
        zr_comm_wait(z->pending_handle); /* never free buffers a collective still uses */
    zr_tensor_release(z->send);
    zr_tensor_release(z->compact);
    zr_tensor_release(z->recv);
    zr_tensor_release(z->send2);
    zr_tensor_release(z->compact2);
    zr_tensor_release(z->recv2);
    free(z->pending_param);
    free(z->pending_off);
    free(z->pending_len);
    free(z->pending_place);
    free(z->params);
    free(z->bucket_param);
    free(z->bucket_off);
    free(z->bucket_len);
    for (int i = 0; z->names && i < z->nparams; i++)
        free(z->names[i]);
    free(z->names);
    free(z->bucket_place);
    free(z);
}

int64_t zr_zero_partition_numel(const zr_zero *z) {
    return z->part_numel;
}
int zr_zero_num_params(const zr_zero *z) {
    return z->nparams;
}
void zr_zero_param_layout(const zr_zero *z, int i, int64_t *offset, int64_t *chunk) {
    *offset = z->params[i].offset;
    *chunk = z->params[i].chunk;
}
int zr_zero_num_states(const zr_zero *z) {
    return z->nstates;
}
zr_tensor *zr_zero_state(zr_zero *z, int which) {
    if (which == 3 && zero_flush_stale(z)) return NULL;
    if (which == 3 && z->host && zr_offload_grad_sync(z->host)) return NULL; /* lazily zeroed ranges (host mode) */
    zr_tensor *t = which == 0 ? z->master : which == 1 ? z->m : which == 2 ? z->v : z->gpart;
    if (!z->split || which == 3 || !t) return zr_tensor_retain(t);
    zr_tensor *out = new_buf(ZR_F32, zr_cpu(), z->part_numel, ZR_MEM_WORKSPACE); /* both parts, joined */
    if (out && !zero_state_get(z, which, out, 0, 0, z->part_numel)) return out;
    zr_tensor_release(out);
    return NULL;
}

zr_status zr_zero_set_state(zr_zero *z, int which, zr_tensor *t) {
    zr_tensor *h = which >= 0 && which <= 2 ? host_state(z, which) : NULL;
    char b[192];
    if (!h) return zr_error("ZeRO set_state: no optimizer state %d here (0 master, then the optimizer's %d)", which, z->nstates);
    if (!zr_tensor_is_contiguous(t) || zr_tensor_numel(t) != z->part_numel)
        return zr_error("ZeRO set_state: expected %lld contiguous elements (the partition), got %s",
                        (long long)z->part_numel, zr_tensor_describe(t, b));
    if (t == h) return ZR_OK;
    return state_put(z, which, 0, t, 0, z->part_numel);
}

int64_t zr_zero_split(const zr_zero *z) { return z->split; }

/* --- gradient buckets --- */

/* overlap_comm: waits for the bucket in flight and adds its reduced segment into the partition. */
static zr_status complete_pending(zr_zero *z) {
    if (!z->pending_handle) return ZR_OK;
    zr_comm_handle *h = z->pending_handle;
    z->pending_handle = NULL;
    ZR_CHECK(zr_comm_wait(h));
    for (int k = 0; k < z->pending_pieces; k++)
        ZR_CHECK(add_range(z->gpart, z->params[z->pending_param[k]].offset + z->pending_off[k],
                           z->pending_result, z->pending_place[k], z->pending_len[k]));
    z->pending_pieces = 0;
    return ZR_OK;
}

static void swap_tensors(zr_tensor **a, zr_tensor **b) {
    zr_tensor *t = *a;
    *a = *b;
    *b = t;
}

static zr_status flush(zr_zero *z) {
    if (z->bucket_pieces == 0) return ZR_OK;
    if (z->cfg.world_size > 1) /* a single process reduces nothing: no label to leave behind */
        zero_label_params(z, "grad bucket", z->bucket_param[0], z->bucket_param[z->bucket_pieces - 1]);
    int64_t L = z->bucket_fill;
    zr_tensor *red = z->send; /* where the reduced segment of this rank ends up */
    if (z->chunks == 1) {
        zr_tensor *s = flat_range(z->send, 0, L);
        zr_status st = s ? (z->cfg.world_size > 1 ? zr_all_reduce(s, ZR_RED_SUM) : ZR_OK) : ZR_ERR;
        zr_tensor_release(s);
        ZR_CHECK(st);
    } else {
        zr_tensor *src = z->send;
        if (L < z->bucket_cap) { /* gather the `chunks` used prefixes into one buffer */
            for (int r = 0; r < z->chunks; r++)
                ZR_CHECK(
                    zero_copy_range(z->compact, (int64_t)r * L, z->send, (int64_t)r * z->bucket_cap, L));
            src = z->compact;
        }
        zr_tensor *in = flat_range(src, 0, L * z->chunks), *out = flat_range(z->recv, 0, L);
        if (z->send2 && in && out) { /* overlap_comm: start it, finish the previous one, go on */
            zr_status st = complete_pending(z);
            zr_comm_handle *h = st ? NULL : zr_reduce_scatter_async(out, in, ZR_RED_SUM);
            zr_tensor_release(in);
            zr_tensor_release(out);
            if (!h) return ZR_ERR;
            z->pending_handle = h;
            z->pending_result = z->recv;
            memcpy(z->pending_param, z->bucket_param,
                   sizeof *z->pending_param * (size_t)z->bucket_pieces);
            memcpy(z->pending_off, z->bucket_off,
                   sizeof *z->pending_off * (size_t)z->bucket_pieces);
            memcpy(z->pending_len, z->bucket_len,
                   sizeof *z->pending_len * (size_t)z->bucket_pieces);
            memcpy(z->pending_place, z->bucket_place,
                   sizeof *z->pending_place * (size_t)z->bucket_pieces);
            z->pending_pieces = z->bucket_pieces;
            swap_tensors(&z->send, &z->send2); /* the next bucket fills the other buffers */
            swap_tensors(&z->compact, &z->compact2);
            swap_tensors(&z->recv, &z->recv2);
            z->bucket_pieces = 0;
            z->bucket_fill = 0;
            return ZR_OK;
        }
        zr_status st = (in && out) ? zr_reduce_scatter(out, in, ZR_RED_SUM) : ZR_ERR;
        zr_tensor_release(in);
        zr_tensor_release(out);
        ZR_CHECK(st);
        red = z->recv;
    }
    for (int k = 0; k < z->bucket_pieces; k++)
        ZR_CHECK(add_range(z->gpart, z->params[z->bucket_param[k]].offset + z->bucket_off[k], red,
                           z->bucket_place[k], z->bucket_len[k]));
    z->bucket_pieces = 0;
    z->bucket_fill = 0;
    return ZR_OK;
}

/* Copies parameter i's gradient chunks into the bucket. A chunk that does not fit is split: the
 * bucket is filled and flushed when full, so every bucket but a backward's last is reduced in
 * place, without the compaction copy a partly filled one needs. */
static zr_status pack(zr_zero *z, int i) {
    zparam *q = &z->params[i];
    zr_tensor *g = q->p->grad;
    if (!g || q->packed) return ZR_OK;
    zr_tensor *gc = zr_tensor_contiguous_raw(g);
    if (!gc) return ZR_ERR;
    zr_status st = ZR_OK;
    for (int64_t co = 0; co < q->chunk && !st;) {
        int64_t take = q->chunk - co < z->bucket_cap - z->bucket_fill
                           ? q->chunk - co
                           : z->bucket_cap - z->bucket_fill;
        for (int r = 0; r < z->chunks && !st;
             r++) { /* rank r's piece: its valid part, then zeros */
            int64_t v = valid_len(q->numel, q->chunk, r) - co,
                    base = (int64_t)r * z->bucket_cap + z->bucket_fill;
            v = v < 0 ? 0 : v > take ? take : v;
            st = zero_copy_range(z->send, base, gc, (int64_t)r * q->chunk + co, v);
            if (!st) st = fill_range(z->send, base + v, take - v, 0);
        }
        if (st) break;
        z->bucket_param[z->bucket_pieces] = i;
        z->bucket_off[z->bucket_pieces] = co;
        z->bucket_len[z->bucket_pieces] = take;
        z->bucket_place[z->bucket_pieces++] = z->bucket_fill;
        z->bucket_fill += take;
        co += take;
        if (z->bucket_fill == z->bucket_cap) st = flush(z);
    }
    zr_tensor_release(gc);
    ZR_CHECK(st);
    q->packed = 1;
    if (z->cfg.stage >= 2 && !z->cfg.keep_grads) { /* the partition keeps it now */
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
    for (int i = 0; i < z->nparams; i++) {
        z->params[i].packed = 0;
        if (z->direct) ZR_CHECK(attach_grad(z, i)); /* someone may have set .grad to nil */
        else if (z->cfg.keep_grads && z->cfg.stage == 2) { /* the last micro-step's, already reduced */
            zr_tensor_release(z->params[i].p->grad);
            z->params[i].p->grad = NULL;
        }
    }
    return ZR_OK;
}

zr_status zr_zero_backward_end(zr_zero *z) {
    if (hook_error) {
        hook_error = ZR_OK;
        return zr_error("ZeRO gradient reduction during backward failed: %s", hook_msg);
    }
    if (z->cfg.stage < 2 || z->direct) return ZR_OK;
    for (int i = z->nparams - 1; i >= 0; i--)
        ZR_CHECK(pack(z, i)); /* grads whose hook did not fire */
    ZR_CHECK(flush(z));
    ZR_CHECK(complete_pending(z));
    if (z->cfg.stage == 3) ZR_CHECK(zr_zero_release_all(z));
    return ZR_OK;
}

zr_status zr_zero_reduce(zr_zero *z) {
    ZR_CHECK(zero_flush_stale(z));
    if (z->direct) { /* gradients already sit in gpart: sum them over ranks in place (stage 0) */
        if (z->cfg.world_size == 1) return ZR_OK;
        int64_t cap = z->cfg.reduce_bucket_size > 0 ? z->cfg.reduce_bucket_size : z->part_numel;
        for (int64_t a = 0; a < z->part_numel; a += cap) {
            int64_t len = a + cap < z->part_numel ? cap : z->part_numel - a;
            zr_tensor *b = flat_range(z->gpart, a, len);
            zero_label_params(z, "grads", zero_param_at(z, a), zero_param_at(z, a + len - 1));
            zr_status st = b ? zr_all_reduce(b, ZR_RED_SUM) : ZR_ERR;
            zr_tensor_release(b);
            ZR_CHECK(st);
        }
        return ZR_OK;
    }
    if (z->cfg.stage >= 2) return ZR_OK;
    for (int i = 0; i < z->nparams; i++)
        z->params[i].packed = 0;
    for (int i = z->nparams - 1; i >= 0; i--)
        ZR_CHECK(pack(z, i));
    ZR_CHECK(flush(z));
    return complete_pending(z);
}

/* Sum of squares of this rank's reduced gradient partition. */
static zr_status local_sumsq(zr_zero *z, double *out) {
#ifdef ZR_HAVE_CUDA
    if (!zr_is_cpu(z->gpart)) { /* one read of the partition, no squared temporary */
        int64_t nw = (int64_t)zero_sumsq_workspace(z->part_numel);
        zr_tensor *ws = zr_tensor_new_cat(ZR_F64, zr_tensor_device(z->gpart), 1, &nw, ZR_MEM_WORKSPACE, 0);
        if (!ws) return ZR_ERR;
        double *w = zr_tensor_data(ws);
        zr_status st =
            zero_sumsq_cuda(w + nw - 1, zr_tensor_data(z->gpart), z->grad_dtype, z->part_numel, w,
                            zr_cuda_stream(zr_tensor_device(z->gpart)));
        if (!st) st = zr_tensor_get(ws, nw - 1, out);
        zr_tensor_release(ws);
        return st;
    }
#endif
    /* host partition: one parallel read in double (waits for gradient copies still in flight) */
    return z->grads_dev ? zr_offload_sumsq_tensor(z->gpart, out) : zr_offload_sumsq(z->host, out);
}

zr_status zr_zero_grad_norm(zr_zero *z, double scale, double *norm) {
    ZR_CHECK(zero_flush_stale(z));
    double local;
    ZR_CHECK(local_sumsq(z, &local));
    if (z->chunks > 1) { /* partitions are disjoint: the squares add up over ranks */
        zr_tensor *t = zr_tensor_scalar(local, ZR_F64, zr_cpu());
        if (!t) return ZR_ERR;
        zr_comm_label("gradient norm");
        zr_status st = zr_all_reduce(t, ZR_RED_SUM);
        if (!st) st = zr_tensor_get(t, 0, &local);
        zr_tensor_release(t);
        ZR_CHECK(st);
    }
    *norm = sqrt(local) * scale;
    return ZR_OK;
}

zr_status zr_zero_zero_grad(zr_zero *z) {
    if (z->direct) { /* gradients are views into gpart: no fill, the next ones overwrite instead */
        for (int i = 0; i < z->nparams; i++)
            z->params[i].p->grad_stale = 1;
        return ZR_OK;
    }
    if (z->host && !z->grads_dev) ZR_CHECK(zr_offload_grad_zero(z->host)); /* lazily, or a parallel fill */
    else ZR_CHECK(zr_tensor_fill_(z->gpart, 0));
    for (int i = 0; i < z->nparams; i++) {
        zr_tensor *g = z->params[i].p->grad;
        if (g && z->cfg.stage <= 1) ZR_CHECK(zr_tensor_fill_(g, 0));
        else if (g) {
            zr_tensor_release(g);
            z->params[i].p->grad = NULL;
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

int zr_zero_is_gathered(const zr_zero *z, int i) {
    return z->params[i].gathered;
}
int64_t zr_zero_live_numel(const zr_zero *z) { return z->live; }
int zr_zero_is_resident(const zr_zero *z) { return z->cfg.stage == 3 && z->direct; }
int zr_zero_shard_pinned(const zr_zero *z) { return z->pshard_pinned; }

static zr_status check_index(const zr_zero *z, int i) {
    if (i < 0 || i >= z->nparams)
        return zr_error("ZeRO gather: parameter index %d out of range (1..%d)", i + 1, z->nparams);
    return ZR_OK;
}

/* offload_param: shard elements [off, off+n) into the device buffer in. From the page-locked shard a
 * DMA on the comm stream, queued after the compute work so far (in's memory may have been that
 * work's), so that the all-gather after it on that stream reads it while compute goes on (a prefetch
 * overlaps); its event lets the step wait before rewriting the shard. Pageable: the generic copy. */
static zr_status shard_upload(zr_zero *z, zr_tensor *in, int64_t off, int64_t n) {
#ifdef ZR_HAVE_CUDA
    if (z->pshard_pinned) {
        const char *op = "offload_param: parameter upload";
        cudaStream_t cs = zr_cuda_stream(z->dev), ms = zr_cuda_comm_stream(z->dev);
        cudaEvent_t ev = (cudaEvent_t)z->pshard_ev;
        size_t es = zr_dtype_size(z->param_dtype);
        ZR_CHECK(zr_cuda_event_record(ev, cs));
        ZR_CHECK(zr_cuda_stream_wait(ms, ev));
        ZR_CHECK(ZR_CUDA_CHECK(cudaMemcpyAsync(zr_tensor_data(in), (const char *)zr_tensor_data(z->pshard) + off * es,
                                               (size_t)n * es, cudaMemcpyHostToDevice, ms),
                               op));
        return zr_cuda_event_record(ev, ms);
    }
#endif
    return zero_copy_range(in, 0, z->pshard, off, n);
}

/* Starts the all-gather of parameter i's chunks straight into its new storage (`chunks` chunks
 * of `chunk` elements: the parameter is the first `numel` of them), async: on a GPU on the comm stream, with MPI
 * as a non-blocking collective. */
static zr_status start_gather(zr_zero *z, int i) {
    zparam *q = &z->params[i];
    if (q->gathered || q->g_h) return ZR_OK;
    zr_tensor *out = new_buf(z->param_dtype, z->dev, q->chunk * z->chunks, ZR_MEM_PARAMS),
              *in = NULL;
    if (!out) return ZR_ERR;
    if (zr_device_eq(zr_tensor_device(z->pshard), z->dev)) {
        in = flat_range(z->pshard, q->offset, q->chunk); /* the shard's slice itself: no copy */
    } else { /* offload_param: the shard is on the host; stage the slice on the device */
        in = new_buf(z->param_dtype, z->dev, q->chunk, ZR_MEM_COMM);
        if (in && shard_upload(z, in, q->offset, q->chunk)) {
            zr_tensor_release(in);
            in = NULL;
        }
    }
    zero_label_params(z, "stage 3 gather of", i, i);
    zr_comm_handle *h = in ? zr_all_gather_async(out, in) : NULL;
    zr_tensor_release(in);
    if (!h) {
        zr_tensor_release(out);
        return ZR_ERR;
    }
    q->g_out = out;
    q->g_h = h;
    if (!q->persistent) z->live += q->numel;
    return ZR_OK;
}

/* Waits for parameter i's all-gather and makes the parameter whole. */
static zr_status finish_gather(zr_zero *z, int i) {
    zparam *q = &z->params[i];
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
        z->live -= q->numel;
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
        if (z->params[idx[k]].g_h) ZR_CHECK(finish_gather(z, idx[k]));
    return ZR_OK;
}

zr_status zr_zero_prefetch(zr_zero *z, int n, const int *idx, int64_t budget) {
    if (z->cfg.stage != 3) return ZR_OK;
    /* DeepSpeed's rule (partitioned_param_coordinator.py fetch_sub_module): the parameters in order
     * while the elements started so far are below min(budget, max_live - live), so the one that
     * crosses the bound still starts: a parameter larger than the budget (HF's "auto" bucket,
     * 0.9 hidden^2, is below one q/k/v or MLP weight) is prefetched alone. */
    const int64_t room = z->cfg.max_live_parameters > 0 ? z->cfg.max_live_parameters - z->live : INT64_MAX;
    const int64_t limit = budget < room ? budget : room;
    int64_t started = 0;
    for (int k = 0; k < n; k++) {
        ZR_CHECK(check_index(z, idx[k]));
        zparam *q = &z->params[idx[k]];
        if (q->gathered || q->g_h) continue;
        if (started >= limit) break;
        started += q->numel;
        ZR_CHECK(start_gather(z, idx[k]));
    }
    return ZR_OK;
}

zr_status zr_zero_release(zr_zero *z, int n, const int *idx) {
    if (z->cfg.stage != 3) return ZR_OK;
    for (int k = 0; k < n; k++) {
        ZR_CHECK(check_index(z, idx[k]));
        zparam *q = &z->params[idx[k]];
        if (q->persistent) continue;
        if (q->g_h) { /* prefetched, never used: finish the collective (every rank takes part), drop it */
            zr_comm_handle *h = q->g_h;
            q->g_h = NULL;
            zr_status st = zr_comm_wait(h);
            zr_tensor_release(q->g_out);
            q->g_out = NULL;
            z->live -= q->numel;
            ZR_CHECK(st);
            continue;
        }
        if (!q->gathered) continue;
        zr_storage *empty = zr_storage_new(z->dev, 0, ZR_MEM_PARAMS, 0);
        if (!empty) return ZR_ERR;
        int64_t zero = 0;
        set_storage(q->p, empty, 1, &zero);
        q->gathered = 0;
        z->live -= q->numel;
    }
    return ZR_OK;
}

zr_status zr_zero_release_all(zr_zero *z) {
    for (int i = 0; i < z->nparams; i++)
        ZR_CHECK(zr_zero_release(z, 1, &i));
    return ZR_OK;
}
