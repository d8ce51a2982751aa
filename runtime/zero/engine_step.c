/* The ZeRO engine's optimizer step (zero/engine.h): on the parameters' device (CUDA kernels, or their
 * CPU twin), through the offload pipeline with the master on the host, or both (partial offload);
 * Lamb's two passes; then the new weights into the parameters (copy, all-gather or stage-3 shard). */
#include <stdlib.h>

#include "ops/util.h"
#include "zero/engine_internal.h"
#ifdef ZR_HAVE_CUDA
#include "cuda/device.h"
#include "kernels/cuda/optim.h"
#endif

static zr_status regather_persistent(zr_zero *z) {
    if (z->direct) return ZR_OK; /* the parameters are views into pflat: nothing was released */
    for (int i = 0; i < z->nparams;
         i++) { /* persistent parameters stay whole: gather them afresh */
        if (!z->params[i].persistent) continue;
        z->params[i].gathered = 0;
        ZR_CHECK(zr_zero_gather(z, 1, &i));
    }
    return ZR_OK;
}

/* Master on the host: where the new weights (param_dtype, partition layout) go. *out: a host
 * buffer written in place (the parameters' flat buffer in direct mode, the host shard at stage 3
 * with offload_param). *sink: uploaded chunk by chunk from the pipeline's ring (one rank's whole
 * parameters at stages 0–2, the device shard at stage 3). Neither: they travel by all-gather from
 * master (stages 1–2 over several ranks) or by generic copies (f64). */
static void weights_target(zr_zero *z, void **out, int *sink) {
    *out = NULL;
    *sink = 0;
    if (z->param_dtype != ZR_F32 && z->param_dtype != ZR_BF16 && z->param_dtype != ZR_F16) return;
    zr_tensor *flat = flat_weights(z); /* written in place on the host, else uploaded into */
    if (flat && zr_is_cpu(flat)) *out = zr_tensor_data(flat);
    else if (flat || z->chunks == 1) *sink = 1;
}

/* The pipeline's sink: partition elements [a, a+n) (w: their new weights, host) into the device
 * shard (stage 3) or into the parameters they belong to (one chunk per parameter: partition
 * offsets are parameter offsets). Async H2D on the offload upload stream. */
static zr_status put_weights(void *ctx, zr_offload *o, int64_t a, int64_t n, const void *w) {
    zr_zero *z = ctx;
    zr_tensor *flat = flat_weights(z);
    if (flat) {
        zr_tensor *dst = flat_range(flat, a, n);
        zr_status st = dst ? zr_offload_put(o, dst, w, n) : ZR_ERR;
        zr_tensor_release(dst);
        return st;
    }
    size_t es = zr_dtype_size(z->param_dtype);
    for (int i = zero_param_at(z, a); i < z->nparams && z->params[i].offset < a + n; i++) {
        zparam *q = &z->params[i];
        int64_t lo = q->offset > a ? q->offset : a, hi = q->offset + q->numel < a + n ? q->offset + q->numel : a + n;
        if (hi <= lo) continue;
        zr_tensor *dst = flat_range(q->p, lo - q->offset, hi - lo);
        zr_status st = dst ? zr_offload_put(o, dst, (const char *)w + (size_t)(lo - a) * es, hi - lo) : ZR_ERR;
        zr_tensor_release(dst);
        ZR_CHECK(st);
    }
    return ZR_OK;
}

static zr_adamw_segment *lamb_segments(const zr_zero *z, const double *lr);
static zr_status lamb_sums_all(zr_zero *z);

/* Partial offload: the device part's new weights (from dmaster, cast on the device) into the
 * shard (stage 3) or into the parameters (one chunk per parameter), where the pipeline puts the
 * host part's; stages 1-2 over several ranks all-gather both parts from the masters instead. */
