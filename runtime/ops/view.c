/* Shape/movement ops with autograd (see view.h): views, copies, cat and split. The raw views are
 * in core/tensor.c. */
#include "ops/view.h"

#include <stdlib.h>
#include <string.h>

#include "core/autograd.h"
#include "ops/elementwise.h"
#include "ops/util.h"

/* Gradient with the input's shape, dtype and device (copying only if needed). */
static zr_tensor *to_input(zr_node *n, zr_tensor *g, int i) {
    zr_edge *e = &n->edges[i];
    zr_tensor *c = zr_tensor_to_raw(g, e->dtype, n->ctx ? *(zr_device *)n->ctx : zr_tensor_device(g));
    if (!c) return NULL;
    zr_tensor *v = zr_tensor_view_raw(c, e->ndim, e->shape);
    zr_tensor_release(c);
    return v;
}

static zr_status reshape_backward(zr_node *n, zr_tensor *g, zr_tensor **gin) {
    return (gin[0] = to_input(n, g, 0)) ? ZR_OK : ZR_ERR;
}

/* Records a node whose backward reshapes/casts the gradient to the input. Releases out on error. */
static zr_tensor *record_reshape(zr_tensor *out, zr_tensor *x, const char *name) {
    if (!out) return NULL;
    zr_node *n;
    if (zr_autograd_record(out, name, reshape_backward, 1, &x, &n)) {
        zr_tensor_release(out);
        return NULL;
    }
    if (n && !zr_device_eq(zr_tensor_device(x), zr_tensor_device(out))) {
        zr_device *d = malloc(sizeof *d);
        if (!d) {
            zr_tensor_release(out);
            return zr_error_null("out of host memory");
        }
        *d = zr_tensor_device(x);
        n->ctx = d;
        n->ctx_free = free;
    }
    return out;
}

zr_tensor *zr_view(zr_tensor *x, int ndim, const int64_t *shape) {
    return record_reshape(zr_tensor_view_raw(x, ndim, shape), x, "view");
}

zr_tensor *zr_reshape(zr_tensor *x, int ndim, const int64_t *shape) {
    if (zr_tensor_is_contiguous(x)) return zr_view(x, ndim, shape);
    zr_tensor *c = zr_tensor_contiguous_raw(x);
    if (!c) return NULL;
    zr_tensor *v = zr_tensor_view_raw(c, ndim, shape);
    zr_tensor_release(c);
    if (v) zr_storage_set_category(v->storage, ZR_MEM_ACTIVATIONS);
    return record_reshape(v, x, "reshape");
}

zr_tensor *zr_contiguous(zr_tensor *x) {
    if (zr_tensor_is_contiguous(x)) return zr_tensor_retain(x);
    return record_reshape(zr_tensor_clone_raw(x), x, "contiguous");
}

zr_tensor *zr_clone(zr_tensor *x) { return record_reshape(zr_tensor_clone_raw(x), x, "clone"); }

zr_tensor *zr_to(zr_tensor *x, zr_dtype dt, zr_device dev) {
    if (x->dtype == dt && zr_device_eq(zr_tensor_device(x), dev)) return zr_tensor_retain(x);
    zr_tensor *r = zr_tensor_new_cat(dt, dev, x->ndim, x->shape, x->storage->category, 0);
    if (r && zr_tensor_copy_(r, x)) {
        zr_tensor_release(r);
        r = NULL;
    }
    return record_reshape(r, x, "to");
}

zr_tensor *zr_unsqueeze(zr_tensor *x, int dim) {
    int d = zr_dim_norm(dim, x->ndim + 1, "unsqueeze");
    if (d < 0) return NULL;
    if (x->ndim >= ZR_MAX_DIMS) return zr_error_null("unsqueeze: at most %d dims", ZR_MAX_DIMS);
    int64_t sh[ZR_MAX_DIMS], st[ZR_MAX_DIMS];
    for (int i = 0, j = 0; i <= x->ndim; i++) {
        if (i == d) {
            sh[i] = 1;
            st[i] = j < x->ndim ? x->stride[j] * x->shape[j] : 1;
        } else {
            sh[i] = x->shape[j];
            st[i] = x->stride[j];
            j++;
        }
    }
    return record_reshape(zr_tensor_as_strided(x, x->ndim + 1, sh, st, x->offset), x, "unsqueeze");
}

zr_tensor *zr_squeeze(zr_tensor *x, int dim) {
    int64_t sh[ZR_MAX_DIMS], st[ZR_MAX_DIMS];
    int k = 0, d = -1;
    if (dim != ZR_ALL_DIMS && (d = zr_dim_norm(dim, x->ndim, "squeeze")) < 0) return NULL;
    for (int i = 0; i < x->ndim; i++) {
        int drop = x->shape[i] == 1 && (dim == ZR_ALL_DIMS || i == d);
        if (!drop) {
            sh[k] = x->shape[i];
            st[k++] = x->stride[i];
        }
    }
    return record_reshape(zr_tensor_as_strided(x, k, sh, st, x->offset), x, "squeeze");
}

static zr_status transpose_backward(zr_node *n, zr_tensor *g, zr_tensor **gin) {
    gin[0] = zr_tensor_transpose_raw(g, (int)n->i[0], (int)n->i[1]);
    return gin[0] ? ZR_OK : ZR_ERR;
}

