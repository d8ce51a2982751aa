/* Reductions: the reduced dims are permuted to the end so kernels reduce contiguous rows. */
#include "ops/reduce.h"

#include <stdlib.h>
#include <string.h>

#include "ops/elementwise.h"
#include "ops/util.h"

typedef struct {
    int perm[ZR_MAX_DIMS], inv[ZR_MAX_DIMS];
    int64_t outer, r;
    int out_ndim;
    int64_t out_shape[ZR_MAX_DIMS];
    int64_t keep_shape[ZR_MAX_DIMS]; /* x's shape with 1 on reduced dims */
} plan_t;

static zr_status make_plan(const char *op, const zr_tensor *x, int ndims, const int *dims,
                           int keepdim, plan_t *p) {
    int red[ZR_MAX_DIMS] = {0};
    if (ndims == 0)
        for (int d = 0; d < x->ndim; d++) red[d] = 1;
    for (int i = 0; i < ndims; i++) {
        int d = zr_dim_norm(dims[i], x->ndim, op);
        if (d < 0) return ZR_ERR;
        if (red[d]++) return zr_error("%s: dim %d is listed twice", op, d + 1);
    }
    int k = 0;
    p->outer = p->r = 1;
    p->out_ndim = 0;
    for (int d = 0; d < x->ndim; d++)
        if (!red[d]) {
            p->perm[k++] = d;
            p->outer *= x->shape[d];
        }
    for (int d = 0; d < x->ndim; d++)
        if (red[d]) {
            p->perm[k++] = d;
            p->r *= x->shape[d];
        }
    for (int i = 0; i < x->ndim; i++) p->inv[p->perm[i]] = i;
    for (int d = 0; d < x->ndim; d++) {
        p->keep_shape[d] = red[d] ? 1 : x->shape[d];
        if (keepdim || !red[d]) p->out_shape[p->out_ndim++] = red[d] ? 1 : x->shape[d];
    }
    return ZR_OK;
}

/* (outer, r) contiguous compute-dtype copy of x with reduced dims last. */
static zr_tensor *rows_of(zr_tensor *x, const plan_t *p, zr_dtype ct) {
    zr_tensor *xp = zr_tensor_permute_raw(x, p->perm);
    if (!xp) return NULL;
    zr_tensor *c = zr_cpu_in(xp, ct);
    zr_tensor_release(xp);
    return c;
}

/* --- CUDA path: kernels/cuda/reduce.h over the same (outer, r) rows, in the tensor's own dtype
 * (sums accumulate in f64 inside the kernel). zr_no_cuda in a CPU-only build. --- */
#ifdef ZR_HAVE_CUDA
#include "cuda/device.h"
#include "kernels/cuda/reduce.h"

/* Contiguous (outer, r) rows of x in its own dtype, reduced dims last. */
static zr_tensor *dev_rows(zr_tensor *x, const plan_t *p) {
    zr_tensor *xp = zr_tensor_permute_raw(x, p->perm);
    if (!xp) return NULL;
    zr_tensor *c = zr_tensor_contiguous_raw(xp);
    zr_tensor_release(xp);
    return c;
}
#endif

static zr_status sum_rows_dev(zr_tensor *out, zr_tensor *x, const plan_t *p, int mean, const char *op) {
#ifdef ZR_HAVE_CUDA
    zr_device dev = zr_tensor_device(x);
    if (p->outer == 0) return ZR_OK;
    if (p->r == 0) return zr_tensor_fill_(out, 0);
    zr_tensor *rows = dev_rows(x, p), *ws = NULL;
    if (!rows) return ZR_ERR;
    int64_t wsz = (int64_t)reduce_sum_rows_cuda_workspace(p->outer, p->r);
    if (wsz && !(ws = zr_tensor_new_cat(ZR_U8, dev, 1, &wsz, ZR_MEM_WORKSPACE, 0))) {
        zr_tensor_release(rows);
        return ZR_ERR;
    }
    int rc = reduce_sum_rows_cuda(zr_tensor_data(out), zr_tensor_data(rows), p->outer, p->r,
                                  mean ? 1.0 / (double)p->r : 1.0, ws ? zr_tensor_data(ws) : NULL, x->dtype,
                                  zr_cuda_stream(dev));
    zr_tensor_release(rows);
    zr_tensor_release(ws);
    return zr_dev_status(rc, op, dev);
#else
    return zr_no_cuda(op);
#endif
}