static zr_status split_weights(zr_zero *z) {
    if (!z->split) return ZR_OK;
    if (flat_weights(z)) return zero_state_get(z, 0, flat_weights(z), 0, 0, z->split);
    if (z->chunks > 1) return ZR_OK;
    for (int i = 0; i < z->nparams && z->params[i].offset < z->split; i++) {
        zparam *q = &z->params[i];
        int64_t n = z->split - q->offset < q->numel ? z->split - q->offset : q->numel;
        ZR_CHECK(zero_state_get(z, 0, q->p, 0, q->offset, n));
    }
    return ZR_OK;
}

/* Master on the host: one pass of the offload pipeline over the host part of the partition
 * (optimizer c, or NULL: only the weights from master), the new weights written in place or
 * uploaded, and the device part's weights (split_weights); then what follows them (stage-3
 * persistent parameters regathered, or the all-gather of stages 1–2). */
static zr_status host_pass(zr_zero *z, double grad_scale, int64_t step, const zr_adamw_config *c,
                           const double *lr) {
    void *out;
    int sink;
    weights_target(z, &out, &sink);
    if (!c && !out && !sink) return ZR_OK;
    if (out) ZR_CHECK(zero_shard_idle(z)); /* the host shard is rewritten in place */
    zr_offload_pass pass = {z->grads_dev ? z->gpart : NULL, zr_tensor_data(z->master), state_data(z->m),
                            state_data(z->v), z->split, grad_scale, step, c, lr, out, sink ? put_weights : NULL,
                            z, z->split, z->part_numel, 0, NULL, NULL, z->master_dtype, z->state_dtype};
    if (c && c->kind == ZR_OPTIM_LAMB) { /* the moments and norms, the sums over ranks, then the update */
        if (!z->lamb_sums && !(z->lamb_sums = new_buf(ZR_F64, zr_cpu(), 2 * (int64_t)z->nparams, ZR_MEM_WORKSPACE)))
            return ZR_ERR;
        zr_adamw_segment *segs = lamb_segments(z, lr);
        if (!segs) return ZR_ERR;
        zr_offload_pass first = pass;
        first.out = NULL, first.sink = NULL, first.lamb = 1, first.lamb_sums = zr_tensor_data(z->lamb_sums);
        first.lamb_segs = segs;
        pass.lamb = 2, pass.lamb_sums = first.lamb_sums, pass.lamb_segs = segs;
        zr_status st = zr_tensor_fill_(z->lamb_sums, 0);
        if (!st) st = zr_offload_run(z->host, &first);
        if (!st) st = lamb_sums_all(z);
        if (!st) st = zr_offload_run(z->host, &pass);
        free(segs);
        ZR_CHECK(st);
    } else
        ZR_CHECK(zr_offload_run(z->host, &pass));
    if (out || sink) {
        ZR_CHECK(split_weights(z));
        return z->cfg.stage == 3 ? regather_persistent(z) : ZR_OK;
    }
    return zr_zero_refresh_params(z);
}

/* Over several ranks (stages 1-2): every rank's partition of new weights into the whole parameters,
 * by bucketed all-gather. w: the partition's weights (param dtype, partition layout), or NULL: the
 * master's. */
zr_status zero_allgather_weights(zr_zero *z, zr_tensor *w) {
    /* bucketed all-gather (allgather_bucket_size): send = my chunks (param dtype), recv = `chunks` segments */
    int64_t cap = z->gather_cap;
    zr_tensor *send = new_buf(z->param_dtype, z->dev, cap, ZR_MEM_COMM);
    zr_tensor *recv = send ? new_buf(z->param_dtype, z->dev, cap * z->chunks, ZR_MEM_COMM) : NULL;
    zr_status st = recv ? ZR_OK : ZR_ERR;
    int first = 0;
    while (!st && first < z->nparams) {
        int last = first;
        int64_t L = 0;
        while (last < z->nparams && L + z->params[last].chunk <= cap)
            L += z->params[last++].chunk;
        st = w ? zero_copy_range(send, 0, w, z->params[first].offset, L)
               : zero_state_get(z, 0, send, 0, z->params[first].offset, L);
        zr_tensor *in = st ? NULL : flat_range(send, 0, L),
                  *out = st ? NULL : flat_range(recv, 0, L * z->chunks);
        if (!st) zero_label_params(z, "updated weights", first, last - 1);
        if (!st) st = (in && out) ? zr_all_gather(out, in) : ZR_ERR;
        zr_tensor_release(in);
        zr_tensor_release(out);
        for (int i = first; i < last && !st; i++) {
            zparam *q = &z->params[i];
            for (int r = 0; r < z->chunks && !st; r++)
                st = zero_copy_range(q->p, (int64_t)r * q->chunk, recv,
                                (int64_t)r * L + (q->offset - z->params[first].offset),
                                valid_len(q->numel, q->chunk, r));
        }
        first = last;
    }
    zr_tensor_release(send);
    zr_tensor_release(recv);
    return st;
}

