/* Tensor headers, creation, refcounting and raw (non-autograd) views. Data movement and casts
 * are in tensor_copy.c; differentiable views in ops/view.c. */
#include "core/tensor.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/autograd.h"

static void set_contiguous_strides(zr_tensor *t) {
    int64_t s = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        t->stride[i] = s;
        s *= t->shape[i];
    }
}

static int check_shape(int ndim, const int64_t *shape) {
    if (ndim < 0 || ndim > ZR_MAX_DIMS)
        return zr_error("tensors have at most %d dims, got %d", ZR_MAX_DIMS, ndim);
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 0) return zr_error("negative size %lld in dim %d", (long long)shape[i], i + 1);
    return ZR_OK;
}

static zr_tensor *header(zr_dtype dt, int ndim, const int64_t *shape) {
    zr_tensor *t = calloc(1, sizeof *t);
    if (!t) return zr_error_null("out of host memory allocating a tensor header");
    t->refcount = 1;
    t->dtype = dt;
    t->ndim = ndim;
    if (ndim) memcpy(t->shape, shape, (size_t)ndim * sizeof(int64_t));
    return t;
}

zr_tensor *zr_tensor_new_cat(zr_dtype dt, zr_device dev, int ndim, const int64_t *shape,
                             zr_mem_category cat, int zero) {
    if (check_shape(ndim, shape)) return NULL;
    if ((unsigned)dt >= ZR_NDTYPES) return zr_error_null("unknown dtype %d", (int)dt);
    zr_tensor *t = header(dt, ndim, shape);
    if (!t) return NULL;
    set_contiguous_strides(t);
    t->storage = zr_storage_new(dev, (size_t)zr_tensor_numel(t) * zr_dtype_size(dt), cat, zero);
    if (!t->storage) {
        free(t);
        return NULL;
    }
    return t;
}

zr_tensor *zr_tensor_new(zr_dtype dt, zr_device dev, int ndim, const int64_t *shape) {
    return zr_tensor_new_cat(dt, dev, ndim, shape, zr_mem_default_category(), 0);
}
zr_tensor *zr_tensor_zeros(zr_dtype dt, zr_device dev, int ndim, const int64_t *shape) {
    return zr_tensor_new_cat(dt, dev, ndim, shape, zr_mem_default_category(), 1);
}
zr_tensor *zr_tensor_full(zr_dtype dt, zr_device dev, int ndim, const int64_t *shape, double v) {
    zr_tensor *t = zr_tensor_new(dt, dev, ndim, shape);
    if (t && zr_tensor_fill_(t, v)) {
        zr_tensor_release(t);
        return NULL;
    }
    return t;
}
zr_tensor *zr_tensor_empty_like(const zr_tensor *t) {
    return zr_tensor_new_cat(t->dtype, t->storage->device, t->ndim, t->shape, ZR_MEM_ACTIVATIONS, 0);
}
zr_tensor *zr_tensor_zeros_like(const zr_tensor *t) {
    return zr_tensor_new_cat(t->dtype, t->storage->device, t->ndim, t->shape, ZR_MEM_ACTIVATIONS, 1);
}
zr_tensor *zr_tensor_from_data(zr_dtype dt, int ndim, const int64_t *shape, const void *data) {
    zr_tensor *t = zr_tensor_new(dt, zr_cpu(), ndim, shape);
    if (t) memcpy(t->storage->data, data, t->storage->nbytes);
    return t;
}
zr_tensor *zr_tensor_scalar(double v, zr_dtype dt, zr_device dev) {
    return zr_tensor_full(dt, dev, 0, NULL, v);
}

zr_tensor *zr_tensor_arange(double start, double end, double step, zr_dtype dt, zr_device dev) {
    if (step == 0) return zr_error_null("arange: step must not be 0");
    double nf = (end - start) / step;
    int64_t n = nf <= 0 ? 0 : (int64_t)nf + ((double)(int64_t)nf < nf ? 1 : 0);
    zr_tensor *h = zr_tensor_new(ZR_F64, zr_cpu(), 1, &n);
    if (!h) return NULL;
    double *p = h->storage->data;
    for (int64_t i = 0; i < n; i++) p[i] = start + (double)i * step;
    zr_tensor *r = zr_tensor_to_raw(h, dt, dev);
    zr_tensor_release(h);
    return r;
}

zr_tensor *zr_tensor_retain(zr_tensor *t) {
    if (t) __atomic_add_fetch(&t->refcount, 1, __ATOMIC_RELAXED);
    return t;
}

void zr_tensor_release(zr_tensor *t) {
    if (!t || __atomic_sub_fetch(&t->refcount, 1, __ATOMIC_ACQ_REL) > 0) return;
    zr_storage_release(t->storage);
    zr_tensor_release(t->grad);
    zr_node_release(t->grad_fn);
    if (t->hook_ctx_free) t->hook_ctx_free(t->hook_ctx);
    free(t);
}