static zr_status max_rows_dev(zr_tensor *out, zr_tensor *idx, zr_tensor *x, const plan_t *p) {
#ifdef ZR_HAVE_CUDA
    zr_device dev = zr_tensor_device(x);
    if (p->outer == 0) return ZR_OK;
    zr_tensor *rows = dev_rows(x, p);
    if (!rows) return ZR_ERR;
    int rc = reduce_max_rows_cuda(zr_tensor_data(out), zr_tensor_data(idx), zr_tensor_data(rows), p->outer, p->r,
                                  x->dtype, zr_cuda_stream(dev));
    zr_tensor_release(rows);
    return zr_dev_status(rc, "max", dev);
#else
    return zr_no_cuda("max");
#endif
}

static zr_status max_backward_dev(zr_node *n, zr_tensor *g, zr_tensor **gin) {
#ifdef ZR_HAVE_CUDA
    plan_t *p = n->ctx;
    zr_edge *e = &n->edges[0];
    zr_device dev = zr_tensor_device(g);
    int64_t pshape[ZR_MAX_DIMS];
    for (int i = 0; i < e->ndim; i++) pshape[i] = e->shape[p->perm[i]];
    zr_tensor *gi = zr_tensor_to_raw(g, e->dtype, dev);
    zr_tensor *gp = gi ? zr_tensor_new_cat(e->dtype, dev, e->ndim, pshape, ZR_MEM_ACTIVATIONS, 0) : NULL;
    if (!gp) {
        zr_tensor_release(gi);
        return ZR_ERR;
    }
    int rc = reduce_max_rows_backward_cuda(zr_tensor_data(gp), zr_tensor_data(gi),
                                           (const int64_t *)zr_tensor_data(n->saved[0]), p->outer, p->r,
                                           e->dtype, zr_cuda_stream(dev));
    zr_tensor_release(gi);
    if (zr_dev_status(rc, "max backward", dev)) {
        zr_tensor_release(gp);
        return ZR_ERR;
    }
    zr_tensor *back = zr_tensor_permute_raw(gp, p->inv);
    zr_tensor_release(gp);
    if (!back) return ZR_ERR;
    gin[0] = zr_tensor_contiguous_raw(back);
    zr_tensor_release(back);
    return gin[0] ? ZR_OK : ZR_ERR;
#else
    return zr_no_cuda("max");
#endif
}

/* Broadcast g (reduced shape) back to x's shape, times scale, in dtype dt. */
static zr_tensor *expand_back(zr_tensor *g, int ndim, const int64_t *keep, const int64_t *shape,
                              double scale, zr_dtype dt) {
    zr_tensor *gc = zr_tensor_contiguous_raw(g);
    zr_tensor *v = gc ? zr_tensor_view_raw(gc, ndim, keep) : NULL;
    zr_tensor *e = v ? zr_tensor_expand_raw(v, ndim, shape) : NULL;
    zr_tensor *r = e ? zr_tensor_new_cat(dt, zr_tensor_device(g), ndim, shape, ZR_MEM_ACTIVATIONS, 0) : NULL;
    if (r && zr_tensor_copy_(r, e)) {
        zr_tensor_release(r);
        r = NULL;
    }
    if (r && scale != 1 && zr_mul_scalar_(r, scale)) {
        zr_tensor_release(r);
        r = NULL;
    }
    zr_tensor_release(gc);
    zr_tensor_release(v);
    zr_tensor_release(e);
    return r;
}

static zr_status sum_backward(zr_node *n, zr_tensor *g, zr_tensor **gin) {
    zr_edge *e = &n->edges[0];
    gin[0] = expand_back(g, e->ndim, (int64_t *)n->ctx, e->shape, n->f[0], e->dtype);
    return gin[0] ? ZR_OK : ZR_ERR;
}

static zr_tensor *reduce_sum(const char *op, zr_tensor *x, int ndims, const int *dims, int keepdim,
                             int mean) {
    plan_t p;
    if (zr_check_float(op, x) || make_plan(op, x, ndims, dims, keepdim, &p)) return NULL;
    if (mean && p.r == 0) return zr_error_null("%s: cannot take the mean over zero elements", op);
    zr_tensor *out = zr_tensor_new_cat(x->dtype, zr_tensor_device(x), p.out_ndim, p.out_shape,
                                       ZR_MEM_ACTIVATIONS, 0);
    if (!out) return NULL;
    if (!zr_is_cpu(x)) {
        if (sum_rows_dev(out, x, &p, mean, op)) goto fail;
        goto record;
    }
    zr_dtype ct = zr_cpu_compute_dtype(x->dtype);
    zr_tensor *rows = rows_of(x, &p, ct), *o = rows ? zr_cpu_out_begin(out, ct) : NULL;
    if (!o) {
        zr_tensor_release(rows);
        goto fail;
    }
    ZR_CPU_CALL(ct, reduce_sum_rows_cpu, zr_tensor_data(o), zr_tensor_data(rows), p.outer, p.r);
    if (mean) ZR_CPU_CALL(ct, affine_forward_cpu, zr_tensor_data(o), zr_tensor_data(o), p.outer, 1.0 / (double)p.r, 0);
    zr_tensor_release(rows);
    if (zr_cpu_out_end(out, o)) goto fail;
record:;
    zr_node *n;
    if (zr_autograd_record(out, op, sum_backward, 1, &x, &n)) goto fail;
    if (n) {
        n->f[0] = mean ? 1.0 / (double)p.r : 1.0;
        n->ctx = malloc(sizeof p.keep_shape);
        if (!n->ctx) {
            zr_error("out of host memory");
            goto fail;
        }
        memcpy(n->ctx, p.keep_shape, sizeof p.keep_shape);
        n->ctx_free = free;
    }
    return out;
fail:
    zr_tensor_release(out);
    return NULL;
}

