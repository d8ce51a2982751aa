/* zr_tensor: a refcounted, strided view over a zr_storage, with the autograd fields.
 *
 *   int64_t shape[] = {4, 512};
 *   zr_tensor *x = zr_tensor_zeros(ZR_F32, zr_cpu(), 2, shape);   // refcount 1, owned by caller
 *   zr_tensor *y = zr_relu(x);                                     // ops return new references
 *   zr_tensor_release(y); zr_tensor_release(x);
 *
 * Functions that return zr_tensor* return a new reference, or NULL with zr_last_error() set.
 * Arguments are borrowed. Raw view functions here do not record autograd; the differentiable
 * versions (zr_view, zr_transpose, ...) live in ops/view.h. Strides and offsets count elements. */
#ifndef ZR_TENSOR_H
#define ZR_TENSOR_H

#include "core/alloc.h"
#include "kernels/base/dtype.h"
#include "kernels/base/error.h"

#define ZR_MAX_DIMS 8

typedef struct zr_node zr_node;
typedef struct zr_tensor zr_tensor;
/* Called when a leaf's gradient for the current backward pass is complete. */
typedef void (*zr_grad_hook)(zr_tensor *leaf, void *ctx);

struct zr_tensor {
    int refcount;
    int ndim;
    zr_dtype dtype;
    int64_t shape[ZR_MAX_DIMS];
    int64_t stride[ZR_MAX_DIMS];
    int64_t offset;
    zr_storage *storage;
    /* autograd */
    int requires_grad; /* leaf flag (set by the user) or "has a grad_fn" for op outputs */
    zr_tensor *grad;   /* accumulated gradient of a leaf, owned */
    zr_node *grad_fn;  /* node that produced this tensor, owned; NULL for leaves */
    zr_grad_hook hook;
    void *hook_ctx;
    void (*hook_ctx_free)(void *ctx);
    int hook_pending; /* uses left in the running backward pass (engine bookkeeping) */
    /* leaf: .grad holds stale values that count as zero (set by the ZeRO engine's zero_grad
     * instead of a fill); the next gradient overwrites it instead of adding, and clears this */
    int grad_stale;
};

/* --- creation --- */
zr_tensor *zr_tensor_new(zr_dtype dt, zr_device dev, int ndim, const int64_t *shape);
zr_tensor *zr_tensor_new_cat(zr_dtype dt, zr_device dev, int ndim, const int64_t *shape,
                             zr_mem_category cat, int zero);
zr_tensor *zr_tensor_zeros(zr_dtype dt, zr_device dev, int ndim, const int64_t *shape);
zr_tensor *zr_tensor_full(zr_dtype dt, zr_device dev, int ndim, const int64_t *shape, double v);
zr_tensor *zr_tensor_empty_like(const zr_tensor *t); /* same dtype/device/shape, contiguous */
zr_tensor *zr_tensor_zeros_like(const zr_tensor *t);
/* Copies n elements of dtype dt from host memory. */
zr_tensor *zr_tensor_from_data(zr_dtype dt, int ndim, const int64_t *shape, const void *data);
zr_tensor *zr_tensor_arange(double start, double end, double step, zr_dtype dt, zr_device dev);
zr_tensor *zr_tensor_scalar(double v, zr_dtype dt, zr_device dev); /* 0-dim */

/* --- lifetime --- */
zr_tensor *zr_tensor_retain(zr_tensor *t); /* returns t */
void zr_tensor_release(zr_tensor *t);      /* NULL-safe */

/* --- shape queries --- */
int64_t zr_tensor_numel(const zr_tensor *t);
int zr_tensor_is_contiguous(const zr_tensor *t);
void *zr_tensor_data(const zr_tensor *t); /* storage->data + offset (host or device pointer) */
int zr_tensor_same_shape(const zr_tensor *a, const zr_tensor *b);
/* "(4,512)"; buf of at least 128 bytes. */
const char *zr_shape_str(int ndim, const int64_t *shape, char *buf);
const char *zr_tensor_shape_str(const zr_tensor *t, char *buf);
/* "f32 (4,512) on cpu", for error messages; buf of at least 192 bytes. */
const char *zr_tensor_describe(const zr_tensor *t, char *buf);
/* Normalises a dim that may be negative (-1 = last); returns -1 with an error if out of range. */
int zr_dim_norm(int dim, int ndim, const char *op);

