/* Cross-entropy: forward and backward side by side (see cross_entropy.h). Saved for backward: the
 * logits, the per-row logsumexp (N values, compute dtype) and the targets as i64; with inplace,
 * only the gradient the forward wrote over the logits and the seed it was made for. */
#include "ops/cross_entropy.h"

#include <math.h>
#include <string.h>

#include "ops/elementwise.h"
#include "ops/util.h"

/* The loss is f32 for 16-bit logits (f64 for f64): Hugging Face computes cross-entropy on
 * logits.float(), so a bf16 model still reports (and logs) an unrounded loss. The gradient
 * returned to the logits is in their own dtype. */
static zr_dtype loss_dtype(zr_dtype logits) { return logits == ZR_F64 ? ZR_F64 : ZR_F32; }

int zr_loss_reduction_parse(const char *s) {
    if (!s) return -1;
    if (strcmp(s, "none") == 0) return ZR_LOSS_NONE;
    if (strcmp(s, "mean") == 0) return ZR_LOSS_MEAN;
    if (strcmp(s, "sum") == 0) return ZR_LOSS_SUM;
    return -1;
}

/* saved: logits, lse (N) in the compute dtype, targets (N) i64.
 * i[0] = ignore_index, i[1] = reduction, i[2] = number of non-ignored targets; f[0] = eps. */
static zr_status cross_entropy_backward(zr_node *n, zr_tensor *g, zr_tensor **gin) {
    zr_tensor *x = n->saved[0], *lse = n->saved[1], *tgt = n->saved[2];
    zr_edge *e = &n->edges[0];
    int64_t c = e->ndim ? e->shape[e->ndim - 1] : 1, rows = zr_tensor_numel(tgt);
    int red = (int)n->i[1];
    double scale = 1;
    zr_dtype ct = lse->dtype;
    zr_tensor *gi = NULL;
    if (red == ZR_LOSS_NONE) {
        if (!(gi = zr_cpu_in(g, ct))) return ZR_ERR;
    } else {
        if (zr_tensor_get(g, 0, &scale)) return ZR_ERR;
        if (red == ZR_LOSS_MEAN) scale /= (double)n->i[2]; /* n_valid == 0: every row is skipped */
    }
    zr_tensor *gx = zr_tensor_new_cat(e->dtype, zr_tensor_device(x), e->ndim, e->shape, ZR_MEM_ACTIVATIONS, 0);
    zr_tensor *xi = gx ? zr_cpu_in(x, ct) : NULL, *o = xi ? zr_cpu_out_begin(gx, ct) : NULL;
    zr_status st = ZR_ERR;
    if (o) {
        ZR_CPU_CALL(ct, cross_entropy_backward_cpu, zr_tensor_data(o), zr_tensor_data(xi),
                    zr_tensor_data(lse), (const int64_t *)zr_tensor_data(tgt),
                    gi ? zr_tensor_data(gi) : NULL, scale, rows, c, n->i[0], n->f[0]);
        st = zr_cpu_out_end(gx, o);
    }
    zr_tensor_release(xi);
    zr_tensor_release(gi);
    return zr_give_grad(gin, gx, st);
}

/* inplace (CPU): saved[0] is the logits' storage, now holding the gradient made in the forward for
 * the seed f[1] (zr_loss_grad_hint, in the loss dtype). The seed that comes is handed on as it is
 * when it equals f[1]; otherwise the gradient is rescaled in place and f[1] becomes that seed (so a
 * retain_graph backward may come again; after a seed of exactly 0 the gradient is gone, and a
 * further backward through the graph gives NaN, on CUDA too). As cross_entropy_backward_fused. */
static zr_status cross_entropy_backward_inplace(zr_node *n, zr_tensor *g, zr_tensor **gin) {
    zr_tensor *d = n->saved[0];
    double seed;
    if (zr_tensor_get(g, 0, &seed)) return ZR_ERR;
    if (seed != n->f[1]) {
        if (zr_mul_scalar_(d, seed / n->f[1])) return ZR_ERR;
        n->f[1] = seed;
    }
    gin[0] = zr_tensor_retain(d);
    return ZR_OK;
}