/* Parameters from the master partition: copy (stage 0), all-gather (1–2), or into the shard (3). */
zr_status zr_zero_refresh_params(zr_zero *z) {
    if (z->host && (z->cfg.stage == 3 || z->chunks == 1)) { /* parallel casts on the host, uploaded */
        void *out;
        int sink;
        weights_target(z, &out, &sink);
        if (out || sink) return host_pass(z, 1, 0, NULL, NULL);
    }
    if (z->cfg.stage == 3 && !z->direct) {
        ZR_CHECK(zero_shard_idle(z));
        ZR_CHECK(zero_state_get(z, 0, z->pshard, 0, 0, z->part_numel));
        return regather_persistent(z);
    }
    if (z->chunks == 1) {
        for (int i = 0; i < z->nparams; i++) {
            zparam *q = &z->params[i];
            ZR_CHECK(zero_state_get(z, 0, q->p, 0, q->offset, q->numel));
        }
        return ZR_OK;
    }
    return zero_allgather_weights(z, NULL);
}

/* Lamb's segments: this rank's valid piece of each parameter (padding excluded, so that it never
 * counts in a norm), with the parameter's weight decay and lr. malloc'ed; NULL with an error. */
static zr_adamw_segment *lamb_segments(const zr_zero *z, const double *lr) {
    zr_adamw_segment *segs = malloc(sizeof *segs * (size_t)(z->nparams ? z->nparams : 1));
    if (!segs) return zr_error_null("out of host memory");
    const int r = z->chunks > 1 ? z->cfg.rank : 0;
    for (int i = 0; i < z->nparams; i++) {
        const zparam *q = &z->params[i];
        segs[i] = (zr_adamw_segment){q->offset, valid_len(q->numel, q->chunk, r), (float)q->wd, (float)lr[i]};
    }
    return segs;
}

/* After Lamb's first pass: every rank's sums of its pieces added up, so that each parameter's trust
 * ratio is that of the whole tensor on every rank (one all-reduce of 2 nparams doubles). */
static zr_status lamb_sums_all(zr_zero *z) {
    if (z->chunks == 1) return ZR_OK;
    zr_comm_label("Lamb trust-ratio norms of %d params", z->nparams);
    return zr_all_reduce(z->lamb_sums, ZR_RED_SUM);
}

#ifdef ZR_HAVE_CUDA
/* Lamb with the master on the GPU: both passes, the sums all-reduced in between (NCCL). gs: the
 * device scalar grad scale; lp: the 16-bit weights (direct mode) or NULL. */