zr_tensor *zr_transpose(zr_tensor *x, int d0, int d1) {
    zr_tensor *out = zr_tensor_transpose_raw(x, d0, d1);
    zr_node *n;
    if (!out) return NULL;
    if (zr_autograd_record(out, "transpose", transpose_backward, 1, &x, &n)) {
        zr_tensor_release(out);
        return NULL;
    }
    if (n) {
        n->i[0] = zr_dim_norm(d0, x->ndim, "transpose");
        n->i[1] = zr_dim_norm(d1, x->ndim, "transpose");
    }
    return out;
}

static zr_status permute_backward(zr_node *n, zr_tensor *g, zr_tensor **gin) {
    int inv[ZR_MAX_DIMS];
    for (int i = 0; i < g->ndim; i++) inv[n->i[i]] = i;
    gin[0] = zr_tensor_permute_raw(g, inv);
    return gin[0] ? ZR_OK : ZR_ERR;
}

zr_tensor *zr_permute(zr_tensor *x, const int *perm) {
    zr_tensor *out = zr_tensor_permute_raw(x, perm);
    zr_node *n;
    if (!out) return NULL;
    if (zr_autograd_record(out, "permute", permute_backward, 1, &x, &n)) {
        zr_tensor_release(out);
        return NULL;
    }
    if (n)
        for (int i = 0; i < x->ndim; i++) n->i[i] = zr_dim_norm(perm[i], x->ndim, "permute");
    return out;
}

/* i[0] = dim, i[1] = start: scatter g into a zero tensor of the input's shape. */
static zr_status narrow_backward(zr_node *n, zr_tensor *g, zr_tensor **gin) {
    zr_edge *e = &n->edges[0];
    zr_tensor *z = zr_tensor_new_cat(e->dtype, zr_tensor_device(g), e->ndim, e->shape, ZR_MEM_ACTIVATIONS, 1);
    if (!z) return ZR_ERR;
    zr_tensor *s = zr_tensor_narrow_raw(z, (int)n->i[0], n->i[1], n->i[2]);
    zr_tensor *gc = s ? zr_tensor_contiguous_raw(g) : NULL; /* select's g lacks the dim */
    zr_tensor *gv = gc ? zr_tensor_view_raw(gc, s->ndim, s->shape) : NULL;
    zr_status st = gv ? zr_tensor_copy_(s, gv) : ZR_ERR;
    zr_tensor_release(gv);
    zr_tensor_release(gc);
    zr_tensor_release(s);
    return zr_give_grad(gin, z, st);
}

zr_tensor *zr_narrow(zr_tensor *x, int dim, int64_t start, int64_t len) {
    int d = zr_dim_norm(dim, x->ndim, "narrow");
    if (d < 0) return NULL;
    zr_tensor *out = zr_tensor_narrow_raw(x, d, start, len);
    zr_node *n;
    if (!out) return NULL;
    if (zr_autograd_record(out, "narrow", narrow_backward, 1, &x, &n)) {
        zr_tensor_release(out);
        return NULL;
    }
    if (n) {
        n->i[0] = d;
        n->i[1] = start;
        n->i[2] = len;
    }
    return out;
}

zr_tensor *zr_select(zr_tensor *x, int dim, int64_t index) {
    int d = zr_dim_norm(dim, x->ndim, "select");
    if (d < 0) return NULL;
    if (index < 0) index += x->shape[d];
    if (index < 0 || index >= x->shape[d])
        return zr_error_null("index %lld is out of range for dim %d of size %lld",
                             (long long)index, d + 1, (long long)x->shape[d]);
    zr_tensor *v = zr_tensor_narrow_raw(x, d, index, 1);
    if (!v) return NULL;
    int64_t sh[ZR_MAX_DIMS], st[ZR_MAX_DIMS];
    for (int i = 0, k = 0; i < x->ndim; i++)
        if (i != d) {
            sh[k] = x->shape[i];
            st[k++] = x->stride[i];
        }
    zr_tensor *out = zr_tensor_as_strided(v, x->ndim - 1, sh, st, v->offset);
    zr_tensor_release(v);
    if (!out) return NULL;
    zr_node *n;
    if (zr_autograd_record(out, "select", narrow_backward, 1, &x, &n)) {
        zr_tensor_release(out);
        return NULL;
    }
    if (n) {
        n->i[0] = d;
        n->i[1] = index;
        n->i[2] = 1;
    }
    return out;
}

static zr_status expand_backward(zr_node *n, zr_tensor *g, zr_tensor **gin) {
    zr_edge *e = &n->edges[0];
    gin[0] = zr_sum_to_shape(g, e->ndim, e->shape);
    return gin[0] ? ZR_OK : ZR_ERR;
}

zr_tensor *zr_expand(zr_tensor *x, int ndim, const int64_t *shape) {
    zr_tensor *out = zr_tensor_expand_raw(x, ndim, shape);
    zr_node *n;
    if (!out) return NULL;
    if (zr_autograd_record(out, "expand", expand_backward, 1, &x, &n)) {
        zr_tensor_release(out);
        return NULL;
    }
    return out;
}

/* --- cat / split (copies, and views whose backward fills one buffer) --- */

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