static zr_status check_args(const zr_tensor *logits, const zr_tensor *targets, double eps) {
    char b1[128], b2[128];
    if (zr_check_float("cross_entropy", logits)) return ZR_ERR;
    if (targets->dtype != ZR_I64 && targets->dtype != ZR_I32)
        return zr_error("cross_entropy: targets must be i64 or i32 class indices, got %s",
                        zr_dtype_name(targets->dtype));
    if (zr_check_same_device("cross_entropy", 2, (zr_tensor *[]){(zr_tensor *)logits, (zr_tensor *)targets}))
        return ZR_ERR;
    int ok = logits->ndim >= 1 && targets->ndim == logits->ndim - 1;
    for (int i = 0; ok && i < targets->ndim; i++) ok = targets->shape[i] == logits->shape[i];
    if (!ok)
        return zr_error("cross_entropy: logits %s and targets %s do not match: expected logits "
                        "(N, C) with targets (N), or (..., C) with targets (...)",
                        zr_tensor_shape_str(logits, b1), zr_tensor_shape_str(targets, b2));
    if (!(eps >= 0 && eps <= 1))
        return zr_error("cross_entropy: label_smoothing must be in [0, 1], got %g", eps);
    return ZR_OK;
}

/* --- CUDA path (kernels/cuda/cross_entropy.h): fused, no second (N, C) tensor in forward; the
 * backward writes softmax - onehot straight into the gradient. With inplace (and a forward that
 * will be recorded) the forward writes the gradient for the hinted seed (zr_loss_grad_hint: 1 by
 * default, the engine's 1/gas x loss scale) over the logits in the same pass (one read of the
 * logits and one write in all, not two reads and a write to a new buffer) and backward only
 * rescales it for another seed. Logits stay in their dtype (f32,
 * bf16, f16). Nothing waits for the GPU: the count of non-ignored targets stays on the device
 * (saved for backward), and targets are not range-checked on the host — an out-of-range target
 * gives a NaN loss (and a zero-free gradient row) instead of the CPU's error. Label smoothing is
 * in the kernels (in f32: eps/C off every class, 1 - eps on the target), in all three paths. --- */
#ifdef ZR_HAVE_CUDA
#include "cuda/device.h"
#include "kernels/cuda/cross_entropy.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/reduce.h"

/* saved: logits (contiguous), lse (N) f32, targets (N) i64, n_valid (0-dim f32).
 * i[0] = ignore_index, i[1] = reduction; f[0] = label smoothing. */
static zr_status cross_entropy_backward_dev(zr_node *n, zr_tensor *g, zr_tensor **gin) {
    zr_tensor *x = n->saved[0], *lse = n->saved[1], *tgt = n->saved[2], *nv = n->saved[3];
    zr_edge *e = &n->edges[0];
    zr_device dev = zr_tensor_device(x);
    int64_t c = x->shape[x->ndim - 1], rows = zr_tensor_numel(tgt);
    int red = (int)n->i[1];
    cudaStream_t s = zr_cuda_stream(dev);
    zr_tensor *dl = zr_tensor_to_raw(g, ZR_F32, dev), *q = NULL, *gx = NULL;
    zr_status st = ZR_ERR;
    if (!dl) goto done;
    if (red == ZR_LOSS_MEAN) { /* dloss = g / n_valid, a device scalar */
        int64_t one = 1;
        if (!(q = zr_tensor_new_cat(ZR_F32, dev, 0, NULL, ZR_MEM_WORKSPACE, 0))) goto done;
        if (zr_dev_status(binary_forward_cuda(zr_tensor_data(q), zr_tensor_data(dl), &one, zr_tensor_data(nv), &one,
                                              1, &one, ZR_BIN_DIV, ZR_F32, s),
                          "cross_entropy backward", dev))
            goto done;
    }
    gx = zr_tensor_new_cat(x->dtype, dev, x->ndim, x->shape, ZR_MEM_ACTIVATIONS, 0);
    if (!gx) goto done;
    if (zr_dev_status(cross_entropy_backward_cuda(zr_tensor_data(gx), zr_tensor_data(x), zr_tensor_data(tgt),
                                                  zr_tensor_data(lse), zr_tensor_data(q ? q : dl),
                                                  red == ZR_LOSS_NONE ? 1 : 0, rows, c, n->i[0], (float)n->f[0],
                                                  x->dtype, s),
                      "cross_entropy backward", dev))
        goto done;
    if (gx->dtype != e->dtype || gx->ndim != e->ndim) {
        zr_tensor *r = zr_tensor_new_cat(e->dtype, dev, e->ndim, e->shape, ZR_MEM_ACTIVATIONS, 0);
        if (!r || zr_tensor_copy_(r, gx)) {
            zr_tensor_release(r);
            goto done;
        }
        zr_tensor_release(gx);
        gx = r;
    }
    gin[0] = gx;
    gx = NULL;
    st = ZR_OK;
done:
    zr_tensor_release(dl);
    zr_tensor_release(q);
    zr_tensor_release(gx);
    return st;
}

