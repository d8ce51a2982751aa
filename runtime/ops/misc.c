/* Dropout, cat/split, where/masked_fill and comparisons: forward and backward side by side (see
 * ops_misc.h). CUDA tensors run the same ops on the device: the dropout mask is a device
 * Bernoulli fill (the same numbers as the CPU for the same seed), where uses the strided where
 * kernel, comparisons kernels/cuda/misc.h; cat/split are views and device copies. */
#include "ops/misc.h"

#include <stdlib.h>
#include <string.h>

#include "core/random.h"
#include "ops/elementwise.h"
#include "ops/util.h"
#include "ops/view.h"

#ifdef ZR_HAVE_CUDA
#include "cuda/device.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/misc.h"
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

/* Casts r to dt, consuming r. */

/* Kernel dtype for a result of dtype dt: f32/f64 for floats, f64 (exact) for integers. */
static zr_dtype kernel_dtype(zr_dtype dt) {
    return zr_dtype_is_float(dt) ? zr_cpu_compute_dtype(dt) : ZR_F64;
}

/* --- dropout --- */

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

/* --- cat / split --- */

/* i[0] = dim; each input's size along dim is in its edge's shape. */
static zr_status cat_backward(zr_node *n, zr_tensor *g, zr_tensor **gin) {
    int d = (int)n->i[0];
    int64_t off = 0;
    for (int i = 0; i < n->n_inputs; i++) {
        zr_edge *e = &n->edges[i];
        int64_t sz = e->shape[d];
        if (zr_node_needs_grad(n, i)) {
            zr_tensor *v = zr_tensor_narrow_raw(g, d, off, sz);
            gin[i] = v ? zr_tensor_to_raw(v, e->dtype, zr_tensor_device(g)) : NULL;
            zr_tensor_release(v);
            if (!gin[i]) return ZR_ERR;
        }
        off += sz;
    }
    return ZR_OK;
}

zr_tensor *zr_cat(zr_tensor *const *ts, int n, int dim) {
    char b1[128], b2[128];
    if (n < 1) return zr_error_null("cat: expected at least one tensor");
    zr_tensor *t0 = ts[0];
    if (t0->ndim == 0) return zr_error_null("cat: tensor 1 is a scalar (0-dim); scalars cannot be concatenated");
    int d = zr_dim_norm(dim, t0->ndim, "cat");
    if (d < 0) return NULL;
    if (zr_check_same_device("cat", n, ts)) return NULL;
    int64_t shape[ZR_MAX_DIMS];
    memcpy(shape, t0->shape, sizeof shape);
    shape[d] = 0;
    zr_dtype dt = t0->dtype;
    for (int i = 0; i < n; i++) {
        zr_tensor *t = ts[i];
        int ok = t->ndim == t0->ndim;
        for (int k = 0; ok && k < t0->ndim; k++) ok = k == d || t->shape[k] == t0->shape[k];
        if (!ok)
            return zr_error_null("cat: tensor %d has shape %s but tensor 1 has shape %s; they must "
                                 "match in every dim except dim %d", i + 1, zr_tensor_shape_str(t, b1),
                                 zr_tensor_shape_str(t0, b2), d + 1);
        shape[d] += t->shape[d];
        dt = zr_promote(dt, t->dtype);
    }
    zr_tensor *out = zr_tensor_new_cat(dt, zr_tensor_device(t0), t0->ndim, shape, ZR_MEM_ACTIVATIONS, 0);
    if (!out) return NULL;
    int64_t off = 0;
    for (int i = 0; i < n; i++) {
        int64_t sz = ts[i]->shape[d];
        if (sz && zr_tensor_numel(ts[i])) {
            zr_tensor *slot = zr_tensor_narrow_raw(out, d, off, sz);
            zr_status st = slot ? zr_tensor_copy_(slot, ts[i]) : ZR_ERR;
            zr_tensor_release(slot);
            if (st) goto fail;
        }
        off += sz;
    }
    zr_node *nd;
    if (zr_autograd_record(out, "cat", cat_backward, n, ts, &nd)) goto fail;
    if (nd) nd->i[0] = d;
    return out;
fail:
    zr_tensor_release(out);
    return NULL;
}

/* What the parts of one split share: where each part lies along dim. */
typedef struct {
    int refcount, n, dim;
    int64_t *start, *len;
    unsigned char *written; /* per part: wrote into the producer's buffer since the mark began */
} split_group;

static void group_release(void *p) {
    split_group *g = p;
    if (!g || --g->refcount > 0) return;
    free(g->start);
    free(g->written);
    free(g);
}

/* End of the group's mark on the producer's gradient buffer: the slices of parts that wrote
 * nothing (no gradient reached them) become zeros; then the mark's reference goes. */
static zr_status split_finish(const void *owner, zr_tensor *buf) {
    split_group *sg = (split_group *)owner;
    zr_status st = ZR_OK;
    for (int j = 0; buf && j < sg->n && !st; j++) {
        if (sg->written[j] || sg->len[j] == 0) continue;
        zr_tensor *o = zr_tensor_narrow_raw(buf, sg->dim, sg->start[j], sg->len[j]);
        st = o ? zr_tensor_fill_(o, 0) : ZR_ERR;
        zr_tensor_release(o);
    }
    memset(sg->written, 0, (size_t)sg->n);
    group_release(sg);
    return st;
}

