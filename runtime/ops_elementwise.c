/* Elementwise ops: forward and backward side by side (see ops_elementwise.h). */
#include "ops_elementwise.h"

#include <string.h>

#include "ops_util.h"

static const char *unary_names[ZR_UN_COUNT] = {
    "neg", "exp", "log", "sqrt", "rsqrt", "relu", "gelu_tanh", "gelu", "silu", "sigmoid", "tanh",
    "pow", "abs", "square", "reciprocal"};
static const char *binary_names[ZR_BIN_COUNT] = {"add", "sub", "mul", "div", "maximum", "minimum"};

const char *zr_unary_name(int op) { return (unsigned)op < ZR_UN_COUNT ? unary_names[op] : "?"; }

/* Ops whose derivative is cheapest from the output y rather than the input x. */
static int unary_uses_y(int op) {
    return op == ZR_UN_EXP || op == ZR_UN_SQRT || op == ZR_UN_RSQRT || op == ZR_UN_SIGMOID ||
           op == ZR_UN_TANH || op == ZR_UN_RECIPROCAL;
}

/* --- unary --- */

static zr_status unary_backward(zr_node *n, zr_tensor *g, zr_tensor **gin) {
    int op = (int)n->i[0];
    zr_tensor *xy = n->saved[0];
    zr_tensor *gx = zr_tensor_new_cat(n->edges[0].dtype, zr_tensor_device(xy), xy->ndim, xy->shape,
                                      ZR_MEM_ACTIVATIONS, 0);
    if (!gx) return ZR_ERR;
    if (!zr_is_cpu(xy)) {
        zr_tensor_release(gx);
        return zr_no_cuda(unary_names[op]);
    }
    zr_dtype ct = zr_cpu_compute_dtype(gx->dtype);
    zr_tensor *gi = zr_cpu_in(g, ct), *vi = zr_cpu_in(xy, ct), *o = zr_cpu_out_begin(gx, ct);
    zr_status st = ZR_ERR;
    if (gi && vi && o) {
        void *x = unary_uses_y(op) ? NULL : zr_tensor_data(vi);
        void *y = unary_uses_y(op) ? zr_tensor_data(vi) : NULL;
        ZR_CPU_CALL(ct, unary_backward_cpu, zr_tensor_data(o), zr_tensor_data(gi), x, y,
                    zr_tensor_numel(gx), op, n->f[0]);
        st = zr_cpu_out_end(gx, o);
        o = NULL;
    }
    zr_tensor_release(o);
    zr_tensor_release(gi);
    zr_tensor_release(vi);
    if (st) {
        zr_tensor_release(gx);
        return ZR_ERR;
    }
    gin[0] = gx;
    return ZR_OK;
}

zr_tensor *zr_unary(int op, zr_tensor *x, double p) {
    if ((unsigned)op >= ZR_UN_COUNT) return zr_error_null("unknown unary op %d", op);
    const char *name = unary_names[op];
    if (zr_check_float(name, x)) return NULL;
    zr_tensor *out = zr_tensor_new_cat(x->dtype, zr_tensor_device(x), x->ndim, x->shape,
                                       ZR_MEM_ACTIVATIONS, 0);
    if (!out) return NULL;
    if (!zr_is_cpu(x)) {
        zr_no_cuda(name);
        goto fail;
    }
    zr_dtype ct = zr_cpu_compute_dtype(x->dtype);
    zr_tensor *xi = zr_cpu_in(x, ct), *o = xi ? zr_cpu_out_begin(out, ct) : NULL;
    if (!o) {
        zr_tensor_release(xi);
        goto fail;
    }
    ZR_CPU_CALL(ct, unary_forward_cpu, zr_tensor_data(o), zr_tensor_data(xi), zr_tensor_numel(x), op, p);
    zr_tensor_release(xi);
    if (zr_cpu_out_end(out, o)) goto fail;
    zr_node *n;
    if (zr_autograd_record(out, name, unary_backward, 1, &x, &n)) goto fail;
    if (n) {
        n->i[0] = op;
        n->f[0] = p;
        if (zr_node_save(n, unary_uses_y(op) ? out : x)) goto fail;
    }
    return out;
fail:
    zr_tensor_release(out);
    return NULL;
}

/* --- binary with broadcasting --- */

static zr_tensor *binary_compute(int op, zr_tensor *a, zr_tensor *b, zr_dtype dt);

/* Gradient for input i: reduce to its shape and cast to its dtype. Takes ownership of g. */
static zr_status finish_grad(zr_node *n, int i, zr_tensor *g, zr_tensor **gin) {
    if (!g) return ZR_ERR;
    zr_edge *e = &n->edges[i];
    zr_tensor *r = zr_sum_to_shape(g, e->ndim, e->shape);
    zr_tensor_release(g);
    if (!r) return ZR_ERR;
    if (r->dtype != e->dtype) {
        zr_tensor *c = zr_tensor_to_raw(r, e->dtype, zr_tensor_device(r));
        zr_tensor_release(r);
        if (!c) return ZR_ERR;
        r = c;
    }
    gin[i] = r;
    return ZR_OK;
}