/* inplace: the gradient made during the forward (cross_entropy_fused_cuda) over the logits for
 * the upstream gradient the hint promised; saved: that gradient (the logits' storage, dtype and
 * shape) and the hint it was made for (0-dim f32). When another gradient comes, one pass rescales it in place (and records the new
 * factor, so a backward with retain_graph may run again); when the same comes, nothing runs. */
static zr_status cross_entropy_backward_fused(zr_node *n, zr_tensor *g, zr_tensor **gin) {
    zr_tensor *d = n->saved[0], *baked = n->saved[1];
    zr_device dev = zr_tensor_device(d);
    zr_tensor *gi = zr_tensor_to_raw(g, ZR_F32, dev);
    if (!gi) return ZR_ERR;
    zr_status st = zr_dev_status(cross_entropy_rescale_cuda(zr_tensor_data(d), zr_tensor_numel(d), zr_tensor_data(gi),
                                                            zr_tensor_data(baked), d->dtype, zr_cuda_stream(dev)),
                                 "cross_entropy backward", dev);
    zr_tensor_release(gi);
    if (st) return st;
    gin[0] = zr_tensor_retain(d);
    return ZR_OK;
}
zr_status zr_cross_entropy_sum_dev(zr_tensor *sum, zr_tensor *loss) {
    int64_t rows = zr_tensor_numel(loss);
    zr_device dev = zr_tensor_device(loss);
    if (rows == 0) return zr_tensor_fill_(sum, 0);
    size_t wsz = reduce_sum_rows_cuda_workspace(1, rows);
    zr_tensor *ws = wsz ? zr_tensor_new_cat(ZR_U8, dev, 1, (int64_t[]){(int64_t)wsz}, ZR_MEM_WORKSPACE, 0) : NULL;
    if (wsz && !ws) return ZR_ERR;
    int rc = reduce_sum_rows_cuda(zr_tensor_data(sum), zr_tensor_data(loss), 1, rows, 1.0, ws ? zr_tensor_data(ws) : NULL,
                                  ZR_F32, zr_cuda_stream(dev));
    zr_tensor_release(ws);
    return zr_dev_status(rc, "cross_entropy", dev);
}
#endif


