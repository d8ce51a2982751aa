/* Helpers shared by the ops files: argument checks, dtype promotion, and the CPU compute
 * convention (kernels take contiguous f32 or f64; bf16/f16 are widened to f32 and narrowed back).
 * Not part of the public API. */
#ifndef ZR_OPS_UTIL_H
#define ZR_OPS_UTIL_H

#include "core/autograd.h"
#include "core/tensor.h"
#include "kernels/cpu/kernels.h"

/* Calls fn_f32 or fn_f64 (void* data pointers convert implicitly). */
#define ZR_CPU_CALL(ct, fn, ...)                                                                   \
    do {                                                                                           \
        if ((ct) == ZR_F64) fn##_f64(__VA_ARGS__);                                                 \
        else fn##_f32(__VA_ARGS__);                                                                \
    } while (0)

static inline zr_dtype zr_cpu_compute_dtype(zr_dtype t) { return t == ZR_F64 ? ZR_F64 : ZR_F32; }
static inline int zr_is_cpu(const zr_tensor *t) { return t->storage->device.type == ZR_CPU; }
static inline zr_device zr_tensor_device(const zr_tensor *t) { return t->storage->device; }

/* Contiguous copy of t in dtype ct (a new reference to t itself when it already is). */
static inline zr_tensor *zr_cpu_in(zr_tensor *t, zr_dtype ct) {
    return zr_tensor_to_raw(t, ct, zr_tensor_device(t));
}
/* Buffer to compute an output of dtype ct into: out itself when it matches, else a temporary. */
static inline zr_tensor *zr_cpu_out_begin(zr_tensor *out, zr_dtype ct) {
    if (out->dtype == ct && zr_tensor_is_contiguous(out)) return zr_tensor_retain(out);
    return zr_tensor_new_cat(ct, zr_tensor_device(out), out->ndim, out->shape, ZR_MEM_WORKSPACE, 0);
}
/* Writes tmp back into out when they differ, and releases tmp. */
static inline zr_status zr_cpu_out_end(zr_tensor *out, zr_tensor *tmp) {
    zr_status st = tmp != out ? zr_tensor_copy_(out, tmp) : ZR_OK;
    zr_tensor_release(tmp);
    return st;
}

/* Takes over t (a new reference, e.g. a gradient) and returns it in dtype dt: t itself when it
 * already has it, else a converted copy (t is released). NULL-safe; NULL on failure. */
zr_tensor *zr_take_as(zr_tensor *t, zr_dtype dt);

/* Hands the gradients a backward computed over to the engine: for each of the k inputs that
 * needs one, d[i] (a new reference, may be NULL) moves into grad_in[i] in that input's dtype and
 * d[i] becomes NULL; d entries not handed over stay for the caller to release. */
zr_status zr_give_grads(zr_node *n, int k, zr_tensor **d, zr_tensor **grad_in);
/* Gradient g (owned; NULL counts as a failure) for input i of a broadcasting op: summed to the
 * input's shape and cast to its dtype, into grad_in[i]. */
zr_status zr_grad_to_input(zr_node *n, int i, zr_tensor *g, zr_tensor **grad_in);
/* The end of a one-input backward: on success g (owned) becomes grad_in[0]; on failure it is
 * released. Returns st. */
static inline zr_status zr_give_grad(zr_tensor **grad_in, zr_tensor *g, zr_status st) {
    if (st) {
        zr_tensor_release(g);
        return ZR_ERR;
    }
    grad_in[0] = g;
    return ZR_OK;
}

/* Result dtype of a binary op: the wider float type; a float beats an integer type. */
zr_dtype zr_promote(zr_dtype a, zr_dtype b);
/* Fails with "op: input 2 is on cuda:0 but input 1 is on cpu" when devices differ. */
zr_status zr_check_same_device(const char *op, int n, zr_tensor *const *ts);
/* Fails unless t has a floating dtype. */
zr_status zr_check_float(const char *op, const zr_tensor *t);
/* Broadcast shape of a and b (numpy rules); error names both shapes. */
zr_status zr_broadcast_shape(const char *op, const zr_tensor *a, const zr_tensor *b, int *ndim,
                             int64_t *shape);
/* Strides to read t as if expanded to (ndim, shape) (0 on broadcast dims); t must be contiguous
 * or strided — strides are taken from t. */
void zr_broadcast_strides(const zr_tensor *t, int ndim, const int64_t *shape, int64_t *stride);

/* Turns a CUDA kernel's return code into a status, prefixing the kernel's message with
 * "<op> on cuda:N: " (CUDA ops files). */
static inline zr_status zr_dev_status(int rc, const char *op, zr_device dev) {
    if (!rc) return ZR_OK;
    char d[16];
    zr_error_prefix("%s on %s: ", op, zr_device_name(dev, d));
    return ZR_ERR;
}

/* Builds the error for a CUDA op reached in a build without CUDA. */
zr_status zr_no_cuda(const char *op);

#endif
