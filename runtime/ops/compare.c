/* where/masked_fill and comparisons: forward and backward side by side (see compare.h). CUDA
 * tensors run on the device: where uses the strided where kernel, comparisons
 * kernels/cuda/compare.h. */
#include "ops/compare.h"

#include <stdlib.h>
#include <string.h>

#include "ops/elementwise.h"
#include "ops/util.h"
#include "ops/view.h"

#ifdef ZR_HAVE_CUDA
#include "cuda/device.h"
#include "kernels/cuda/compare.h"
#include "kernels/cuda/elementwise.h"
#endif

/* Kernel dtype for a result of dtype dt: f32/f64 for floats, f64 (exact) for integers. */
static zr_dtype kernel_dtype(zr_dtype dt) {
    return zr_dtype_is_float(dt) ? zr_cpu_compute_dtype(dt) : ZR_F64;
}

/* --- where / masked_fill --- */

/* Broadcast shape of up to three tensors (NULL entries skipped); the error names all of them. */
static zr_status broadcast3(const char *op, zr_tensor *const *ts, const char *const *names, int *ndim,
                            int64_t *shape) {
    int nd = 0;
    for (int i = 0; i < 3; i++)
        if (ts[i] && ts[i]->ndim > nd) nd = ts[i]->ndim;
    for (int k = 0; k < nd; k++) {
        int64_t s = 1;
        for (int i = 0; i < 3; i++) {
            if (!ts[i]) continue;
            int it = k - (nd - ts[i]->ndim);
            int64_t si = it >= 0 ? ts[i]->shape[it] : 1;
            if (si == 1) continue;
            if (s != 1 && s != si) {
                char b[3][128];
                for (int j = 0; j < 3; j++) b[j][0] = 0;
                for (int j = 0; j < 3; j++)
                    if (ts[j]) zr_tensor_shape_str(ts[j], b[j]);
                return zr_error("%s: shapes cannot be broadcast together: %s %s, %s %s, %s %s (dim %d)",
                                op, names[0], b[0], names[1], b[1], names[2], ts[2] ? b[2] : "-", k + 1);
            }
            s = si;
        }
        shape[k] = s;
    }
    *ndim = nd;
    return ZR_OK;
}

/* out (contiguous) = cond ? a : b on the GPU: operands read in place through broadcast strides;
 * floats in out's dtype, integers through f64 (exact, like the CPU). */
static zr_status where_dev(const char *op, zr_tensor *out, zr_tensor *cond, zr_tensor *a, zr_tensor *b, int ndim,
                           const int64_t *shape) {
#ifdef ZR_HAVE_CUDA
    zr_device dev = zr_tensor_device(out);
    zr_dtype ct = zr_dtype_is_float(out->dtype) ? out->dtype : ZR_F64;
    zr_tensor *ci = zr_tensor_to_raw(cond, ZR_U8, dev);
    zr_tensor *ai = a->dtype == ct ? zr_tensor_retain(a) : zr_tensor_to_raw(a, ct, dev);
    zr_tensor *bi = b->dtype == ct ? zr_tensor_retain(b) : zr_tensor_to_raw(b, ct, dev);
    zr_tensor *o = out->dtype == ct ? zr_tensor_retain(out)
                                    : zr_tensor_new_cat(ct, dev, out->ndim, out->shape, ZR_MEM_WORKSPACE, 0);
    zr_status st = ZR_ERR;
    if (ci && ai && bi && o) {
        int64_t cs[ZR_MAX_DIMS], as[ZR_MAX_DIMS], bs[ZR_MAX_DIMS], one = 1;
        int nd = ndim ? ndim : 1;
        if (ndim) {
            zr_broadcast_strides(ci, ndim, shape, cs);
            zr_broadcast_strides(ai, ndim, shape, as);
            zr_broadcast_strides(bi, ndim, shape, bs);
        } else
            cs[0] = as[0] = bs[0] = 1;
        st = zr_dev_status(where_forward_cuda(zr_tensor_data(o), zr_tensor_data(ci), cs, zr_tensor_data(ai), as,
                                              zr_tensor_data(bi), bs, nd, ndim ? shape : &one, ct,
                                              zr_cuda_stream(dev)),
                           op, dev);
        if (!st && o != out) st = zr_tensor_copy_(out, o);
    }
    zr_tensor_release(ci);
    zr_tensor_release(ai);
    zr_tensor_release(bi);
    zr_tensor_release(o);
    return st;
#else
    (void)out, (void)cond, (void)a, (void)b, (void)ndim, (void)shape;
    return zr_no_cuda(op);
#endif
}