/* fused: the inplace forward (checked by the caller: recorded, contiguous, mean or sum). */
static zr_tensor *cross_entropy_dev(zr_tensor *logits, zr_tensor *targets, int64_t ignore_index,
                                    zr_loss_reduction reduction, double label_smoothing, int fused) {
#ifdef ZR_HAVE_CUDA
    zr_device dev = zr_tensor_device(logits);
    char dn[16];
    if (logits->dtype == ZR_F64)
        return zr_error_null("cross_entropy on %s: f64 logits are not supported (use f32, bf16 or f16)",
                             zr_device_name(dev, dn));
    int64_t c = logits->shape[logits->ndim - 1], rows = zr_tensor_numel(targets);
    cudaStream_t s = zr_cuda_stream(dev);
    zr_tensor *tgt = NULL, *xi = NULL, *lse = NULL, *loss = NULL, *nv = NULL, *mean = NULL, *out = NULL;
    zr_tensor *result = NULL, *baked = NULL, *cnt = NULL;
    if (c == 0) return zr_error_null("cross_entropy: logits have 0 classes");
    if (!(tgt = zr_tensor_to_raw(targets, ZR_I64, dev)) || !(xi = zr_tensor_contiguous_raw(logits))) goto fail;
    lse = zr_tensor_new_cat(ZR_F32, dev, 1, &rows, ZR_MEM_ACTIVATIONS, 0);
    loss = zr_tensor_new_cat(ZR_F32, dev, 1, &rows, ZR_MEM_WORKSPACE, 0);
    nv = zr_tensor_new_cat(ZR_F32, dev, 0, NULL, ZR_MEM_ACTIVATIONS, 0);
    mean = zr_tensor_new_cat(ZR_F32, dev, 0, NULL, ZR_MEM_WORKSPACE, 0);
    if (!lse || !loss || !nv || !mean) goto fail;
    if (rows == 0) fused = 0; /* nothing to write: the plain path's backward makes the empty gradient */
    if (fused && xi->storage != logits->storage) {
        zr_error("internal: cross_entropy inplace: the logits were copied");
        goto fail;
    }
    if (fused) { /* the gradient over xi, which is the logits themselves (contiguous) */
        float hint = (float)zr_loss_grad_hint();
        int64_t one = 1;
        baked = zr_tensor_new_cat(ZR_F32, dev, 0, NULL, ZR_MEM_ACTIVATIONS, 0);
        cnt = reduction == ZR_LOSS_MEAN ? zr_tensor_new_cat(ZR_I32, dev, 1, &one, ZR_MEM_WORKSPACE, 0) : NULL;
        if (!baked || (reduction == ZR_LOSS_MEAN && !cnt) || zr_tensor_fill_(baked, hint)) goto fail;
        if (zr_dev_status(cross_entropy_fused_cuda(zr_tensor_data(loss), zr_tensor_data(lse), zr_tensor_data(mean),
                                                   zr_tensor_data(nv), zr_tensor_data(xi), zr_tensor_data(xi),
                                                   zr_tensor_data(tgt), cnt ? zr_tensor_data(cnt) : NULL, hint, rows,
                                                   c, ignore_index, (float)label_smoothing, xi->dtype, s),
                          "cross_entropy", dev))
            goto fail;
    } else if (rows == 0) { /* no rows: the kernel has nothing to do; mean is NaN like torch */
        if (zr_tensor_fill_(nv, 0) || zr_tensor_fill_(mean, reduction == ZR_LOSS_SUM ? 0.0 : NAN)) goto fail;
    } else if (zr_dev_status(cross_entropy_forward_cuda(zr_tensor_data(loss), zr_tensor_data(lse),
                                                        zr_tensor_data(mean), zr_tensor_data(nv), zr_tensor_data(xi),
                                                        zr_tensor_data(tgt), rows, c, ignore_index,
                                                        (float)label_smoothing, xi->dtype, s),
                             "cross_entropy", dev))
        goto fail;
    if (reduction == ZR_LOSS_NONE) {
        out = zr_tensor_new_cat(ZR_F32, dev, targets->ndim, targets->shape, ZR_MEM_ACTIVATIONS, 0);
        if (!out || zr_tensor_copy_(out, loss)) goto fail;
    } else {
        out = zr_tensor_new_cat(ZR_F32, dev, 0, NULL, ZR_MEM_ACTIVATIONS, 0);
        if (!out) goto fail;
        if (reduction == ZR_LOSS_SUM && zr_cross_entropy_sum_dev(mean, loss)) goto fail;
        if (zr_tensor_copy_(out, mean)) goto fail;
    }
    zr_node *n;
    if (zr_autograd_record(out, "cross_entropy", fused ? cross_entropy_backward_fused : cross_entropy_backward_dev, 1,
                           &logits, &n))
        goto fail;
    if (n && fused && (zr_node_save(n, xi) || zr_node_save(n, baked))) goto fail;
    if (n && !fused) {
        n->i[0] = ignore_index;
        n->i[1] = reduction;
        n->f[0] = label_smoothing;
        if (zr_node_save(n, xi) || zr_node_save(n, lse) || zr_node_save(n, tgt) || zr_node_save(n, nv)) goto fail;
    }
    result = out;
    out = NULL;
fail:
    zr_tensor_release(baked);
    zr_tensor_release(cnt);
    zr_tensor_release(tgt);
    zr_tensor_release(xi);
    zr_tensor_release(lse);
    zr_tensor_release(loss);
    zr_tensor_release(nv);
    zr_tensor_release(mean);
    zr_tensor_release(out);
    return result;
#else
    (void)logits, (void)targets, (void)ignore_index, (void)reduction, (void)label_smoothing, (void)fused;
    return zr_no_cuda("cross_entropy"), NULL;
#endif
}

