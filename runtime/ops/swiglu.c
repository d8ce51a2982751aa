/* Fused gated linear units forward/backward, SwiGLU and GeGLU (see ops/swiglu.h): the CPU path through
 * kernels/cpu/swiglu.c (bf16/f16 widened to f32), the CUDA path through kernels/cuda/swiglu.h. Tensors are
 * read as (M, F) rows, F the last dim (1 for a 0-dim tensor), with row stride ld = F. The node keeps the
 * activation in i[0]. */
#include "ops/swiglu.h"

#include <string.h>

#include "ops/util.h"

/* Rows and columns of the (M, F) view of t. */
static void rows_cols(const zr_tensor *t, int64_t *M, int64_t *F) {
    *F = t->ndim ? t->shape[t->ndim - 1] : 1;
    *M = *F ? zr_tensor_numel(t) / *F : 0;
}

/* --- CUDA path: both kernels take contiguous operands in the inputs' dtype (math in f32), on
 * the device's compute stream; strided inputs are copied to contiguous ones first. Empty tensors
 * launch nothing (the kernels reject F = 0). --- */
#ifdef ZR_HAVE_CUDA
#include "cuda/device.h"
#include "kernels/cuda/swiglu.h"
#endif

/* The op's name in messages and on its node */
static const char *glu_name(zr_glu_act act) { return act == ZR_GLU_SILU ? "swiglu" : "geglu"; }

static zr_status swiglu_forward_dev(zr_tensor *out, zr_tensor *gate, zr_tensor *up, zr_glu_act act) {
#ifdef ZR_HAVE_CUDA
    zr_device dev = zr_tensor_device(gate);
    int64_t M, F;
    rows_cols(gate, &M, &F);
    if (!M) return ZR_OK;
    zr_tensor *gi = zr_tensor_contiguous_raw(gate);
    zr_tensor *ui = gi ? zr_tensor_contiguous_raw(up) : NULL;
    zr_status st = ZR_ERR;
    if (ui) {
        int rc = glu_forward_cuda(zr_tensor_data(out), zr_tensor_data(gi), zr_tensor_data(ui), M, F, F, act,
                                  gate->dtype, zr_cuda_stream(dev));
        st = zr_dev_status(rc, glu_name(act), dev);
    }
    zr_tensor_release(gi);
    zr_tensor_release(ui);
    return st;
#else
    (void)out, (void)gate, (void)up;
    return zr_no_cuda(glu_name(act));
#endif
}

/* Sets d[0], d[1] (dgate, dup: new references, contiguous, the inputs' dtype) for the inputs the
 * node needs; the kernel writes both, so an unwanted one goes to a dropped workspace buffer. */
static zr_status swiglu_backward_dev(zr_node *n, zr_tensor *g, zr_tensor *gate, zr_tensor *up,
                                     zr_tensor **d) {
#ifdef ZR_HAVE_CUDA
    zr_device dev = zr_tensor_device(gate);
    zr_dtype dt = gate->dtype;
    int64_t M, F;
    rows_cols(gate, &M, &F);
    zr_tensor *buf[2] = {NULL, NULL};
    zr_tensor *gi = zr_tensor_to_raw(g, dt, dev);
    zr_tensor *ga = gi ? zr_tensor_contiguous_raw(gate) : NULL;
    zr_tensor *ua = ga ? zr_tensor_contiguous_raw(up) : NULL;
    zr_status st = ZR_ERR;
    if (!ua) goto done;
    for (int i = 0; i < 2; i++) {
        zr_mem_category cat = zr_node_needs_grad(n, i) ? ZR_MEM_ACTIVATIONS : ZR_MEM_WORKSPACE;
        if (!(buf[i] = zr_tensor_new_cat(dt, dev, gate->ndim, gate->shape, cat, 0))) goto done;
    }
    if (M) {
        int rc = glu_backward_cuda(zr_tensor_data(buf[0]), zr_tensor_data(buf[1]), zr_tensor_data(gi),
                                   zr_tensor_data(ga), zr_tensor_data(ua), M, F, F, (zr_glu_act)n->i[0], dt,
                                   zr_cuda_stream(dev));
        if (zr_dev_status(rc, n->name, dev)) goto done;
    }
    for (int i = 0; i < 2; i++)
        if (zr_node_needs_grad(n, i)) {
            d[i] = buf[i];
            buf[i] = NULL;
        }
    st = ZR_OK;
done:
    zr_tensor_release(buf[0]);
    zr_tensor_release(buf[1]);
    zr_tensor_release(gi);
    zr_tensor_release(ga);
    zr_tensor_release(ua);
    return st;
#else
    (void)g, (void)gate, (void)up, (void)d;
    return zr_no_cuda(n->name);
#endif
}