int64_t zr_tensor_numel(const zr_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

int zr_tensor_is_contiguous(const zr_tensor *t) {
    int64_t s = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->stride[i] != s) return 0;
        s *= t->shape[i];
    }
    return 1;
}

void *zr_tensor_data(const zr_tensor *t) {
    return (char *)t->storage->data + t->offset * (int64_t)zr_dtype_size(t->dtype);
}

int zr_tensor_same_shape(const zr_tensor *a, const zr_tensor *b) {
    if (a->ndim != b->ndim) return 0;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return 0;
    return 1;
}

const char *zr_shape_str(int ndim, const int64_t *shape, char *buf) {
    int off = snprintf(buf, 128, "(");
    for (int i = 0; i < ndim && off < 120; i++)
        off += snprintf(buf + off, (size_t)(128 - off), i ? ",%lld" : "%lld", (long long)shape[i]);
    snprintf(buf + off, (size_t)(128 - off), ")");
    return buf;
}
const char *zr_tensor_shape_str(const zr_tensor *t, char *buf) {
    return zr_shape_str(t->ndim, t->shape, buf);
}
const char *zr_tensor_describe(const zr_tensor *t, char *buf) {
    char s[128], d[16];
    snprintf(buf, 192, "%s %s on %s", zr_dtype_name(t->dtype), zr_tensor_shape_str(t, s),
             zr_device_name(t->storage->device, d));
    return buf;
}

int zr_dim_norm(int dim, int ndim, const char *op) {
    int n = ndim ? ndim : 1;
    int d = dim < 0 ? dim + n : dim;
    if (d < 0 || d >= n) {
        zr_error("%s: dim %d is out of range for a tensor with %d dims", op, dim, ndim);
        return -1;
    }
    return d;
}

/* --- raw views --- */

zr_tensor *zr_tensor_as_strided(zr_tensor *t, int ndim, const int64_t *shape,
                                const int64_t *stride, int64_t offset) {
    if (check_shape(ndim, shape)) return NULL;
    zr_tensor *v = header(t->dtype, ndim, shape);
    if (!v) return NULL;
    if (ndim) memcpy(v->stride, stride, (size_t)ndim * sizeof(int64_t));
    v->offset = offset;
    v->storage = t->storage;
    zr_storage_retain(t->storage);
    return v;
}

zr_tensor *zr_tensor_detach(zr_tensor *t) {
    return zr_tensor_as_strided(t, t->ndim, t->shape, t->stride, t->offset);
}

zr_status zr_tensor_set_data(zr_tensor *t, zr_tensor *src) {
    if (t->grad_fn) return zr_error("set_data: the tensor has autograd history (only a leaf can take new data)");
    if (t == src) return ZR_OK;
    int same = t->dtype == src->dtype && zr_device_eq(t->storage->device, src->storage->device) &&
               zr_tensor_same_shape(t, src);
    zr_storage_retain(src->storage);
    zr_storage_release(t->storage);
    t->storage = src->storage;
    t->dtype = src->dtype;
    t->ndim = src->ndim;
    memcpy(t->shape, src->shape, sizeof t->shape);
    memcpy(t->stride, src->stride, sizeof t->stride);
    t->offset = src->offset;
    if (!same) {
        zr_tensor_release(t->grad);
        t->grad = NULL;
        t->grad_stale = 0;
    }
    return ZR_OK;
}

/* Resolves one -1 in shape against numel n; writes the result to out. */
static int infer_shape(int ndim, const int64_t *shape, int64_t n, int64_t *out, const char *op) {
    int neg = -1;
    int64_t prod = 1;
    for (int i = 0; i < ndim; i++) {
        out[i] = shape[i];
        if (shape[i] == -1) {
            if (neg >= 0) return zr_error("%s: only one dimension can be -1", op);
            neg = i;
        } else if (shape[i] < 0) return zr_error("%s: invalid size %lld", op, (long long)shape[i]);
        else prod *= shape[i];
    }
    if (neg >= 0) {
        if (prod == 0 || n % prod) {
            char b[128];
            return zr_error("%s: shape %s is invalid for input of size %lld", op,
                            zr_shape_str(ndim, shape, b), (long long)n);
        }
        out[neg] = n / prod;
    } else if (prod != n) {
        char b[128];
        return zr_error("%s: shape %s is invalid for input of size %lld", op,
                        zr_shape_str(ndim, shape, b), (long long)n);
    }
    return ZR_OK;
}