zr_tensor *zr_cross_entropy(zr_tensor *logits, zr_tensor *targets, int64_t ignore_index,
                            zr_loss_reduction reduction, double label_smoothing, int inplace) {
    if (!logits || !targets) return zr_error_null("cross_entropy: missing logits or targets");
    if (check_args(logits, targets, label_smoothing)) return NULL;
    if ((unsigned)reduction > ZR_LOSS_SUM)
        return zr_error_null("cross_entropy: reduction must be 'mean', 'sum' or 'none'");
    if (inplace && reduction == ZR_LOSS_NONE)
        return zr_error_null("cross_entropy: inplace needs reduction 'mean' or 'sum' (the gradient is made for "
                             "the one seed of a scalar loss), got 'none'; drop inplace");
    if (inplace && !zr_tensor_is_contiguous(logits))
        return zr_error_null("cross_entropy: inplace writes the gradient over the logits and needs them "
                             "contiguous; call :contiguous() on them first, or drop inplace");
    /* in place only when a backward will come for it; else the plain forward */
    int fused = inplace && zr_grad_enabled() && zr_tensor_needs_grad(logits);
    if (!zr_is_cpu(logits))
        return cross_entropy_dev(logits, targets, ignore_index, reduction, label_smoothing, fused);
    int64_t c = logits->shape[logits->ndim - 1], rows = zr_tensor_numel(targets), n_valid = 0;
    zr_device dev = zr_tensor_device(logits);
    zr_dtype ct = zr_cpu_compute_dtype(logits->dtype);
    zr_tensor *tgt = NULL, *xi = NULL, *lse = NULL, *loss = NULL, *out = NULL;

    if (!(tgt = zr_tensor_to_raw(targets, ZR_I64, dev))) goto fail; /* contiguous i64 */
    const int64_t *t = zr_tensor_data(tgt);
    for (int64_t i = 0; i < rows; i++) {
        if (t[i] == ignore_index) continue;
        if (t[i] < 0 || t[i] >= c) {
            zr_error("cross_entropy: target %lld (at flat position %lld) is out of range for %lld "
                     "classes: expected 0..%lld, or ignore_index %lld", (long long)t[i],
                     (long long)i + 1, (long long)c, (long long)c - 1, (long long)ignore_index);
            goto fail;
        }
        n_valid++;
    }

    zr_dtype lt = loss_dtype(logits->dtype);
    if (reduction == ZR_LOSS_NONE)
        out = zr_tensor_new_cat(lt, dev, targets->ndim, targets->shape, ZR_MEM_ACTIVATIONS, 0);
    else
        out = zr_tensor_new_cat(lt, dev, 0, NULL, ZR_MEM_ACTIVATIONS, 0);
    lse = zr_tensor_new_cat(ct, dev, 1, &rows, ZR_MEM_ACTIVATIONS, 0);
    if (!out || !lse || !(xi = zr_cpu_in(logits, ct))) goto fail;
    if (reduction == ZR_LOSS_NONE) loss = zr_cpu_out_begin(out, ct);
    else loss = zr_tensor_new_cat(ct, dev, 1, &rows, ZR_MEM_WORKSPACE, 0);
    if (!loss) goto fail;
    ZR_CPU_CALL(ct, cross_entropy_forward_cpu, zr_tensor_data(loss), zr_tensor_data(lse),
                zr_tensor_data(xi), t, rows, c, ignore_index, label_smoothing);
    if (reduction == ZR_LOSS_NONE) {
        zr_status st = zr_cpu_out_end(out, loss);
        loss = NULL;
        if (st) goto fail;
    } else {
        double s = 0; /* summed in double, in row order: deterministic */
        if (ct == ZR_F64)
            for (int64_t i = 0; i < rows; i++) s += ((const double *)zr_tensor_data(loss))[i];
        else
            for (int64_t i = 0; i < rows; i++) s += ((const float *)zr_tensor_data(loss))[i];
        if (reduction == ZR_LOSS_MEAN) s = n_valid ? s / (double)n_valid : NAN; /* torch: 0/0 */
        if (zr_tensor_set(out, 0, s)) goto fail;
    }
    /* inplace: the backward kernel's gradient for the hinted seed, written over xi (the logits
     * themselves when f32/f64 and contiguous, else their widened copy, narrowed back into them):
     * the numbers cross_entropy_backward makes for that seed */
    double baked = lt == ZR_F32 ? (double)(float)zr_loss_grad_hint() : zr_loss_grad_hint();
    if (fused) {
        double scale = reduction == ZR_LOSS_MEAN ? baked / (double)n_valid : baked; /* 0 valid: every row 0 */
        ZR_CPU_CALL(ct, cross_entropy_backward_cpu, zr_tensor_data(xi), zr_tensor_data(xi), zr_tensor_data(lse), t,
                    NULL, scale, rows, c, ignore_index, label_smoothing);
        if (xi != logits && zr_tensor_copy_(logits, xi)) goto fail;
    }
    zr_node *n;
    if (zr_autograd_record(out, "cross_entropy", fused ? cross_entropy_backward_inplace : cross_entropy_backward, 1,
                           &logits, &n))
        goto fail;
    if (n && fused) {
        n->f[1] = baked;
        if (zr_node_save(n, logits)) goto fail;
    } else if (n) {
        n->i[0] = ignore_index;
        n->i[1] = reduction;
        n->i[2] = n_valid;
        n->f[0] = label_smoothing;
        if (zr_node_save(n, logits) || zr_node_save(n, lse) || zr_node_save(n, tgt)) goto fail;
    }
    zr_tensor_release(tgt);
    zr_tensor_release(xi);
    zr_tensor_release(lse);
    zr_tensor_release(loss);
    return out;
fail:
    zr_tensor_release(tgt);
    zr_tensor_release(xi);
    zr_tensor_release(lse);
    zr_tensor_release(loss);
    zr_tensor_release(out);
    return NULL;
}

