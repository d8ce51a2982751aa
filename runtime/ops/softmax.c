/* softmax / log_softmax: forward and backward side by side (see ops/softmax.h). Both save only
 * their output: softmax' = y (g - <g, y>), log_softmax' = g - exp(y) sum(g). */
#include "ops/softmax.h"

#include "ops/util.h"

/* (outer, r, inner) around dim d of x. */
static void split_dims(const zr_tensor *x, int d, int64_t *outer, int64_t *r, int64_t *inner) {
    *outer = *inner = 1;
    *r = x->ndim ? x->shape[d] : 1;
    for (int i = 0; i < d; i++) *outer *= x->shape[i];
    for (int i = d + 1; i < x->ndim; i++) *inner *= x->shape[i];
}

/* --- CUDA path: rows of the last dim (kernels/cuda/softmax.h for softmax and
 * log_softmax), in the tensor's dtype with f32 math. Another dim is moved last by a transposed
 * copy and moved back afterwards. --- */
#ifdef ZR_HAVE_CUDA
#include "cuda/device.h"
#include "kernels/cuda/softmax.h"

/* Contiguous copy of t with dim d moved last (a new reference to t when d already is last and t
 * is contiguous), in dtype dt. */
static zr_tensor *dim_last(zr_tensor *t, int d, zr_dtype dt) {
    if (t->ndim == 0 || d == t->ndim - 1) return zr_tensor_to_raw(t, dt, zr_tensor_device(t));
    zr_tensor *v = zr_tensor_transpose_raw(t, d, t->ndim - 1);
    zr_tensor *c = v ? zr_tensor_to_raw(v, dt, zr_tensor_device(t)) : NULL;
    zr_tensor_release(v);
    return c;
}

/* Writes r (t's shape with dim d moved last, contiguous) into out (t's shape); releases r. */
static zr_status dim_unlast(zr_tensor *out, zr_tensor *r, int d) {
    zr_status st;
    if (out->ndim == 0 || d == out->ndim - 1) st = r == out ? ZR_OK : zr_tensor_copy_(out, r);
    else {
        zr_tensor *v = zr_tensor_transpose_raw(r, d, out->ndim - 1);
        st = v ? zr_tensor_copy_(out, v) : ZR_ERR;
        zr_tensor_release(v);
    }
    zr_tensor_release(r);
    return st;
}
#endif

/* mode 0: forward (a = x); mode 1: backward (a = g, b = y). out has the dtype to compute in. */
static zr_status softmax_dev(const char *op, zr_tensor *out, zr_tensor *a, zr_tensor *b, int d, int is_log,
                             int backward) {
#ifdef ZR_HAVE_CUDA
    zr_device dev = zr_tensor_device(out);
    zr_dtype dt = out->dtype;
    if (dt == ZR_F64 && !is_log)
        return zr_error("%s on cuda: f64 is not supported (use f32, bf16 or f16)", op);
    int64_t D = out->ndim ? out->shape[d] : 1, N = D ? zr_tensor_numel(out) / D : 0;
    zr_tensor *ai = dim_last(a, d, dt), *bi = ai && b ? dim_last(b, d, dt) : NULL;
    int last = out->ndim == 0 || d == out->ndim - 1;
    zr_tensor *o = NULL;
    if (ai && (!b || bi))
        o = last ? zr_tensor_retain(out) : zr_tensor_new_cat(dt, dev, ai->ndim, ai->shape, ZR_MEM_WORKSPACE, 0);
    zr_status st = ZR_ERR;
    if (o) {
        cudaStream_t s = zr_cuda_stream(dev);
        void *po = zr_tensor_data(o), *pa = zr_tensor_data(ai), *pb = bi ? zr_tensor_data(bi) : NULL;
        int rc = D == 0 ? 0
                 : backward ? (is_log ? log_softmax_backward_cuda(po, pa, pb, N, D, dt, s)
                                      : softmax_backward_cuda(po, pa, pb, N, D, dt, s))
                            : (is_log ? log_softmax_forward_cuda(po, pa, N, D, dt, s)
                                      : softmax_forward_cuda(po, pa, N, D, dt, s));
        st = zr_dev_status(rc, op, dev);
        if (!st) st = dim_unlast(out, o, d);
        else zr_tensor_release(o);
    }
    zr_tensor_release(ai);
    zr_tensor_release(bi);
    return st;
#else
    (void)out, (void)a, (void)b, (void)d, (void)is_log, (void)backward;
    return zr_no_cuda(op);
#endif
}

