/* Elementwise ops: forward and backward side by side (see ops/elementwise.h). */
#include "ops/elementwise.h"

#include <string.h>

#include "ops/util.h"

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

/* --- CUDA path: same math through kernels/cuda/elementwise.h on the device's compute stream.
 * Operands keep their dtype (bf16/f16 compute in f32 inside the kernels); strided inputs are read
 * in place where the kernel takes strides. Each helper is zr_no_cuda in a CPU-only build. --- */
#ifdef ZR_HAVE_CUDA
#include "cuda/device.h"
#include "kernels/cuda/elementwise.h"
#endif

static zr_status unary_forward_dev(zr_tensor *out, zr_tensor *x, int op, double p) {
#ifdef ZR_HAVE_CUDA
    zr_device dev = zr_tensor_device(x);
    zr_tensor *xi = zr_tensor_contiguous_raw(x);
    if (!xi) return ZR_ERR;
    int rc = unary_forward_cuda(zr_tensor_data(out), zr_tensor_data(xi), zr_tensor_numel(x), op, p,
                                x->dtype, zr_cuda_stream(dev));
    zr_tensor_release(xi);
    return zr_dev_status(rc, unary_names[op], dev);
#else
    return zr_no_cuda(unary_names[op]);
#endif
}

static zr_status unary_backward_dev(zr_tensor *gx, zr_tensor *g, zr_tensor *xy, int op, double p) {
#ifdef ZR_HAVE_CUDA
    zr_device dev = zr_tensor_device(gx);
    zr_tensor *gi = zr_tensor_to_raw(g, gx->dtype, dev), *vi = zr_tensor_to_raw(xy, gx->dtype, dev);
    int rc = -1;
    if (gi && vi) {
        void *v = zr_tensor_data(vi);
        rc = unary_backward_cuda(zr_tensor_data(gx), zr_tensor_data(gi), unary_uses_y(op) ? NULL : v,
                                 unary_uses_y(op) ? v : NULL, zr_tensor_numel(gx), op, p, gx->dtype,
                                 zr_cuda_stream(dev));
    }
    zr_tensor_release(gi);
    zr_tensor_release(vi);
    if (!gi || !vi) return ZR_ERR;
    return zr_dev_status(rc, unary_names[op], dev);
#else
    return zr_no_cuda(unary_names[op]);
#endif
}

/* out (dtype dt, broadcast shape) = a op b. Integer results compute in f32, like the CPU. */
static zr_status binary_forward_dev(zr_tensor *out, int op, zr_tensor *a, zr_tensor *b, int ndim,
                                    const int64_t *shape) {
#ifdef ZR_HAVE_CUDA
    zr_device dev = zr_tensor_device(out);
    zr_dtype ct = zr_dtype_is_float(out->dtype) ? out->dtype : ZR_F32;
    zr_tensor *ai = a->dtype == ct ? zr_tensor_retain(a) : zr_tensor_to_raw(a, ct, dev);
    zr_tensor *bi = b->dtype == ct ? zr_tensor_retain(b) : zr_tensor_to_raw(b, ct, dev);
    zr_tensor *o = out->dtype == ct ? zr_tensor_retain(out)
                                    : zr_tensor_new_cat(ct, dev, out->ndim, out->shape, ZR_MEM_WORKSPACE, 0);
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
        int rc = binary_forward_cuda(zr_tensor_data(o), zr_tensor_data(ai), as, zr_tensor_data(bi), bs, nd,
                                     sh, op, ct, zr_cuda_stream(dev));
        st = zr_dev_status(rc, binary_names[op], dev);
        if (!st && o != out) st = zr_tensor_copy_(out, o);
    }
    zr_tensor_release(ai);
    zr_tensor_release(bi);
    zr_tensor_release(o);
    return st;
#else
    return zr_no_cuda(binary_names[op]);
#endif
}

static zr_status affine_forward_dev(zr_tensor *out, zr_tensor *x, double alpha, double beta) {
#ifdef ZR_HAVE_CUDA
    zr_device dev = zr_tensor_device(x);
    zr_tensor *xi = zr_tensor_contiguous_raw(x);
    if (!xi) return ZR_ERR;
    int rc = affine_forward_cuda(zr_tensor_data(out), zr_tensor_data(xi), zr_tensor_numel(x), alpha, beta,
                                 x->dtype, zr_cuda_stream(dev));
    zr_tensor_release(xi);
    return zr_dev_status(rc, "affine", dev);
#else
    return zr_no_cuda("affine");
#endif
}

/* dst += alpha * src for contiguous float dst of src's shape. */
static zr_status axpy_dev(zr_tensor *dst, zr_tensor *src, double alpha) {
#ifdef ZR_HAVE_CUDA
    zr_device dev = zr_tensor_device(dst);
    if (dst->dtype == ZR_F32 && (src->dtype == ZR_BF16 || src->dtype == ZR_F16) && zr_tensor_is_contiguous(src)) {
        /* a 16-bit gradient into an fp32 one (the tied embedding's): no widened copy */
        int rc = axpy_widen_cuda(zr_tensor_data(dst), zr_tensor_data(src), src->dtype, zr_tensor_numel(dst), alpha,
                                 zr_cuda_stream(dev));
        if (rc != -2) return zr_dev_status(rc, "add_", dev);
    }
    zr_tensor *s = zr_tensor_to_raw(src, dst->dtype, dev);
    if (!s) return ZR_ERR;
    int rc = axpy_cuda(zr_tensor_data(dst), zr_tensor_data(s), zr_tensor_numel(dst), alpha, dst->dtype,
                       zr_cuda_stream(dev));
    zr_tensor_release(s);
    return zr_dev_status(rc, "add_", dev);
#else
    return zr_no_cuda("add_");
#endif
}