static zr_status lamb_step_dev(zr_zero *z, const zr_adamw_config *c, int64_t step, const double *lr, zr_tensor *gs,
                               void *lp) {
    zr_device dev = zr_tensor_device(z->master);
    cudaStream_t stream = zr_cuda_stream(dev);
    if (!z->lamb_sums && !(z->lamb_sums = new_buf(ZR_F64, dev, 2 * (int64_t)z->nparams, ZR_MEM_WORKSPACE)))
        return ZR_ERR;
    zr_adamw_segment *segs = lamb_segments(z, lr);
    if (!segs) return ZR_ERR;
    int64_t nw = lamb_workspace_cuda(segs, z->nparams);
    zr_tensor *ws = zr_tensor_new_cat(ZR_F64, dev, 1, &nw, ZR_MEM_WORKSPACE, 0);
    zr_status st = ws ? ZR_OK : ZR_ERR;
    if (!st && lamb_sums_cuda(zr_tensor_data(z->master), zr_tensor_data(z->m), zr_tensor_data(z->v),
                              zr_tensor_data(z->gpart), z->grad_dtype, segs, z->nparams, c, zr_tensor_data(gs),
                              zr_tensor_data(z->lamb_sums), zr_tensor_data(ws), stream))
        st = ZR_ERR;
    zr_tensor_release(ws);
    if (!st) st = lamb_sums_all(z);
    if (!st && lamb_apply_cuda(zr_tensor_data(z->master), zr_tensor_data(z->m), zr_tensor_data(z->v), lp,
                               lp ? z->param_dtype : ZR_F32, segs, z->nparams, c, step, zr_tensor_data(z->lamb_sums),
                               stream))
        st = ZR_ERR;
    free(segs);
    return st;
}
#endif

/* The optimizer on partition elements [0, hi) whose master and states (master, m, v) live on the
 * parameters' device: the whole partition without offload, the device part with a split. Every
 * parameter's segment clipped to hi, its own lr and weight decay; gradients from gpart. lp: a flat
 * 16-bit copy of the weights written as the master is updated (direct mode), or NULL. On a GPU the
 * CUDA kernels, async on the compute stream; on a CPU run (where the device part of a partial
 * offload lives on the CPU too) the same segments through their CPU twin, zr_offload_update. */
static zr_status device_step(zr_zero *z, zr_tensor *master, zr_tensor *m, zr_tensor *v, int64_t hi, void *lp,
                             double grad_scale, int64_t step, const zr_adamw_config *c, const double *lr) {
    zr_adamw_segment *segs = malloc(sizeof *segs * (size_t)z->nparams);
    if (!segs) return zr_error("out of host memory");
    int n = 0;
    for (int i = 0; i < z->nparams && z->params[i].offset < hi; i++) {
        int64_t len = hi - z->params[i].offset < z->params[i].chunk ? hi - z->params[i].offset : z->params[i].chunk;
        segs[n++] = (zr_adamw_segment){z->params[i].offset, len, (float)z->params[i].wd, (float)lr[i]};
    }
    zr_status st = ZR_OK;
    zr_dtype lp_dt = lp ? z->param_dtype : ZR_F32;
    if (zr_is_cpu(master) && (z->master_dtype != ZR_F32 || z->state_dtype != ZR_F32)) {
        /* only the device part of a partial offload comes here on a CPU run (zr_zero_new refuses it) */
        free(segs);
        return zr_error("ZeRO: bf16 master weights or optimizer states with offload_optimizer.ratio < 1: set ratio 1");
    }
    if (zr_is_cpu(master)) {
        size_t ge = zr_dtype_size(z->grad_dtype), we = zr_dtype_size(lp_dt);
        const char *g = zr_tensor_data(z->gpart);
        float *pm = zr_tensor_data(master), *mm = state_data(m), *vm = state_data(v);
        for (int k = 0; k < n; k++) { /* segment k is parameter k's; lr and wd in double, as the pipeline */
            int64_t o = segs[k].offset;
            zr_offload_update(pm + o, mm ? mm + o : NULL, vm ? vm + o : NULL, g + (size_t)o * ge, z->grad_dtype,
                              segs[k].n, lp ? (char *)lp + (size_t)o * we : NULL, lp_dt, c, lr[k], z->params[k].wd,
                              grad_scale, step);
        }
        free(segs);
        return ZR_OK;
    }
#ifdef ZR_HAVE_CUDA
    /* the scale rides into the kernel as a device scalar: no separate pass over the grads */
    zr_tensor *gs = zr_tensor_full(ZR_F32, zr_tensor_device(master), 0, NULL, grad_scale);
    cudaStream_t stream = zr_cuda_stream(zr_tensor_device(master));
    if (!gs) st = ZR_ERR;
    else if (c->kind != ZR_OPTIM_ADAMW)
        st = optim_step_cuda(zr_tensor_data(master), state_data(m), lp, lp_dt, zr_tensor_data(z->gpart),
                             z->grad_dtype, segs, n, c, step, zr_tensor_data(gs), stream) ? ZR_ERR : ZR_OK;
    else if (z->master_dtype != ZR_F32 || z->state_dtype != ZR_F32)
        st = adamw_lp_step_cuda(zr_tensor_data(master), z->master_dtype, zr_tensor_data(m), zr_tensor_data(v),
                                z->state_dtype, lp, zr_tensor_data(z->gpart), z->grad_dtype, segs, n, c, step,
                                zr_tensor_data(gs), stream) ? ZR_ERR : ZR_OK;
    else
        st = adamw_step_cuda(zr_tensor_data(master), state_data(m), state_data(v), lp, lp_dt,
                             zr_tensor_data(z->gpart), z->grad_dtype, segs, n, c, step, zr_tensor_data(gs),
                             stream) ? ZR_ERR : ZR_OK;
    zr_tensor_release(gs);
#else
    st = zr_no_cuda("ZeRO optimizer step");
#endif
    free(segs);
    return st;
}