/* i[0] = this part's index in its group (n->ctx). */
static zr_status split_backward(zr_node *n, zr_tensor *g, zr_tensor **gin) {
    split_group *sg = n->ctx;
    int k = (int)n->i[0], d = sg->dim;
    zr_edge *e = &n->edges[0];
    zr_status st = ZR_ERR;
    zr_tensor *buf, *s = NULL;
    int state;
    if (e->fn) { /* into the producer's one gradient buffer */
        if (zr_node_input_grad_buffer(n, 0, sg, split_finish, &buf, &state)) return ZR_ERR;
        if (state == ZR_GRADBUF_NEW) { /* uninitialized: split_finish zeroes what no part wrote */
            sg->refcount++; /* the owner mark's reference, dropped by split_finish */
            memset(sg->written, 0, (size_t)sg->n);
        }
        if (state != ZR_GRADBUF_SHARED) sg->written[k] = 1;
        if (!(s = zr_tensor_narrow_raw(buf, d, sg->start[k], sg->len[k]))) return ZR_ERR;
        st = state == ZR_GRADBUF_SHARED ? zr_add_(s, g, 1.0) : zr_tensor_copy_(s, g);
        zr_tensor_release(s);
        return st;
    }
    zr_tensor *lg = zr_node_leaf_grad(n, 0);
    if (lg && !e->leaf->grad_stale) { /* a leaf with a gradient: add into its slice */
        if (!(s = zr_tensor_narrow_raw(lg, d, sg->start[k], sg->len[k]))) return ZR_ERR;
        st = zr_add_(s, g, 1.0);
        zr_tensor_release(s);
        return st;
    }
    /* a leaf without one: a zero-padded gradient, as narrow's backward gives */
    zr_tensor *z = zr_tensor_new_cat(e->dtype, zr_tensor_device(g), e->ndim, e->shape, ZR_MEM_ACTIVATIONS, 1);
    if (!z) return ZR_ERR;
    s = zr_tensor_narrow_raw(z, d, sg->start[k], sg->len[k]);
    st = s ? zr_tensor_copy_(s, g) : ZR_ERR;
    zr_tensor_release(s);
    return zr_give_grad(gin, z, st);
}

zr_status zr_split_sizes(zr_tensor *x, int n, const int64_t *sizes, int dim, zr_tensor **out) {
    char b1[128];
    if (!x || n < 1) return zr_error("split: expected a tensor and at least one size");
    int d = zr_dim_norm(dim, x->ndim, "split");
    if (d < 0) return ZR_ERR;
    int64_t total = 0;
    for (int i = 0; i < n; i++) {
        if (sizes[i] < 0) return zr_error("split: size %d is negative (%lld)", i + 1, (long long)sizes[i]);
        total += sizes[i];
    }
    if (total != x->shape[d])
        return zr_error("split: sizes sum to %lld but dim %d of x %s has size %lld", (long long)total, d + 1,
                        zr_tensor_shape_str(x, b1), (long long)x->shape[d]);
    split_group *g = calloc(1, sizeof *g);
    int64_t *st = calloc((size_t)n * 2, sizeof *st);
    unsigned char *wr = calloc((size_t)n, 1);
    if (!g || !st || !wr) {
        free(g);
        free(st);
        free(wr);
        return zr_error("split: out of host memory");
    }
    g->written = wr;
    g->refcount = 1; /* this function's, dropped at the end */
    g->n = n;
    g->dim = d;
    g->start = st;
    g->len = st + n;
    for (int i = 0; i < n; i++) {
        g->start[i] = i ? g->start[i - 1] + g->len[i - 1] : 0;
        g->len[i] = sizes[i];
    }
    for (int i = 0; i < n; i++) out[i] = NULL;
    zr_status rc = ZR_OK;
    for (int i = 0; i < n && !rc; i++) {
        out[i] = zr_tensor_narrow_raw(x, d, g->start[i], g->len[i]);
        zr_node *nd;
        if (!out[i] || zr_autograd_record(out[i], "split", split_backward, 1, &x, &nd)) {
            rc = ZR_ERR;
            break;
        }
        if (nd) {
            nd->i[0] = i;
            nd->ctx = g;
            nd->ctx_free = group_release;
            g->refcount++;
        }
    }
    group_release(g);
    if (rc)
        for (int i = 0; i < n; i++) {
            zr_tensor_release(out[i]);
            out[i] = NULL;
        }
    return rc;
}

zr_tensor **zr_split(zr_tensor *x, int64_t chunk, int dim, int *n) {
    *n = 0;
    int d = zr_dim_norm(dim, x->ndim, "split");
    if (d < 0) return NULL;
    if (chunk <= 0) return zr_error_null("split: chunk size must be > 0, got %lld", (long long)chunk);
    int64_t S = x->shape[d], cnt = S == 0 ? 1 : (S + chunk - 1) / chunk;
    if (cnt > (1 << 24)) return zr_error_null("split: %lld pieces is too many", (long long)cnt);
    int64_t *sizes = malloc((size_t)cnt * sizeof *sizes);
    zr_tensor **out = calloc((size_t)cnt, sizeof *out);
    if (!sizes || !out) {
        free(sizes);
        free(out);
        return zr_error_null("split: out of host memory");
    }
    for (int64_t i = 0; i < cnt; i++) sizes[i] = S - i * chunk < chunk ? S - i * chunk : chunk;
    zr_status st = zr_split_sizes(x, (int)cnt, sizes, d, out);
    free(sizes);
    if (st) {
        free(out);
        return NULL;
    }
    *n = (int)cnt;
    return out;
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
