/* Shared argument checks for ops (see ops/util.h). */
#include "ops/util.h"

#include <string.h>

zr_dtype zr_promote(zr_dtype a, zr_dtype b) {
    if (a == b) return a;
    if (a == ZR_F64 || b == ZR_F64) return ZR_F64;
    if (a == ZR_F32 || b == ZR_F32) return ZR_F32;
    if (zr_dtype_is_float(a) && zr_dtype_is_float(b)) return ZR_F32; /* bf16 with f16 */
    if (zr_dtype_is_float(a)) return a;
    if (zr_dtype_is_float(b)) return b;
    if (a == ZR_I64 || b == ZR_I64) return ZR_I64;
    return ZR_I32;
}

zr_status zr_check_same_device(const char *op, int n, zr_tensor *const *ts) {
    zr_tensor *first = NULL;
    int fi = 0;
    for (int i = 0; i < n; i++) {
        if (!ts[i]) continue;
        if (!first) {
            first = ts[i];
            fi = i;
        } else if (!zr_device_eq(zr_tensor_device(first), zr_tensor_device(ts[i]))) {
            char d1[16], d2[16];
            return zr_error("%s: input %d is on %s but input %d is on %s; move them to one device "
                            "with :to()", op, i + 1, zr_device_name(zr_tensor_device(ts[i]), d1),
                            fi + 1, zr_device_name(zr_tensor_device(first), d2));
        }
    }
    return ZR_OK;
}

zr_status zr_check_float(const char *op, const zr_tensor *t) {
    if (zr_dtype_is_float(t->dtype)) return ZR_OK;
    return zr_error("%s: expected a floating-point tensor, got %s", op, zr_dtype_name(t->dtype));
}

zr_status zr_broadcast_shape(const char *op, const zr_tensor *a, const zr_tensor *b, int *ndim,
                             int64_t *shape) {
    int n = a->ndim > b->ndim ? a->ndim : b->ndim;
    for (int i = 0; i < n; i++) {
        int ia = i - (n - a->ndim), ib = i - (n - b->ndim);
        int64_t sa = ia >= 0 ? a->shape[ia] : 1, sb = ib >= 0 ? b->shape[ib] : 1;
        if (sa != sb && sa != 1 && sb != 1) {
            char b1[128], b2[128];
            return zr_error("%s: shapes %s and %s cannot be broadcast (dim %d: %lld vs %lld)", op,
                            zr_tensor_shape_str(a, b1), zr_tensor_shape_str(b, b2), i + 1,
                            (long long)sa, (long long)sb);
        }
        shape[i] = sa == 1 ? sb : sa;
    }
    *ndim = n;
    return ZR_OK;
}

void zr_broadcast_strides(const zr_tensor *t, int ndim, const int64_t *shape, int64_t *stride) {
    for (int i = 0; i < ndim; i++) {
        int it = i - (ndim - t->ndim);
        stride[i] = (it < 0 || (t->shape[it] == 1 && shape[i] != 1)) ? 0 : t->stride[it];
    }
}

zr_tensor *zr_take_as(zr_tensor *t, zr_dtype dt) {
    if (!t || t->dtype == dt) return t;
    zr_tensor *c = zr_tensor_to_raw(t, dt, zr_tensor_device(t));
    zr_tensor_release(t);
    return c;
}

zr_status zr_grad_to_input(zr_node *n, int i, zr_tensor *g, zr_tensor **gin) {
    if (!g) return ZR_ERR;
    zr_edge *e = &n->edges[i];
    zr_tensor *r = zr_sum_to_shape(g, e->ndim, e->shape);
    zr_tensor_release(g);
    if (!(r = zr_take_as(r, e->dtype))) return ZR_ERR;
    gin[i] = r;
    return ZR_OK;
}

zr_status zr_give_grads(zr_node *n, int k, zr_tensor **d, zr_tensor **grad_in) {
    for (int i = 0; i < k; i++) {
        if (!d[i] || !zr_node_needs_grad(n, i)) continue;
        zr_tensor *c = zr_take_as(d[i], n->edges[i].dtype);
        d[i] = NULL;
        if (!c) return ZR_ERR;
        grad_in[i] = c;
    }
    return ZR_OK;
}

zr_status zr_no_cuda(const char *op) {
    return zr_error("%s: CUDA tensors need a zrun built with CUDA (this build has none; see "
                    "`zrun report`)", op);
}