zr_tensor *zr_tensor_view_raw(zr_tensor *t, int ndim, const int64_t *shape) {
    if (ndim > ZR_MAX_DIMS) return zr_error_null("view: at most %d dims", ZR_MAX_DIMS);
    int64_t sh[ZR_MAX_DIMS], st[ZR_MAX_DIMS];
    if (infer_shape(ndim, shape, zr_tensor_numel(t), sh, "view")) return NULL;
    if (zr_tensor_is_contiguous(t) || zr_tensor_numel(t) == 0) {
        int64_t s = 1;
        for (int i = ndim - 1; i >= 0; i--) {
            st[i] = s;
            s *= sh[i];
        }
        return zr_tensor_as_strided(t, ndim, sh, st, t->offset);
    }
    /* Walk old dims from the innermost, splitting them into chunks that are contiguous within
     * themselves; each chunk must be covered exactly by a run of new dims (torch's rule). */
    int view_d = ndim - 1;
    int64_t base = t->stride[t->ndim - 1], tnumel = 1, vnumel = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        tnumel *= t->shape[d];
        if (d == 0 || (t->shape[d - 1] != 1 && t->stride[d - 1] != tnumel * base)) {
            while (view_d >= 0 && (vnumel < tnumel || sh[view_d] == 1)) {
                st[view_d] = vnumel * base;
                vnumel *= sh[view_d];
                view_d--;
            }
            if (vnumel != tnumel) goto fail;
            if (d > 0) {
                base = t->stride[d - 1];
                tnumel = vnumel = 1;
            }
        }
    }
    if (view_d != -1) goto fail;
    return zr_tensor_as_strided(t, ndim, sh, st, t->offset);
fail:;
    char b1[128], b2[128];
    return zr_error_null("view: cannot view a non-contiguous tensor of shape %s as %s without a "
                         "copy; use reshape (or contiguous) first",
                         zr_tensor_shape_str(t, b1), zr_shape_str(ndim, sh, b2));
}

zr_tensor *zr_tensor_transpose_raw(zr_tensor *t, int d0, int d1) {
    if ((d0 = zr_dim_norm(d0, t->ndim, "transpose")) < 0) return NULL;
    if ((d1 = zr_dim_norm(d1, t->ndim, "transpose")) < 0) return NULL;
    if (t->ndim == 0) return zr_tensor_detach(t);
    int64_t sh[ZR_MAX_DIMS], st[ZR_MAX_DIMS];
    memcpy(sh, t->shape, sizeof sh);
    memcpy(st, t->stride, sizeof st);
    sh[d0] = t->shape[d1], sh[d1] = t->shape[d0];
    st[d0] = t->stride[d1], st[d1] = t->stride[d0];
    return zr_tensor_as_strided(t, t->ndim, sh, st, t->offset);
}

zr_tensor *zr_tensor_permute_raw(zr_tensor *t, const int *perm) {
    int64_t sh[ZR_MAX_DIMS], st[ZR_MAX_DIMS];
    int seen[ZR_MAX_DIMS] = {0};
    for (int i = 0; i < t->ndim; i++) {
        int p = zr_dim_norm(perm[i], t->ndim, "permute");
        if (p < 0) return NULL;
        if (seen[p]++) return zr_error_null("permute: dim %d appears twice", p + 1);
        sh[i] = t->shape[p];
        st[i] = t->stride[p];
    }
    return zr_tensor_as_strided(t, t->ndim, sh, st, t->offset);
}

zr_tensor *zr_tensor_narrow_raw(zr_tensor *t, int dim, int64_t start, int64_t len) {
    if ((dim = zr_dim_norm(dim, t->ndim, "narrow")) < 0) return NULL;
    if (start < 0 || len < 0 || start + len > t->shape[dim])
        return zr_error_null("narrow: range [%lld, %lld) is out of bounds for dim %d of size %lld",
                             (long long)start, (long long)(start + len), dim + 1,
                             (long long)t->shape[dim]);
    int64_t sh[ZR_MAX_DIMS];
    memcpy(sh, t->shape, sizeof sh);
    sh[dim] = len;
    return zr_tensor_as_strided(t, t->ndim, sh, t->stride, t->offset + start * t->stride[dim]);
}

zr_tensor *zr_tensor_expand_raw(zr_tensor *t, int ndim, const int64_t *shape) {
    if (ndim < t->ndim) {
        char b1[128], b2[128];
        return zr_error_null("expand: cannot expand %s to fewer dims %s", zr_tensor_shape_str(t, b1),
                             zr_shape_str(ndim, shape, b2));
    }
    int64_t sh[ZR_MAX_DIMS], st[ZR_MAX_DIMS];
    int lead = ndim - t->ndim;
    for (int i = 0; i < ndim; i++) {
        int64_t want = shape[i];
        if (i < lead) {
            sh[i] = want;
            st[i] = 0;
            continue;
        }
        int64_t have = t->shape[i - lead];
        if (want == -1) want = have;
        if (have == want) {
            sh[i] = have;
            st[i] = t->stride[i - lead];
        } else if (have == 1) {
            sh[i] = want;
            st[i] = 0;
        } else {
            char b1[128], b2[128];
            return zr_error_null("expand: size %lld of dim %d cannot expand to %lld (%s to %s)",
                                 (long long)have, i - lead + 1, (long long)want,
                                 zr_tensor_shape_str(t, b1), zr_shape_str(ndim, shape, b2));
        }
    }
    return zr_tensor_as_strided(t, ndim, sh, st, t->offset);
}
