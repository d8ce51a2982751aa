/* Shape/movement ops with autograd (see ops_view.h). The raw views are in tensor.c. */
#include "ops/view.h"

#include <stdlib.h>
#include <string.h>

#include "core/autograd.h"
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