/* saved[0] = y; i[0] = dim, i[1] = is_log. */
static zr_status softmax_backward(zr_node *n, zr_tensor *g, zr_tensor **gin) {
    zr_tensor *y = n->saved[0];
    zr_edge *e = &n->edges[0];
    int64_t outer, r, inner;
    split_dims(y, (int)n->i[0], &outer, &r, &inner);
    zr_tensor *gx = zr_tensor_new_cat(e->dtype, zr_tensor_device(y), e->ndim, e->shape, ZR_MEM_ACTIVATIONS, 0);
    if (!gx) return ZR_ERR;
    if (!zr_is_cpu(y)) {
        /* computed in y's dtype (the forward's), cast to the input's */
        zr_tensor *r = y->dtype == e->dtype ? zr_tensor_retain(gx)
                                            : zr_tensor_new_cat(y->dtype, zr_tensor_device(y), y->ndim, y->shape,
                                                                ZR_MEM_ACTIVATIONS, 0);
        zr_status st = r ? softmax_dev(n->i[1] ? "log_softmax" : "softmax", r, g, y, (int)n->i[0], (int)n->i[1], 1)
                         : ZR_ERR;
        if (!st && r != gx) st = zr_tensor_copy_(gx, r);
        zr_tensor_release(r);
        return zr_give_grad(gin, gx, st);
    }
    zr_dtype ct = zr_cpu_compute_dtype(e->dtype);
    zr_tensor *gi = zr_cpu_in(g, ct), *yi = zr_cpu_in(y, ct), *o = zr_cpu_out_begin(gx, ct);
    zr_status st = ZR_ERR;
    if (gi && yi && o) {
        ZR_CPU_CALL(ct, softmax_backward_cpu, zr_tensor_data(o), zr_tensor_data(gi), zr_tensor_data(yi),
                    outer, r, inner, (int)n->i[1]);
        st = zr_cpu_out_end(gx, o);
        o = NULL;
    }
    zr_tensor_release(o);
    zr_tensor_release(gi);
    zr_tensor_release(yi);
    return zr_give_grad(gin, gx, st);
}

static zr_tensor *softmax_impl(const char *op, zr_tensor *x, int dim, int is_log) {
    if (!x) return zr_error_null("%s: missing input", op);
    if (zr_check_float(op, x)) return NULL;
    int d = zr_dim_norm(dim, x->ndim, op);
    if (d < 0) return NULL;
    int64_t outer, r, inner;
    split_dims(x, d, &outer, &r, &inner);
    zr_tensor *out = zr_tensor_new_cat(x->dtype, zr_tensor_device(x), x->ndim, x->shape, ZR_MEM_ACTIVATIONS, 0);
    if (!out) return NULL;
    if (!zr_is_cpu(x)) {
        if (softmax_dev(op, out, x, NULL, d, is_log, 0)) goto fail;
        goto record;
    }
    zr_dtype ct = zr_cpu_compute_dtype(x->dtype);
    zr_tensor *xi = zr_cpu_in(x, ct), *o = xi ? zr_cpu_out_begin(out, ct) : NULL;
    if (!o) {
        zr_tensor_release(xi);
        goto fail;
    }
    ZR_CPU_CALL(ct, softmax_forward_cpu, zr_tensor_data(o), zr_tensor_data(xi), outer, r, inner, is_log);
    zr_tensor_release(xi);
    if (zr_cpu_out_end(out, o)) goto fail;
record:;
    zr_node *n;
    if (zr_autograd_record(out, op, softmax_backward, 1, &x, &n)) goto fail;
    if (n) {
        n->i[0] = d;
        n->i[1] = is_log;
        if (zr_node_save(n, out)) goto fail;
    }
    return out;
fail:
    zr_tensor_release(out);
    return NULL;
}

zr_tensor *zr_softmax(zr_tensor *x, int dim) { return softmax_impl("softmax", x, dim, 0); }
zr_tensor *zr_log_softmax(zr_tensor *x, int dim) { return softmax_impl("log_softmax", x, dim, 1); }
