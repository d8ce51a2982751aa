/* softmax / log_softmax: forward and backward side by side (see ops_softmax.h). Both save only
 * their output: softmax' = y (g - <g, y>), log_softmax' = g - exp(y) sum(g). */
#include "ops_softmax.h"

#include "ops_util.h"

/* (outer, r, inner) around dim d of x. */
static void split_dims(const zr_tensor *x, int d, int64_t *outer, int64_t *r, int64_t *inner) {
    *outer = *inner = 1;
    *r = x->ndim ? x->shape[d] : 1;
    for (int i = 0; i < d; i++) *outer *= x->shape[i];
    for (int i = d + 1; i < x->ndim; i++) *inner *= x->shape[i];
}

/* saved[0] = y; i[0] = dim, i[1] = is_log. */
static zr_status softmax_backward(zr_node *n, zr_tensor *g, zr_tensor **gin) {
    zr_tensor *y = n->saved[0];
    zr_edge *e = &n->edges[0];
    int64_t outer, r, inner;
    split_dims(y, (int)n->i[0], &outer, &r, &inner);
    zr_tensor *gx = zr_tensor_new_cat(e->dtype, zr_tensor_device(y), e->ndim, e->shape, ZR_MEM_ACTIVATIONS, 0);
    if (!gx) return ZR_ERR;
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
    if (st) {
        zr_tensor_release(gx);
        return ZR_ERR;
    }
    gin[0] = gx;
    return ZR_OK;
}

static zr_tensor *softmax_impl(const char *op, zr_tensor *x, int dim, int is_log) {
    if (!x) return zr_error_null("%s: missing input", op);
    if (zr_check_float(op, x)) return NULL;
    int d = zr_dim_norm(dim, x->ndim, op);
    if (d < 0) return NULL;
    if (!zr_is_cpu(x)) return zr_no_cuda(op), NULL;
    int64_t outer, r, inner;
    split_dims(x, d, &outer, &r, &inner);
    zr_tensor *out = zr_tensor_new_cat(x->dtype, zr_tensor_device(x), x->ndim, x->shape, ZR_MEM_ACTIVATIONS, 0);
    if (!out) return NULL;
    zr_dtype ct = zr_cpu_compute_dtype(x->dtype);
    zr_tensor *xi = zr_cpu_in(x, ct), *o = xi ? zr_cpu_out_begin(out, ct) : NULL;
    if (!o) {
        zr_tensor_release(xi);
        goto fail;
    }
    ZR_CPU_CALL(ct, softmax_forward_cpu, zr_tensor_data(o), zr_tensor_data(xi), outer, r, inner, is_log);
    zr_tensor_release(xi);
    if (zr_cpu_out_end(out, o)) goto fail;
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