static zr_status binary_backward(zr_node *n, zr_tensor *g, zr_tensor **gin) {
    int op = (int)n->i[0];
    zr_tensor *a = n->saved[0], *b = n->saved[1];
    zr_dtype dt = g->dtype;
    switch (op) {
    case ZR_BIN_ADD:
    case ZR_BIN_SUB:
        if (zr_node_needs_grad(n, 0) && finish_grad(n, 0, zr_tensor_retain(g), gin)) return ZR_ERR;
        if (zr_node_needs_grad(n, 1) &&
            finish_grad(n, 1, op == ZR_BIN_ADD ? zr_tensor_retain(g) : zr_affine(g, -1, 0), gin))
            return ZR_ERR;
        return ZR_OK;
    case ZR_BIN_MUL:
        if (zr_node_needs_grad(n, 0) && finish_grad(n, 0, binary_compute(ZR_BIN_MUL, g, b, dt), gin))
            return ZR_ERR;
        if (zr_node_needs_grad(n, 1) && finish_grad(n, 1, binary_compute(ZR_BIN_MUL, g, a, dt), gin))
            return ZR_ERR;
        return ZR_OK;
    case ZR_BIN_DIV: {
        zr_tensor *ga = binary_compute(ZR_BIN_DIV, g, b, dt); /* g / b */
        if (!ga) return ZR_ERR;
        if (zr_node_needs_grad(n, 1)) { /* -g a / b^2 = -(g/b) * (a/b) */
            zr_tensor *q = binary_compute(ZR_BIN_DIV, a, b, dt);
            zr_tensor *m = q ? binary_compute(ZR_BIN_MUL, ga, q, dt) : NULL;
            zr_tensor *gb = m ? zr_affine(m, -1, 0) : NULL;
            zr_tensor_release(q);
            zr_tensor_release(m);
            if (finish_grad(n, 1, gb, gin)) {
                zr_tensor_release(ga);
                return ZR_ERR;
            }
        }
        if (zr_node_needs_grad(n, 0)) return finish_grad(n, 0, ga, gin);
        zr_tensor_release(ga);
        return ZR_OK;
    }
    default: return zr_error("%s is not differentiable", binary_names[op]);
    }
}

static zr_tensor *binary_compute(int op, zr_tensor *a, zr_tensor *b, zr_dtype dt) {
    const char *name = binary_names[op];
    int ndim;
    int64_t shape[ZR_MAX_DIMS];
    if (zr_check_same_device(name, 2, (zr_tensor *[]){a, b})) return NULL;
    if (zr_broadcast_shape(name, a, b, &ndim, shape)) return NULL;
    zr_tensor *out = zr_tensor_new_cat(dt, zr_tensor_device(a), ndim, shape, ZR_MEM_ACTIVATIONS, 0);
    if (!out) return NULL;
    if (!zr_is_cpu(a)) {
        zr_no_cuda(name);
        zr_tensor_release(out);
        return NULL;
    }
    if (zr_tensor_numel(out) == 0) return out;
    zr_dtype ct = zr_cpu_compute_dtype(dt);
    zr_tensor *ai = zr_cpu_in(a, ct), *bi = zr_cpu_in(b, ct), *o = zr_cpu_out_begin(out, ct);
    zr_status st = ZR_ERR;
    if (ai && bi && o) {
        int64_t as[ZR_MAX_DIMS], bs[ZR_MAX_DIMS], one = 1;
        int nd = ndim ? ndim : 1;
        const int64_t *sh = ndim ? shape : &one;
        if (ndim) {
            zr_broadcast_strides(ai, ndim, shape, as);
            zr_broadcast_strides(bi, ndim, shape, bs);
        } else
            as[0] = bs[0] = 1;
        ZR_CPU_CALL(ct, binary_forward_cpu, zr_tensor_data(o), zr_tensor_data(ai), as,
                    zr_tensor_data(bi), bs, nd, sh, op);
        st = zr_cpu_out_end(out, o);
        o = NULL;
    }
    zr_tensor_release(o);
    zr_tensor_release(ai);
    zr_tensor_release(bi);
    if (st) {
        zr_tensor_release(out);
        return NULL;
    }
    return out;
}