/* cond ? a : b without autograd, result dtype dt. */
static zr_tensor *where_compute(const char *op, zr_tensor *cond, zr_tensor *a, zr_tensor *b, zr_dtype dt) {
    int ndim = 0;
    int64_t shape[ZR_MAX_DIMS];
    if (zr_check_same_device(op, 3, (zr_tensor *[]){cond, a, b})) return NULL;
    if (broadcast3(op, (zr_tensor *[]){cond, a, b}, (const char *[]){"cond", "a", "b"}, &ndim, shape)) return NULL;
    zr_tensor *out = zr_tensor_new_cat(dt, zr_tensor_device(a), ndim, shape, ZR_MEM_ACTIVATIONS, 0);
    if (!out) return NULL;
    if (zr_tensor_numel(out) == 0) return out;
    if (!zr_is_cpu(a)) {
        if (where_dev(op, out, cond, a, b, ndim, shape)) {
            zr_tensor_release(out);
            return NULL;
        }
        return out;
    }
    zr_dtype ct = kernel_dtype(dt);
    zr_tensor *ci = zr_cpu_in(cond, ZR_U8), *ai = zr_cpu_in(a, ct), *bi = zr_cpu_in(b, ct);
    zr_tensor *o = zr_cpu_out_begin(out, ct);
    zr_status st = ZR_ERR;
    if (ci && ai && bi && o) {
        int64_t cs[ZR_MAX_DIMS], as[ZR_MAX_DIMS], bs[ZR_MAX_DIMS], one = 1;
        int nd = ndim ? ndim : 1;
        const int64_t *sh = ndim ? shape : &one;
        if (ndim) {
            zr_broadcast_strides(ci, ndim, shape, cs);
            zr_broadcast_strides(ai, ndim, shape, as);
            zr_broadcast_strides(bi, ndim, shape, bs);
        } else
            cs[0] = as[0] = bs[0] = 1;
        ZR_CPU_CALL(ct, where_forward_cpu, zr_tensor_data(o), zr_tensor_data(ci), cs, zr_tensor_data(ai), as,
                    zr_tensor_data(bi), bs, nd, sh);
        st = zr_cpu_out_end(out, o);
        o = NULL;
    }
    zr_tensor_release(o);
    zr_tensor_release(ci);
    zr_tensor_release(ai);
    zr_tensor_release(bi);
    if (st) {
        zr_tensor_release(out);
        return NULL;
    }
    return out;
}

/* Gradient of input i of a where-like node: g where cond selects that input (sel = 1 for the
 * "true" side), 0 elsewhere, summed to the input's shape and cast to its dtype. */
static zr_status where_grad(zr_node *n, int i, zr_tensor *cond, zr_tensor *g, int sel, zr_tensor **gin) {
    zr_tensor *z = zr_tensor_scalar(0, g->dtype, zr_tensor_device(g));
    zr_tensor *w = z ? where_compute("where", cond, sel ? g : z, sel ? z : g, g->dtype) : NULL;
    zr_tensor_release(z);
    return zr_grad_to_input(n, i, w, gin);
}

/* saved: cond */
static zr_status where_backward(zr_node *n, zr_tensor *g, zr_tensor **gin) {
    if (zr_node_needs_grad(n, 0) && where_grad(n, 0, n->saved[0], g, 1, gin)) return ZR_ERR;
    if (zr_node_needs_grad(n, 1) && where_grad(n, 1, n->saved[0], g, 0, gin)) return ZR_ERR;
    return ZR_OK;
}

static zr_status check_mask(const char *op, const char *what, zr_tensor *m) {
    if (m->dtype == ZR_U8) return ZR_OK;
    return zr_error("%s: %s must be a u8 mask (from eq/ne/lt/le/gt/ge), got %s", op, what,
                    zr_dtype_name(m->dtype));
}

zr_tensor *zr_where(zr_tensor *cond, zr_tensor *a, zr_tensor *b) {
    if (check_mask("where", "cond", cond)) return NULL;
    zr_dtype dt = zr_promote(a->dtype, b->dtype);
    zr_tensor *out = where_compute("where", cond, a, b, dt);
    if (!out) return NULL;
    zr_node *n;
    if (zr_autograd_record(out, "where", where_backward, 2, (zr_tensor *[]){a, b}, &n) ||
        (n && zr_node_save(n, cond))) {
        zr_tensor_release(out);
        return NULL;
    }
    return out;
}

/* saved: mask; input 0 is x, which takes the "false" side. */
static zr_status masked_fill_backward(zr_node *n, zr_tensor *g, zr_tensor **gin) {
    return where_grad(n, 0, n->saved[0], g, 0, gin);
}