zr_status zr_logits_stats(zr_tensor *logits, zr_tensor **entropy, zr_tensor **argmax) {
    *entropy = *argmax = NULL;
    if (!logits) return zr_error("logits_stats: missing logits");
    if (zr_check_float("logits_stats", logits)) return ZR_ERR;
    if (logits->ndim < 1 || logits->shape[logits->ndim - 1] < 1)
        return zr_error("logits_stats: logits need a last dimension of at least one class");
    int64_t c = logits->shape[logits->ndim - 1], rows = zr_tensor_numel(logits) / c;
    zr_device dev = zr_tensor_device(logits);
    zr_dtype lt = loss_dtype(logits->dtype);
    if (!zr_is_cpu(logits) && lt == ZR_F64) lt = ZR_F32; /* (f64 logits on a GPU: refused below) */
    zr_tensor *xi = NULL, *o = NULL;
    zr_tensor *e = zr_tensor_new_cat(lt, dev, logits->ndim - 1, logits->shape, ZR_MEM_WORKSPACE, 0);
    zr_tensor *a = zr_tensor_new_cat(ZR_I64, dev, logits->ndim - 1, logits->shape, ZR_MEM_WORKSPACE, 0);
    zr_status st = ZR_ERR;
    if (!e || !a) goto done;
    if (!zr_is_cpu(logits)) {
#ifdef ZR_HAVE_CUDA
        char dn[16];
        if (logits->dtype == ZR_F64) {
            zr_error("logits_stats on %s: f64 logits are not supported (use f32, bf16 or f16)", zr_device_name(dev, dn));
            goto done;
        }
        if (!(xi = zr_tensor_contiguous_raw(logits))) goto done;
        if (zr_dev_status(logits_stats_cuda(zr_tensor_data(e), zr_tensor_data(a), zr_tensor_data(xi), rows, c,
                                            xi->dtype, zr_cuda_stream(dev)),
                          "logits_stats", dev))
            goto done;
        st = ZR_OK;
#else
        zr_error("logits_stats: a device tensor in a build without CUDA");
#endif
        goto done;
    }
    zr_dtype ct = zr_cpu_compute_dtype(logits->dtype);
    if (!(xi = zr_cpu_in(logits, ct)) || !(o = zr_cpu_out_begin(e, ct))) goto done;
    ZR_CPU_CALL(ct, logits_stats_cpu, zr_tensor_data(o), zr_tensor_data(a), zr_tensor_data(xi), rows, c);
    st = zr_cpu_out_end(e, o);
    o = NULL;
done:
    zr_tensor_release(xi);
    if (st) {
        zr_tensor_release(e);
        zr_tensor_release(a);
        return st;
    }
    *entropy = e, *argmax = a;
    return ZR_OK;
}
