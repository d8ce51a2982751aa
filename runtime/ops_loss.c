/* Cross-entropy: forward and backward side by side (see ops_loss.h). Saved for backward: the
 * logits, the per-row logsumexp (N values, compute dtype) and the targets as i64. */
#include "ops_loss.h"

#include <math.h>
#include <string.h>

#include "ops_util.h"

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
    if (st) {
        zr_tensor_release(gx);
        return ZR_ERR;
    }
    gin[0] = gx;
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

zr_tensor *zr_cross_entropy(zr_tensor *logits, zr_tensor *targets, int64_t ignore_index,
                            zr_loss_reduction reduction, double label_smoothing) {
    if (!logits || !targets) return zr_error_null("cross_entropy: missing logits or targets");
    if (check_args(logits, targets, label_smoothing)) return NULL;
    if ((unsigned)reduction > ZR_LOSS_SUM)
        return zr_error_null("cross_entropy: reduction must be 'mean', 'sum' or 'none'");
    if (!zr_is_cpu(logits)) return zr_no_cuda("cross_entropy"), NULL;
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

    if (reduction == ZR_LOSS_NONE)
        out = zr_tensor_new_cat(logits->dtype, dev, targets->ndim, targets->shape, ZR_MEM_ACTIVATIONS, 0);
    else
        out = zr_tensor_new_cat(logits->dtype, dev, 0, NULL, ZR_MEM_ACTIVATIONS, 0);
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
    zr_node *n;
    if (zr_autograd_record(out, "cross_entropy", cross_entropy_backward, 1, &logits, &n)) goto fail;
    if (n) {
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
