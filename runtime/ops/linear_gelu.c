/* linear then tanh GELU as one op (see ops/linear_gelu.h): the CUDA path is one cuBLASLt product
 * with the GELU epilogue (runtime/cuda/blas_plan.h); the CPU path, and CUDA shapes the epilogue
 * does not take, run zr_linear and the GELU as they run unfused (no autograd inside). */
#include "ops/linear_gelu.h"

#include "core/autograd.h"
#include "ops/elementwise.h"
#include "ops/matmul.h"
#include "ops/util.h"

#ifdef ZR_HAVE_CUDA
#include "cuda/blas_plan.h"
#include "cuda/device.h"
#endif

/* The epilogue's conditions: one CUDA dtype for x, w, b (bf16, f16 or f32; cuBLASLt's aux is the
 * output's dtype), matching shapes, and out a multiple of 8 (the aux leading dimension). */
static int epilogue_fits(const zr_tensor *x, const zr_tensor *w, const zr_tensor *b) {
    zr_dtype dt = x->dtype;
    if (zr_is_cpu(x) || (dt != ZR_BF16 && dt != ZR_F16 && dt != ZR_F32) || w->dtype != dt ||
        (b && b->dtype != dt))
        return 0;
    zr_device d = zr_tensor_device(x), dw = zr_tensor_device(w), db = b ? zr_tensor_device(b) : d;
    if (dw.type != d.type || dw.index != d.index || db.type != d.type || db.index != d.index) return 0;
    if (w->ndim != 2 || x->ndim == 0 || x->shape[x->ndim - 1] != w->shape[1] || w->shape[1] < 1 ||
        w->shape[0] % 8 || zr_tensor_numel(x) == 0)
        return 0;
    return !b || (b->ndim == 1 && b->shape[0] == w->shape[0]);
}

/* out and pre (rows, nout) through the epilogue; x read contiguous, wᵀ in place (GPT-2's Conv1D
 * weight is stored (in, out): its transposed view is read without a copy). */
static zr_status forward_dev(zr_tensor *out, zr_tensor *pre, zr_tensor *x, zr_tensor *w, zr_tensor *b) {
#ifdef ZR_HAVE_CUDA
    zr_device dev = zr_tensor_device(x);
    int64_t in = w->shape[1], nout = w->shape[0], rows = zr_tensor_numel(x) / in;
    zr_tensor *xi = zr_tensor_contiguous_raw(x), *wt = xi ? zr_tensor_transpose_raw(w, 0, 1) : NULL;
    zr_tensor *bi = wt && b ? zr_tensor_contiguous_raw(b) : NULL;
    zr_gemm_operand W = {0};
    zr_status st = ZR_ERR;
    if (wt && (!b || bi) && !zr_gemm_operand_prepare(wt, x->dtype, &W))
        st = zr_dev_status(linear_gelu_forward_cuda(zr_tensor_data(out), zr_tensor_data(pre), zr_tensor_data(xi),
                                                     zr_tensor_data(W.t), W.trans, W.ld,
                                                     bi ? zr_tensor_data(bi) : NULL, rows, in, nout, x->dtype,
                                                     zr_cuda_stream(dev)),
                           "linear_gelu", dev);
    zr_tensor_release(W.t);
    zr_tensor_release(xi);
    zr_tensor_release(wt);
    zr_tensor_release(bi);
    return st;
#else
    (void)out, (void)pre, (void)x, (void)w, (void)b;
    return zr_no_cuda("linear_gelu");
#endif
}

/* saved: x, w, pre; edges x, w, b (linear's layout, so linear's backward finishes the job). */
static zr_status linear_gelu_backward(zr_node *n, zr_tensor *g, zr_tensor **gin) {
    zr_tensor *pre = n->saved[2];
    zr_tensor *dpre = zr_unary_grad(ZR_UN_GELU_TANH, 0, pre, g, pre->dtype);
    if (!dpre) return ZR_ERR;
    zr_status st = zr_linear_backward(n, dpre, gin);
    zr_tensor_release(dpre);
    return st;
}

zr_tensor *zr_linear_gelu(zr_tensor *x, zr_tensor *w, zr_tensor *b) {
    if (!x || !w) return zr_error_null("linear_gelu: missing input or weight");
    zr_tensor *pre = NULL, *out = NULL;
    if (epilogue_fits(x, w, b)) {
        int64_t shape[ZR_MAX_DIMS];
        for (int i = 0; i < x->ndim; i++) shape[i] = x->shape[i];
        shape[x->ndim - 1] = w->shape[0];
        zr_device dev = zr_tensor_device(x);
        pre = zr_tensor_new_cat(x->dtype, dev, x->ndim, shape, ZR_MEM_ACTIVATIONS, 0);
        out = pre ? zr_tensor_new_cat(x->dtype, dev, x->ndim, shape, ZR_MEM_ACTIVATIONS, 0) : NULL;
        if (!out || forward_dev(out, pre, x, w, b)) goto fail;
    } else {
        int was = zr_set_grad_enabled(0);
        pre = zr_linear(x, w, b);
        out = pre ? zr_unary(ZR_UN_GELU_TANH, pre, 0) : NULL;
        zr_set_grad_enabled(was);
        if (!out) {
            zr_error_prefix("linear_gelu: ");
            goto fail;
        }
    }
    zr_node *n;
    if (zr_autograd_record(out, "linear_gelu", linear_gelu_backward, 3, (zr_tensor *[]){x, w, b}, &n)) goto fail;
    if (n && (zr_node_save(n, x) || zr_node_save(n, w) || zr_node_save(n, pre))) goto fail;
    zr_tensor_release(pre);
    return out;
fail:
    zr_tensor_release(pre);
    zr_tensor_release(out);
    return NULL;
}
