/* linear then tanh GELU as one op, and the MLP linear, GELU, linear as one node (see
 * ops/linear_gelu.h): on CUDA one cuBLASLt product with the GELU epilogue forward, the dGELU
 * epilogue backward (runtime/cuda/blas_plan.h); on the CPU, and CUDA shapes the epilogues do not
 * take, zr_linear and the GELU as they run unfused (no autograd inside). */
#include "ops/linear_gelu.h"

#include <string.h>

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
    zr_device d = zr_tensor_device(x);
    if (!zr_device_eq(zr_tensor_device(w), d) || (b && !zr_device_eq(zr_tensor_device(b), d))) return 0;
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

/* linear (in_out 0: w (out, in)) or conv1d (in_out 1: w (in, out)), no autograd. */
static zr_tensor *product(zr_tensor *x, zr_tensor *w, zr_tensor *b, int in_out) {
    int was = zr_set_grad_enabled(0);
    zr_tensor *y = in_out ? zr_conv1d(x, w, b) : zr_linear(x, w, b);
    zr_set_grad_enabled(was);
    return y;
}

/* h = gelu_tanh(x · wv (out, in)ᵀ + b) and *pre = x · wvᵀ + b, no autograd, w stored as in_out says;
 * op names the caller in errors. */
static zr_tensor *gelu_forward(const char *op, zr_tensor *x, zr_tensor *w, zr_tensor *b, int in_out,
                               zr_tensor **pre_out) {
    zr_tensor *pre = NULL, *out = NULL, *wv = zr_weight_out_in(w, in_out);
    if (!wv) return NULL;
    if (epilogue_fits(x, wv, b)) {
        int64_t shape[ZR_MAX_DIMS];
        for (int i = 0; i < x->ndim; i++) shape[i] = x->shape[i];
        shape[x->ndim - 1] = wv->shape[0];
        zr_device dev = zr_tensor_device(x);
        pre = zr_tensor_new_cat(x->dtype, dev, x->ndim, shape, ZR_MEM_ACTIVATIONS, 0);
        out = pre ? zr_tensor_new_cat(x->dtype, dev, x->ndim, shape, ZR_MEM_ACTIVATIONS, 0) : NULL;
        if (!out || forward_dev(out, pre, x, wv, b)) goto fail;
    } else {
        pre = product(x, w, b, in_out);
        out = pre ? zr_unary(ZR_UN_GELU_TANH, pre, 0) : NULL;
        if (!out) {
            zr_error_prefix("%s: ", op);
            goto fail;
        }
    }
    zr_tensor_release(wv);
    *pre_out = pre;
    return out;
fail:
    zr_tensor_release(wv);
    zr_tensor_release(pre);
    zr_tensor_release(out);
    return NULL;
}