/* --- raw views (share storage, no autograd) --- */
zr_tensor *zr_tensor_as_strided(zr_tensor *t, int ndim, const int64_t *shape,
                                const int64_t *stride, int64_t offset);
/* shape may contain one -1; fails if the layout cannot be viewed without a copy. */
zr_tensor *zr_tensor_view_raw(zr_tensor *t, int ndim, const int64_t *shape);
zr_tensor *zr_tensor_transpose_raw(zr_tensor *t, int d0, int d1);
zr_tensor *zr_tensor_permute_raw(zr_tensor *t, const int *perm);
zr_tensor *zr_tensor_narrow_raw(zr_tensor *t, int dim, int64_t start, int64_t len);
zr_tensor *zr_tensor_expand_raw(zr_tensor *t, int ndim, const int64_t *shape);
zr_tensor *zr_tensor_detach(zr_tensor *t); /* same data, no autograd history */
/* torch's `param.data = src`: the leaf t takes src's dtype, shape, strides and storage and keeps
 * its identity (autograd flags, hooks), so every holder of t sees the new data. Its gradient is
 * dropped when the dtype, device or shape changes. Fails on a tensor with history. */
zr_status zr_tensor_set_data(zr_tensor *t, zr_tensor *src);

/* --- data movement (tensor_copy.c) --- */
/* dst and src must have the same numel; shapes may differ only if both are contiguous, or src
 * must broadcast to dst. Casts between any dtypes; copies between devices. */
zr_status zr_tensor_copy_(zr_tensor *dst, const zr_tensor *src);
/* n elements of host memory src (dtype st) into dst (dtype dt), both contiguous, converted as
 * zr_tensor_copy_ converts (bf16/f16 rounded to nearest even); dst == src only when dt == st. */
void zr_cast_contiguous(void *dst, zr_dtype dt, const void *src, zr_dtype st, int64_t n);
/* New contiguous tensor with dtype dt on dev (a new reference to t itself when nothing changes
 * and t is already contiguous). No autograd: see zr_to for the differentiable version. */
zr_tensor *zr_tensor_to_raw(zr_tensor *t, zr_dtype dt, zr_device dev);
zr_tensor *zr_tensor_contiguous_raw(zr_tensor *t);
zr_tensor *zr_tensor_clone_raw(zr_tensor *t);
zr_status zr_tensor_fill_(zr_tensor *t, double v);
/* Element i in logical (row-major) order, any dtype/device, as double. Slow; for tests/printing. */
zr_status zr_tensor_get(const zr_tensor *t, int64_t i, double *out);
zr_status zr_tensor_set(zr_tensor *t, int64_t i, double v);
/* Host copy of the whole tensor as contiguous doubles (caller frees). */
double *zr_tensor_to_doubles(const zr_tensor *t);

/* Cross-device copy hook, installed by the CUDA backend: copies nbytes between contiguous
 * buffers where at least one side is on a GPU. */
typedef zr_status (*zr_copy_fn)(void *dst, zr_device ddev, const void *src, zr_device sdev,
                                size_t nbytes);
void zr_tensor_set_device_copy(zr_copy_fn fn);
/* Device-side strided copy/cast and fill for CUDA tensors, installed by the CUDA backend. */
typedef zr_status (*zr_device_copy_fn)(zr_tensor *dst, const zr_tensor *src);
typedef zr_status (*zr_device_fill_fn)(zr_tensor *t, double v);
void zr_tensor_set_device_ops(zr_device_copy_fn copy, zr_device_fill_fn fill);

#endif