/* saved: gate, up (as given; act(gate) is recomputed here, never kept) */
static zr_status swiglu_backward(zr_node *n, zr_tensor *g, zr_tensor **gin) {
    zr_tensor *gate = n->saved[0], *up = n->saved[1];
    zr_tensor *d[2] = {NULL, NULL}, *gi = NULL, *ga = NULL, *ua = NULL;
    zr_status st = ZR_ERR;
    if (!zr_is_cpu(gate)) {
        if (!swiglu_backward_dev(n, g, gate, up, d)) st = zr_give_grads(n, 2, d, gin);
        goto done;
    }
    zr_dtype ct = zr_cpu_compute_dtype(gate->dtype);
    zr_device dev = zr_tensor_device(gate);
    int64_t M, F;
    rows_cols(gate, &M, &F);
    if (!(gi = zr_cpu_in(g, ct)) || !(ga = zr_cpu_in(gate, ct)) || !(ua = zr_cpu_in(up, ct)))
        goto done;
    for (int i = 0; i < 2; i++)
        if (zr_node_needs_grad(n, i) &&
            !(d[i] = zr_tensor_new_cat(ct, dev, gate->ndim, gate->shape, ZR_MEM_ACTIVATIONS, 0)))
            goto done;
    ZR_CPU_CALL(ct, glu_backward_cpu, d[0] ? zr_tensor_data(d[0]) : NULL,
                d[1] ? zr_tensor_data(d[1]) : NULL, zr_tensor_data(gi), zr_tensor_data(ga),
                zr_tensor_data(ua), M, F, F, (int)n->i[0]);
    st = zr_give_grads(n, 2, d, gin);
done:
    zr_tensor_release(d[0]);
    zr_tensor_release(d[1]);
    zr_tensor_release(gi);
    zr_tensor_release(ga);
    zr_tensor_release(ua);
    return st;
}

static zr_status check_args(const char *op, zr_tensor *gate, zr_tensor *up, zr_glu_act act) {
    char b1[128], b2[128], d1[16];
    if (act != ZR_GLU_SILU && act != ZR_GLU_GELU_TANH && act != ZR_GLU_GELU)
        return zr_error("%s: unknown activation %d", op, (int)act);
    if (!gate || !up) return zr_error("%s: missing input", op);
    if (zr_check_float(op, gate) || zr_check_float(op, up)) return ZR_ERR;
    if (zr_check_same_device(op, 2, (zr_tensor *[]){gate, up})) return ZR_ERR;
    if (!zr_tensor_same_shape(gate, up))
        return zr_error("%s: gate %s and up %s must have the same shape (no broadcasting)", op,
                        zr_tensor_shape_str(gate, b1), zr_tensor_shape_str(up, b2));
    if (gate->dtype != up->dtype)
        return zr_error("%s: gate is %s but up is %s; both must have one dtype "
                        "(cast with :to())",
                        op, zr_dtype_name(gate->dtype), zr_dtype_name(up->dtype));
    if (!zr_is_cpu(gate) && gate->dtype == ZR_F64)
        return zr_error("%s on %s: f64 is not supported (use f32, bf16 or f16)", op,
                        zr_device_name(zr_tensor_device(gate), d1));
    return ZR_OK;
}

zr_tensor *zr_swiglu(zr_tensor *gate, zr_tensor *up) { return zr_glu(gate, up, ZR_GLU_SILU); }

zr_tensor *zr_glu(zr_tensor *gate, zr_tensor *up, zr_glu_act act) {
    const char *op = glu_name(act);
    if (check_args(op, gate, up, act)) return NULL;
    zr_device dev = zr_tensor_device(gate);
    zr_tensor *out =
        zr_tensor_new_cat(gate->dtype, dev, gate->ndim, gate->shape, ZR_MEM_ACTIVATIONS, 0);
    zr_tensor *gi = NULL, *ui = NULL, *o = NULL;
    zr_node *n;
    if (!out) return NULL;
    if (!zr_is_cpu(gate)) {
        if (swiglu_forward_dev(out, gate, up, act)) goto fail;
    } else {
        zr_dtype ct = zr_cpu_compute_dtype(gate->dtype);
        int64_t M, F;
        rows_cols(gate, &M, &F);
        if (!(gi = zr_cpu_in(gate, ct)) || !(ui = zr_cpu_in(up, ct)) ||
            !(o = zr_cpu_out_begin(out, ct)))
            goto fail;
        ZR_CPU_CALL(ct, glu_forward_cpu, zr_tensor_data(o), zr_tensor_data(gi),
                    zr_tensor_data(ui), M, F, F, (int)act);
        zr_status st = zr_cpu_out_end(out, o);
        o = NULL;
        if (st) goto fail;
    }
    if (zr_autograd_record(out, op, swiglu_backward, 2, (zr_tensor *[]){gate, up}, &n))
        goto fail;
    if (n) n->i[0] = act;
    if (n && (zr_node_save(n, gate) || zr_node_save(n, up))) goto fail;
    zr_tensor_release(gi);
    zr_tensor_release(ui);
    return out;
fail:
    zr_tensor_release(o);
    zr_tensor_release(gi);
    zr_tensor_release(ui);
    zr_tensor_release(out);
    return NULL;
}

/* --- packed: gate and up side by side in each row of one (M, 2F) tensor (kernels with row
 * stride ld = 2F, up = gate + F), one gradient of that shape backward --- */