/* --- unary --- */

zr_tensor *zr_unary_grad(int op, double p, zr_tensor *xy, zr_tensor *g, zr_dtype dt) {
    zr_tensor *gx = zr_tensor_new_cat(dt, zr_tensor_device(xy), xy->ndim, xy->shape, ZR_MEM_ACTIVATIONS, 0);
    if (!gx) return NULL;
    if (!zr_is_cpu(xy)) {
        if (!unary_backward_dev(gx, g, xy, op, p)) return gx;
        zr_tensor_release(gx);
        return NULL;
    }
    zr_dtype ct = zr_cpu_compute_dtype(gx->dtype);
    zr_tensor *gi = zr_cpu_in(g, ct), *vi = zr_cpu_in(xy, ct), *o = zr_cpu_out_begin(gx, ct);
    zr_status st = ZR_ERR;
    if (gi && vi && o) {
        void *x = unary_uses_y(op) ? NULL : zr_tensor_data(vi);
        void *y = unary_uses_y(op) ? zr_tensor_data(vi) : NULL;
        ZR_CPU_CALL(ct, unary_backward_cpu, zr_tensor_data(o), zr_tensor_data(gi), x, y,
                    zr_tensor_numel(gx), op, p);
        st = zr_cpu_out_end(gx, o);
        o = NULL;
    }
    zr_tensor_release(o);
    zr_tensor_release(gi);
    zr_tensor_release(vi);
    if (st) {
        zr_tensor_release(gx);
        return NULL;
    }
    return gx;
}

static zr_status unary_backward(zr_node *n, zr_tensor *g, zr_tensor **gin) {
    return (gin[0] = zr_unary_grad((int)n->i[0], n->f[0], n->saved[0], g, n->edges[0].dtype)) ? ZR_OK : ZR_ERR;
}

zr_tensor *zr_unary(int op, zr_tensor *x, double p) {
    if ((unsigned)op >= ZR_UN_COUNT) return zr_error_null("unknown unary op %d", op);
    const char *name = unary_names[op];
    if (zr_check_float(name, x)) return NULL;
    zr_tensor *out = zr_tensor_new_cat(x->dtype, zr_tensor_device(x), x->ndim, x->shape,
                                       ZR_MEM_ACTIVATIONS, 0);
    if (!out) return NULL;
    if (!zr_is_cpu(x)) {
        if (unary_forward_dev(out, x, op, p)) goto fail;
        goto record;
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
record:;
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

static zr_status binary_backward(zr_node *n, zr_tensor *g, zr_tensor **gin) {
    int op = (int)n->i[0];
    zr_tensor *a = n->saved[0], *b = n->saved[1];
    zr_dtype dt = g->dtype;
    switch (op) {
    case ZR_BIN_ADD:
    case ZR_BIN_SUB:
        if (zr_node_needs_grad(n, 0) && zr_grad_to_input(n, 0, zr_tensor_retain(g), gin)) return ZR_ERR;
        if (zr_node_needs_grad(n, 1) &&
            zr_grad_to_input(n, 1, op == ZR_BIN_ADD ? zr_tensor_retain(g) : zr_affine(g, -1, 0), gin))
            return ZR_ERR;
        return ZR_OK;
    case ZR_BIN_MUL:
        if (zr_node_needs_grad(n, 0) && zr_grad_to_input(n, 0, binary_compute(ZR_BIN_MUL, g, b, dt), gin))
            return ZR_ERR;
        if (zr_node_needs_grad(n, 1) && zr_grad_to_input(n, 1, binary_compute(ZR_BIN_MUL, g, a, dt), gin))
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
            if (zr_grad_to_input(n, 1, gb, gin)) {
                zr_tensor_release(ga);
                return ZR_ERR;
            }
        }
        if (zr_node_needs_grad(n, 0)) return zr_grad_to_input(n, 0, ga, gin);
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
    if (zr_tensor_numel(out) == 0) return out;
    if (!zr_is_cpu(a)) {
        if (binary_forward_dev(out, op, a, b, ndim, shape)) {
            zr_tensor_release(out);
            return NULL;
        }
        return out;
    }
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
    gin[0] = zr_take_as(zr_affine(g, n->f[0], 0), n->edges[0].dtype);
    return gin[0] ? ZR_OK : ZR_ERR;
}

zr_tensor *zr_affine(zr_tensor *x, double alpha, double beta) {
    if (zr_check_float("affine", x)) return NULL;
    zr_tensor *out = zr_tensor_new_cat(x->dtype, zr_tensor_device(x), x->ndim, x->shape,
                                       ZR_MEM_ACTIVATIONS, 0);
    if (!out) return NULL;
    if (!zr_is_cpu(x)) {
        if (affine_forward_dev(out, x, alpha, beta)) goto fail;
        goto record;
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
record:;
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
    if (!zr_is_cpu(dst)) {
        if (zr_dtype_is_float(dst->dtype) && zr_tensor_is_contiguous(dst) && zr_tensor_same_shape(dst, src))
            return axpy_dev(dst, src, alpha);
        /* otherwise the generic path below runs on the device */
    } else if ((dst->dtype == ZR_F32 || dst->dtype == ZR_F64) && zr_tensor_is_contiguous(dst) &&
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
    if (!zr_is_cpu(dst)) {
        if (zr_dtype_is_float(dst->dtype) && zr_tensor_is_contiguous(dst))
            return affine_forward_dev(dst, dst, s, 0);
    } else if ((dst->dtype == ZR_F32 || dst->dtype == ZR_F64) && zr_tensor_is_contiguous(dst)) {
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