zr_tensor *zr_linear_gelu(zr_tensor *x, zr_tensor *w, zr_tensor *b) {
    if (!x || !w) return zr_error_null("linear_gelu: missing input or weight");
    zr_tensor *pre = NULL, *out = gelu_forward("linear_gelu", x, w, b, 0, &pre);
    if (!out) return NULL;
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

/* --- mlp_gelu: linear, tanh GELU, linear as one node --- */

/* Whether the dGELU epilogue can give dpre = (g · w) ⊙ gelu'(pre) in one product: g, w and pre of
 * one CUDA dtype (bf16, f16, f32) on one device, pre's width (w's in) a multiple of 8. */
static int dgelu_fits(const zr_tensor *g, const zr_tensor *w, const zr_tensor *pre) {
    zr_dtype dt = pre->dtype;
    if (zr_is_cpu(g) || (dt != ZR_BF16 && dt != ZR_F16 && dt != ZR_F32) || g->dtype != dt || w->dtype != dt)
        return 0;
    zr_device d = zr_tensor_device(g);
    if (!zr_device_eq(zr_tensor_device(w), d) || !zr_device_eq(zr_tensor_device(pre), d)) return 0;
    return zr_tensor_is_contiguous(pre) && w->shape[1] % 8 == 0 && w->shape[0] >= 1 && zr_tensor_numel(pre) > 0;
}

/* dpre (pre's shape) = (g · w) ⊙ gelu_tanh'(pre) through the epilogue (dgelu_fits holds). */
static zr_tensor *dgelu_dev(zr_tensor *g, zr_tensor *w, zr_tensor *pre) {
#ifdef ZR_HAVE_CUDA
    zr_device dev = zr_tensor_device(g);
    int64_t in = w->shape[1], out = w->shape[0], rows = zr_tensor_numel(pre) / in;
    zr_tensor *gi = zr_tensor_contiguous_raw(g);
    zr_tensor *dpre = gi ? zr_tensor_new_cat(pre->dtype, dev, pre->ndim, pre->shape, ZR_MEM_ACTIVATIONS, 0) : NULL;
    zr_gemm_operand W = {0};
    if (dpre && (zr_gemm_operand_prepare(w, pre->dtype, &W) ||
                 zr_dev_status(linear_dgelu_cuda(zr_tensor_data(dpre), zr_tensor_data(gi), zr_tensor_data(W.t),
                                                 W.trans, W.ld, zr_tensor_data(pre), rows, in, out, pre->dtype,
                                                 zr_cuda_stream(dev)),
                               "mlp_gelu backward", dev))) {
        zr_tensor_release(dpre);
        dpre = NULL;
    }
    zr_tensor_release(W.t);
    zr_tensor_release(gi);
    return dpre;
#else
    (void)g, (void)w, (void)pre;
    return zr_error_null("mlp_gelu: the dGELU epilogue needs a zrun built with CUDA");
#endif
}

/* saved: x, w_fc, pre, h, w_proj; edges x, w_fc, b_fc, w_proj, b_proj; n->i[0] = 1 when the weights
 * are stored (in, out) (linear's backward reads it for both halves). c_proj's weight and bias
 * gradients come from linear's backward on a node of edges (h, w_proj, b_proj) where h's gradient
 * is asked for only when the dGELU epilogue does not take it (a leaf mark: no producer's buffer);
 * then c_fc's from linear's backward on this node (its edges 0-2 and saved x, w_fc). */
static zr_status mlp_gelu_backward(zr_node *n, zr_tensor *g, zr_tensor **gin) {
    zr_tensor *pre = n->saved[2], *h = n->saved[3], *wp = n->saved[4], *wpv = zr_weight_out_in(wp, n->i[0] != 0);
    if (!wpv) return ZR_ERR;
    int fused = dgelu_fits(g, wpv, pre);
    zr_edge e[3] = {{0}, n->edges[3], n->edges[4]};
    e[0].dtype = h->dtype;
    e[0].ndim = h->ndim;
    memcpy(e[0].shape, h->shape, sizeof e[0].shape);
    if (!fused) e[0].leaf = h;
    zr_node proj = *n;
    proj.n_inputs = 3;
    proj.edges = e;
    proj.saved[0] = h;
    proj.saved[1] = wp;
    zr_tensor *pg[3] = {NULL, NULL, NULL}, *dpre = NULL;
    zr_status st = zr_linear_backward(&proj, g, pg);
    gin[3] = pg[1];
    gin[4] = pg[2];
    if (!st) dpre = fused ? dgelu_dev(g, wpv, pre) : zr_unary_grad(ZR_UN_GELU_TANH, 0, pre, pg[0], pre->dtype);
    zr_tensor_release(pg[0]);
    zr_tensor_release(wpv);
    if (!st && !dpre) st = ZR_ERR;
    if (!st) st = zr_linear_backward(n, dpre, gin);
    zr_tensor_release(dpre);
    return st;
}

zr_tensor *zr_mlp_gelu(zr_tensor *x, zr_tensor *w_fc, zr_tensor *b_fc, zr_tensor *w_proj, zr_tensor *b_proj,
                       int in_out) {
    if (!x || !w_fc || !w_proj) return zr_error_null("mlp_gelu: missing input or weight");
    zr_tensor *pre = NULL, *h = gelu_forward("mlp_gelu", x, w_fc, b_fc, in_out, &pre), *y = NULL;
    if (!h) return NULL;
    y = product(h, w_proj, b_proj, in_out);
    if (!y) {
        zr_error_prefix("mlp_gelu (second linear): ");
        goto fail;
    }
    zr_node *n;
    if (zr_autograd_record(y, "mlp_gelu", mlp_gelu_backward, 5, (zr_tensor *[]){x, w_fc, b_fc, w_proj, b_proj}, &n))
        goto fail;
    if (n) n->i[0] = in_out;
    if (n && (zr_node_save(n, x) || zr_node_save(n, w_fc) || zr_node_save(n, pre) || zr_node_save(n, h) ||
              zr_node_save(n, w_proj)))
        goto fail;
    zr_tensor_release(pre);
    zr_tensor_release(h);
    return y;
fail:
    zr_tensor_release(pre);
    zr_tensor_release(h);
    zr_tensor_release(y);
    return NULL;
}
