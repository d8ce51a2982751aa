/* Dropout: forward and backward side by side (see dropout.h). On CUDA tensors the mask is a
 * device Bernoulli fill (the same numbers as the CPU for the same seed). */
#include "ops/dropout.h"

#include "core/random.h"
#include "ops/util.h"

#ifdef ZR_HAVE_CUDA
#include "cuda/device.h"
#include "kernels/cuda/dropout.h"
#endif

/* y = mask ? x * scale : 0 on x's GPU (y contiguous, x converted to y's dtype). */
static zr_status dropout_dev(zr_tensor *y, zr_tensor *x, zr_tensor *mask, double scale) {
#ifdef ZR_HAVE_CUDA
    zr_device dev = zr_tensor_device(y);
    zr_tensor *xi = zr_tensor_to_raw(x, y->dtype, dev);
    if (!xi) return ZR_ERR;
    int rc = dropout_apply_cuda(zr_tensor_data(y), zr_tensor_data(xi), zr_tensor_data(mask), zr_tensor_numel(y),
                                scale, y->dtype, zr_cuda_stream(dev));
    zr_tensor_release(xi);
    return zr_dev_status(rc, "dropout", dev);
#else
    (void)y, (void)x, (void)mask, (void)scale;
    return zr_no_cuda("dropout");
#endif
}

/* saved: mask (u8); f[0] = scale */
static zr_status dropout_backward(zr_node *n, zr_tensor *g, zr_tensor **gin) {
    zr_tensor *mask = n->saved[0];
    if (!zr_is_cpu(g)) {
        zr_edge *e = &n->edges[0];
        zr_tensor *gx = zr_tensor_new_cat(e->dtype, zr_tensor_device(g), g->ndim, g->shape, ZR_MEM_ACTIVATIONS, 0);
        if (!gx || dropout_dev(gx, g, mask, n->f[0])) {
            zr_tensor_release(gx);
            return ZR_ERR;
        }
        gin[0] = gx;
        return ZR_OK;
    }
    zr_dtype ct = zr_cpu_compute_dtype(g->dtype);
    zr_tensor *gi = zr_cpu_in(g, ct);
    zr_tensor *gx = gi ? zr_tensor_new_cat(ct, zr_tensor_device(g), g->ndim, g->shape, ZR_MEM_ACTIVATIONS, 0) : NULL;
    if (!gx) {
        zr_tensor_release(gi);
        return ZR_ERR;
    }
    ZR_CPU_CALL(ct, dropout_apply_cpu, zr_tensor_data(gx), zr_tensor_data(gi), zr_tensor_data(mask),
                zr_tensor_numel(gx), n->f[0]);
    zr_tensor_release(gi);
    gin[0] = zr_take_as(gx, n->edges[0].dtype);
    return gin[0] ? ZR_OK : ZR_ERR;
}

zr_tensor *zr_dropout(zr_tensor *x, double p, int training) {
    if (zr_check_float("dropout", x)) return NULL;
    if (!(p >= 0 && p <= 1)) return zr_error_null("dropout: p must be in [0, 1], got %g", p);
    if (!training || p == 0) return zr_tensor_retain(x);
    zr_device dev = zr_tensor_device(x);
    double scale = p < 1 ? 1.0 / (1.0 - p) : 0.0;
    zr_dtype ct = zr_cpu_compute_dtype(x->dtype);
    zr_tensor *mask = zr_tensor_new_cat(ZR_U8, dev, x->ndim, x->shape, ZR_MEM_ACTIVATIONS, 0);
    zr_tensor *out = mask ? zr_tensor_new_cat(x->dtype, dev, x->ndim, x->shape, ZR_MEM_ACTIVATIONS, 0) : NULL;
    zr_tensor *xi = NULL, *o = NULL;
    if (!out || zr_tensor_bernoulli_(mask, 1.0 - p)) goto fail;
    if (!zr_is_cpu(x)) {
        if (dropout_dev(out, x, mask, scale)) goto fail;
        goto record;
    }
    if (!(xi = zr_cpu_in(x, ct)) || !(o = zr_cpu_out_begin(out, ct))) goto fail;
    ZR_CPU_CALL(ct, dropout_apply_cpu, zr_tensor_data(o), zr_tensor_data(xi), zr_tensor_data(mask),
                zr_tensor_numel(x), scale);
    zr_status st = zr_cpu_out_end(out, o);
    o = NULL;
    if (st) goto fail;
record:;
    zr_node *n;
    if (zr_autograd_record(out, "dropout", dropout_backward, 1, &x, &n)) goto fail;
    if (n) {
        n->f[0] = scale;
        if (zr_node_save(n, mask)) goto fail;
    }
    zr_tensor_release(xi);
    zr_tensor_release(mask);
    return out;
fail:
    zr_tensor_release(o);
    zr_tensor_release(xi);
    zr_tensor_release(mask);
    zr_tensor_release(out);
    return NULL;
}