static void *elem(zr_tensor *t, int64_t i) {
    return (char *)zr_tensor_data(t) + i * (int64_t)zr_dtype_size(t->dtype);
}

/* saved: gu (as given) */
static zr_status swiglu_packed_backward(zr_node *n, zr_tensor *g, zr_tensor **gin) {
    zr_tensor *gu = n->saved[0];
    zr_device dev = zr_tensor_device(gu);
    int cpu = zr_is_cpu(gu);
    zr_dtype ct = cpu ? zr_cpu_compute_dtype(gu->dtype) : gu->dtype;
    int64_t M, F2;
    rows_cols(gu, &M, &F2);
    int64_t F = F2 / 2;
    zr_tensor *gi = zr_tensor_to_raw(g, ct, dev), *ga = gi ? zr_tensor_to_raw(gu, ct, dev) : NULL;
    zr_tensor *d = ga ? zr_tensor_new_cat(ct, dev, gu->ndim, gu->shape, ZR_MEM_ACTIVATIONS, 0) : NULL;
    zr_status st = d ? ZR_OK : ZR_ERR;
    if (d && M && F) {
        if (cpu)
            ZR_CPU_CALL(ct, glu_backward_cpu, zr_tensor_data(d), elem(d, F), zr_tensor_data(gi),
                        zr_tensor_data(ga), elem(ga, F), M, F, F2, (int)n->i[0]);
#ifdef ZR_HAVE_CUDA
        else
            st = zr_dev_status(glu_backward_cuda(zr_tensor_data(d), elem(d, F), zr_tensor_data(gi),
                                                 zr_tensor_data(ga), elem(ga, F), M, F, F2, (zr_glu_act)n->i[0],
                                                 ct, zr_cuda_stream(dev)),
                               n->name, dev);
#endif
    }
    zr_tensor_release(gi);
    zr_tensor_release(ga);
    if (!st && !(d = zr_take_as(d, n->edges[0].dtype))) st = ZR_ERR;
    return zr_give_grad(gin, d, st);
}

zr_tensor *zr_swiglu_packed(zr_tensor *gu) { return zr_glu_packed(gu, ZR_GLU_SILU); }

zr_tensor *zr_glu_packed(zr_tensor *gu, zr_glu_act act) {
    char b1[128], d1[16];
    const char *op = glu_name(act);
    if (act != ZR_GLU_SILU && act != ZR_GLU_GELU_TANH && act != ZR_GLU_GELU)
        return zr_error_null("%s: unknown activation %d", op, (int)act);
    if (!gu) return zr_error_null("%s: missing input", op);
    if (zr_check_float(op, gu)) return NULL;
    if (gu->ndim == 0 || gu->shape[gu->ndim - 1] % 2)
        return zr_error_null("%s: one tensor holds gate and up packed in its last dim, which must be "
                             "even, got %s; or pass gate and up as two tensors",
                             op, zr_tensor_shape_str(gu, b1));
    zr_device dev = zr_tensor_device(gu);
    if (!zr_is_cpu(gu) && gu->dtype == ZR_F64)
        return zr_error_null("%s on %s: f64 is not supported (use f32, bf16 or f16)", op, zr_device_name(dev, d1));
    int64_t M, F2, shape[ZR_MAX_DIMS];
    rows_cols(gu, &M, &F2);
    int64_t F = F2 / 2;
    memcpy(shape, gu->shape, sizeof shape);
    shape[gu->ndim - 1] = F;
    zr_tensor *out = zr_tensor_new_cat(gu->dtype, dev, gu->ndim, shape, ZR_MEM_ACTIVATIONS, 0);
    zr_tensor *gi = NULL, *o = NULL;
    zr_node *n;
    if (!out) return NULL;
    if (M && F) {
        if (zr_is_cpu(gu)) {
            zr_dtype ct = zr_cpu_compute_dtype(gu->dtype);
            if (!(gi = zr_cpu_in(gu, ct)) || !(o = zr_cpu_out_begin(out, ct))) goto fail;
            ZR_CPU_CALL(ct, glu_forward_cpu, zr_tensor_data(o), zr_tensor_data(gi), elem(gi, F), M, F, F2, (int)act);
            zr_status st = zr_cpu_out_end(out, o);
            o = NULL;
            if (st) goto fail;
        } else {
#ifdef ZR_HAVE_CUDA
            if (!(gi = zr_tensor_contiguous_raw(gu))) goto fail;
            if (zr_dev_status(glu_forward_cuda(zr_tensor_data(out), zr_tensor_data(gi), elem(gi, F), M, F, F2, act,
                                               gu->dtype, zr_cuda_stream(dev)),
                              op, dev))
                goto fail;
#else
            zr_no_cuda(op);
            goto fail;
#endif
        }
    }
    if (zr_autograd_record(out, op, swiglu_packed_backward, 1, &gu, &n)) goto fail;
    if (n) n->i[0] = act;
    if (n && zr_node_save(n, gu)) goto fail;
    zr_tensor_release(gi);
    return out;
fail:
    zr_tensor_release(o);
    zr_tensor_release(gi);
    zr_tensor_release(out);
    return NULL;
}