zr_tensor *zr_binary(int op, zr_tensor *a, zr_tensor *b) {
    if ((unsigned)op >= ZR_BIN_COUNT) return zr_error_null("unknown binary op %d", op);
    zr_dtype dt = zr_promote(a->dtype, b->dtype);
    if (!zr_dtype_is_float(dt) && op == ZR_BIN_DIV) dt = ZR_F32;
    zr_tensor *out = binary_compute(op, a, b, dt);
    if (!out) return NULL;
    zr_node *n;
    if (zr_autograd_record(out, binary_names[op], binary_backward, 2, (zr_tensor *[]){a, b}, &n))
        goto fail;
    if (n) {
        n->i[0] = op;
        int need_vals = op == ZR_BIN_MUL || op == ZR_BIN_DIV;
        if (zr_node_save(n, need_vals ? a : NULL) || zr_node_save(n, need_vals ? b : NULL)) goto fail;
    }
    return out;
fail:
    zr_tensor_release(out);
    return NULL;
}

/* --- affine --- */

static zr_status affine_backward(zr_node *n, zr_tensor *g, zr_tensor **gin) {
    zr_tensor *r = zr_affine(g, n->f[0], 0);
    if (!r) return ZR_ERR;
    if (r->dtype != n->edges[0].dtype) {
        zr_tensor *c = zr_tensor_to_raw(r, n->edges[0].dtype, zr_tensor_device(r));
        zr_tensor_release(r);
        if (!(r = c)) return ZR_ERR;
    }
    gin[0] = r;
    return ZR_OK;
}

zr_tensor *zr_affine(zr_tensor *x, double alpha, double beta) {
    if (zr_check_float("affine", x)) return NULL;
    zr_tensor *out = zr_tensor_new_cat(x->dtype, zr_tensor_device(x), x->ndim, x->shape,
                                       ZR_MEM_ACTIVATIONS, 0);
    if (!out) return NULL;
    if (!zr_is_cpu(x)) {
        zr_no_cuda("affine");
        goto fail;
    }
    zr_dtype ct = zr_cpu_compute_dtype(x->dtype);
    zr_tensor *xi = zr_cpu_in(x, ct), *o = xi ? zr_cpu_out_begin(out, ct) : NULL;
    if (!o) {
        zr_tensor_release(xi);
        goto fail;
    }
    ZR_CPU_CALL(ct, affine_forward_cpu, zr_tensor_data(o), zr_tensor_data(xi), zr_tensor_numel(x),
                alpha, beta);
    zr_tensor_release(xi);
    if (zr_cpu_out_end(out, o)) goto fail;
    zr_node *n;
    if (zr_autograd_record(out, "affine", affine_backward, 1, &x, &n)) goto fail;
    if (n) n->f[0] = alpha;
    return out;
fail:
    zr_tensor_release(out);
    return NULL;
}

/* --- in place, no autograd --- */

zr_status zr_add_(zr_tensor *dst, zr_tensor *src, double alpha) {
    if (zr_check_same_device("add_", 2, (zr_tensor *[]){dst, src})) return ZR_ERR;
    if (!zr_is_cpu(dst)) return zr_no_cuda("add_");
    if ((dst->dtype == ZR_F32 || dst->dtype == ZR_F64) && zr_tensor_is_contiguous(dst) &&
        zr_tensor_same_shape(dst, src)) {
        zr_tensor *s = zr_cpu_in(src, dst->dtype);
        if (!s) return ZR_ERR;
        ZR_CPU_CALL(dst->dtype, axpy_cpu, zr_tensor_data(dst), zr_tensor_data(s), zr_tensor_numel(dst), alpha);
        zr_tensor_release(s);
        return ZR_OK;
    }
    int old = zr_set_grad_enabled(0);
    zr_tensor *s = alpha == 1 ? zr_tensor_retain(src) : zr_affine(src, alpha, 0);
    zr_tensor *sum = s ? zr_binary(ZR_BIN_ADD, dst, s) : NULL;
    zr_set_grad_enabled(old);
    zr_tensor_release(s);
    if (!sum) return ZR_ERR;
    if (!zr_tensor_same_shape(sum, dst)) {
        char b1[128], b2[128];
        zr_tensor_release(sum);
        return zr_error("add_: cannot add %s into %s in place", zr_tensor_shape_str(src, b1),
                        zr_tensor_shape_str(dst, b2));
    }
    zr_status st = zr_tensor_copy_(dst, sum);
    zr_tensor_release(sum);
    return st;
}

zr_status zr_mul_scalar_(zr_tensor *dst, double s) {
    if (!zr_is_cpu(dst)) return zr_no_cuda("mul_");
    if ((dst->dtype == ZR_F32 || dst->dtype == ZR_F64) && zr_tensor_is_contiguous(dst)) {
        void *p = zr_tensor_data(dst);
        ZR_CPU_CALL(dst->dtype, affine_forward_cpu, p, p, zr_tensor_numel(dst), s, 0);
        return ZR_OK;
    }
    int old = zr_set_grad_enabled(0);
    zr_tensor *r = zr_affine(dst, s, 0);
    zr_set_grad_enabled(old);
    if (!r) return ZR_ERR;
    zr_status st = zr_tensor_copy_(dst, r);
    zr_tensor_release(r);
    return st;
}