zr_tensor *zr_masked_fill(zr_tensor *x, zr_tensor *mask, double value) {
    char b1[128], b2[128];
    if (check_mask("masked_fill", "mask", mask)) return NULL;
    int ok = mask->ndim <= x->ndim;
    for (int k = 0; ok && k < mask->ndim; k++) {
        int64_t s = mask->shape[mask->ndim - 1 - k];
        ok = s == 1 || s == x->shape[x->ndim - 1 - k];
    }
    if (!ok)
        return zr_error_null("masked_fill: mask %s does not broadcast to x's shape %s",
                             zr_tensor_shape_str(mask, b1), zr_tensor_shape_str(x, b2));
    zr_tensor *v = zr_tensor_scalar(value, x->dtype, zr_tensor_device(x));
    zr_tensor *out = v ? where_compute("masked_fill", mask, v, x, x->dtype) : NULL;
    zr_tensor_release(v);
    if (!out) return NULL;
    zr_node *n;
    if (zr_autograd_record(out, "masked_fill", masked_fill_backward, 1, &x, &n) ||
        (n && zr_node_save(n, mask))) {
        zr_tensor_release(out);
        return NULL;
    }
    return out;
}

/* --- comparisons (no autograd) --- */

static const char *cmp_names[ZR_CMP_COUNT] = {"eq", "ne", "lt", "le", "gt", "ge"};

/* out (u8, contiguous) = a (op) b on the GPU, read in place through broadcast strides; operands
 * of different dtypes are compared as f64 (exact, like the CPU). */
static zr_status compare_dev(const char *name, int op, zr_tensor *out, zr_tensor *a, zr_tensor *b, int ndim,
                             const int64_t *shape) {
#ifdef ZR_HAVE_CUDA
    zr_device dev = zr_tensor_device(out);
    zr_dtype ct = a->dtype == b->dtype ? a->dtype : ZR_F64;
    zr_tensor *ai = a->dtype == ct ? zr_tensor_retain(a) : zr_tensor_to_raw(a, ct, dev);
    zr_tensor *bi = b->dtype == ct ? zr_tensor_retain(b) : zr_tensor_to_raw(b, ct, dev);
    zr_status st = ZR_ERR;
    if (ai && bi) {
        int64_t as[ZR_MAX_DIMS], bs[ZR_MAX_DIMS], one = 1;
        if (ndim) {
            zr_broadcast_strides(ai, ndim, shape, as);
            zr_broadcast_strides(bi, ndim, shape, bs);
        } else
            as[0] = bs[0] = 1;
        st = zr_dev_status(compare_cuda(zr_tensor_data(out), zr_tensor_data(ai), as, zr_tensor_data(bi), bs,
                                        ndim ? ndim : 1, ndim ? shape : &one, op, ct, zr_cuda_stream(dev)),
                           name, dev);
    }
    zr_tensor_release(ai);
    zr_tensor_release(bi);
    return st;
#else
    (void)op, (void)out, (void)a, (void)b, (void)ndim, (void)shape;
    return zr_no_cuda(name);
#endif
}

zr_tensor *zr_compare(int op, zr_tensor *a, zr_tensor *b) {
    if ((unsigned)op >= ZR_CMP_COUNT) return zr_error_null("unknown comparison op %d", op);
    const char *name = cmp_names[op];
    int ndim;
    int64_t shape[ZR_MAX_DIMS];
    if (zr_check_same_device(name, 2, (zr_tensor *[]){a, b})) return NULL;
    if (zr_broadcast_shape(name, a, b, &ndim, shape)) return NULL;
    zr_tensor *out = zr_tensor_new_cat(ZR_U8, zr_tensor_device(a), ndim, shape, ZR_MEM_ACTIVATIONS, 0);
    if (!out) return NULL;
    if (zr_tensor_numel(out) == 0) return out;
    if (!zr_is_cpu(a)) {
        if (compare_dev(name, op, out, a, b, ndim, shape)) {
            zr_tensor_release(out);
            return NULL;
        }
        return out;
    }
    zr_tensor *ai = zr_cpu_in(a, ZR_F64), *bi = zr_cpu_in(b, ZR_F64);
    if (!ai || !bi) {
        zr_tensor_release(ai);
        zr_tensor_release(bi);
        zr_tensor_release(out);
        return NULL;
    }
    int64_t as[ZR_MAX_DIMS], bs[ZR_MAX_DIMS], one = 1;
    if (ndim) {
        zr_broadcast_strides(ai, ndim, shape, as);
        zr_broadcast_strides(bi, ndim, shape, bs);
    } else
        as[0] = bs[0] = 1;
    compare_cpu_f64(zr_tensor_data(out), zr_tensor_data(ai), as, zr_tensor_data(bi), bs, ndim ? ndim : 1,
                    ndim ? shape : &one, op);
    zr_tensor_release(ai);
    zr_tensor_release(bi);
    return out;
}

zr_tensor *zr_compare_scalar(int op, zr_tensor *a, double s) {
    zr_tensor *st = zr_tensor_scalar(s, ZR_F64, zr_tensor_device(a));
    zr_tensor *r = st ? zr_compare(op, a, st) : NULL;
    zr_tensor_release(st);
    return r;
}

zr_tensor *zr_logical_not(zr_tensor *m) { return zr_compare_scalar(ZR_CMP_EQ, m, 0); }