zr_status zr_zero_step(zr_zero *z, double grad_scale, int64_t step, const zr_adamw_config *c,
                       const double *lr) {
    ZR_CHECK(zero_flush_stale(z));
    if (c->kind != z->cfg.optimizer) {
        static const char *const names[] = {"AdamW", "Lion", "Adagrad", "SGD", "Lamb"};
        const int k = c->kind, e = z->cfg.optimizer;
        return zr_error("ZeRO: a %s step on an engine built for %s (its states are that optimizer's)",
                        k >= 0 && k < 5 ? names[k] : "unknown optimizer", e >= 0 && e < 5 ? names[e] : "?");
    }
    if (z->split && c->kind == ZR_OPTIM_LAMB)
        return zr_error("Lamb with offload_optimizer.ratio < 1 is not supported (each trust ratio needs the norms "
                        "of both parts): set offload_optimizer.ratio to 1");
    if (!zr_is_cpu(z->master)) {
        /* direct mode with 16-bit weights: the kernel writes them as it updates the master */
        int lp = z->direct && (z->param_dtype == ZR_BF16 || z->param_dtype == ZR_F16);
        if (c->kind == ZR_OPTIM_LAMB) { /* two passes with the norms' sums in between */
#ifdef ZR_HAVE_CUDA
            zr_tensor *gs = zr_tensor_full(ZR_F32, zr_tensor_device(z->master), 0, NULL, grad_scale);
            zr_status st = gs ? lamb_step_dev(z, c, step, lr, gs, lp ? zr_tensor_data(z->pflat) : NULL) : ZR_ERR;
            zr_tensor_release(gs);
            ZR_CHECK(st);
#else
            return zr_no_cuda("ZeRO optimizer step");
#endif
        } else
            ZR_CHECK(device_step(z, z->master, z->m, z->v, z->part_numel, lp ? zr_tensor_data(z->pflat) : NULL,
                                 grad_scale, step, c, lr));
        return lp ? ZR_OK : zr_zero_refresh_params(z);
    }
    /* Partial offload: the device part's kernels are queued first; the host part's gradient copies
     * start after backward (the mark), not after them, so both parts are updated at once. */
    if (z->split) {
        ZR_CHECK(zr_offload_mark(z->host));
        ZR_CHECK(device_step(z, z->dmaster, z->dm, z->dv, z->split, NULL, grad_scale, step, c, lr));
    }
    /* master on the host: the offload pipeline (zero/offload.h) scales the gradients, updates
     * master and moments chunk by chunk, and writes the new weights in place or uploads them */
    zr_status st = host_pass(z, grad_scale, step, c, lr);
    zr_offload_step_end(z->host);
    return st;
}