zr_tensor *zr_sum(zr_tensor *x, int ndims, const int *dims, int keepdim) {
    return reduce_sum("sum", x, ndims, dims, keepdim, 0);
}
zr_tensor *zr_mean(zr_tensor *x, int ndims, const int *dims, int keepdim) {
    return reduce_sum("mean", x, ndims, dims, keepdim, 1);
}

/* saved[0]: argmax (outer) i64; ctx: plan. */
static zr_status max_backward(zr_node *n, zr_tensor *g, zr_tensor **gin) {
    if (!zr_is_cpu(g)) return max_backward_dev(n, g, gin);
    plan_t *p = n->ctx;
    zr_edge *e = &n->edges[0];
    zr_dtype ct = zr_cpu_compute_dtype(e->dtype);
    int64_t pshape[ZR_MAX_DIMS];
    for (int i = 0; i < e->ndim; i++) pshape[i] = e->shape[p->perm[i]];
    zr_tensor *gi = zr_cpu_in(g, ct);
    zr_tensor *gp = gi ? zr_tensor_new_cat(ct, zr_tensor_device(g), e->ndim, pshape, ZR_MEM_ACTIVATIONS, 0) : NULL;
    if (!gp) {
        zr_tensor_release(gi);
        return ZR_ERR;
    }
    ZR_CPU_CALL(ct, reduce_max_rows_backward_cpu, zr_tensor_data(gp), zr_tensor_data(gi),
                (const int64_t *)zr_tensor_data(n->saved[0]), p->outer, p->r);
    zr_tensor_release(gi);
    zr_tensor *back = zr_tensor_permute_raw(gp, p->inv);
    zr_tensor_release(gp);
    if (!back) return ZR_ERR;
    gin[0] = zr_tensor_to_raw(back, e->dtype, zr_tensor_device(back));
    zr_tensor_release(back);
    return gin[0] ? ZR_OK : ZR_ERR;
}

zr_tensor *zr_max(zr_tensor *x, int ndims, const int *dims, int keepdim, zr_tensor **indices) {
    plan_t p;
    if (indices) *indices = NULL;
    if (zr_check_float("max", x) || make_plan("max", x, ndims, dims, keepdim, &p)) return NULL;
    if (p.r == 0) return zr_error_null("max: cannot reduce over a dim of size 0");
    zr_tensor *out = zr_tensor_new_cat(x->dtype, zr_tensor_device(x), p.out_ndim, p.out_shape,
                                       ZR_MEM_ACTIVATIONS, 0);
    zr_tensor *idx = out ? zr_tensor_new_cat(ZR_I64, zr_tensor_device(x), p.out_ndim, p.out_shape,
                                             ZR_MEM_ACTIVATIONS, 0) : NULL;
    if (!idx) goto fail;
    if (!zr_is_cpu(x)) {
        if (max_rows_dev(out, idx, x, &p)) goto fail;
        goto record;
    }
    zr_dtype ct = zr_cpu_compute_dtype(x->dtype);
    zr_tensor *rows = rows_of(x, &p, ct), *o = rows ? zr_cpu_out_begin(out, ct) : NULL;
    if (!o) {
        zr_tensor_release(rows);
        goto fail;
    }
    ZR_CPU_CALL(ct, reduce_max_rows_cpu, zr_tensor_data(o), zr_tensor_data(idx), zr_tensor_data(rows), p.outer, p.r);
    zr_tensor_release(rows);
    if (zr_cpu_out_end(out, o)) goto fail;
record:;
    zr_node *n;
    if (zr_autograd_record(out, "max", max_backward, 1, &x, &n)) goto fail;
    if (n) {
        if (zr_node_save(n, idx)) goto fail;
        n->ctx = malloc(sizeof p);
        if (!n->ctx) goto fail;
        memcpy(n->ctx, &p, sizeof p);
        n->ctx_free = free;
    }
    if (indices) *indices = idx;
    else zr_tensor_release(idx);
    return out;
fail:
    zr_tensor_release(idx);
    zr_tensor_release(out);
    return NULL;
}
