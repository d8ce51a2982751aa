/* RMSNorm and LayerNorm: forward and backward side by side (see ops/norm.h). The kernels work on
 * (N, D) rows in f32/f64; bf16/f16 are widened to f32 and narrowed back. */
#include "ops/norm.h"

#include "ops/elementwise.h"
#include "ops/util.h"

static int is_low(zr_dtype t) { return t == ZR_BF16 || t == ZR_F16; }

/* Checks x (..., D) and an optional (D) parameter; sets *D and *N. */
static zr_status check_args(const char *op, zr_tensor *x, zr_tensor *w, zr_tensor *b, int64_t *D,
                            int64_t *N) {
    char b1[128], b2[128];
    if (zr_check_float(op, x)) return ZR_ERR;
    if (x->ndim < 1) return zr_error("%s: x must have at least one dim (the normalised one), got a scalar", op);
    if (zr_check_same_device(op, 3, (zr_tensor *[]){x, w, b})) return ZR_ERR;
    *D = x->shape[x->ndim - 1];
    if (*D == 0) return zr_error("%s: cannot normalise over a last dim of size 0 (x is %s)", op, zr_tensor_shape_str(x, b1));
    *N = zr_tensor_numel(x) / *D;
    zr_tensor *ps[2] = {w, b};
    const char *names[2] = {"weight", "bias"};
    for (int i = 0; i < 2; i++) {
        if (!ps[i]) continue;
        if (zr_check_float(op, ps[i])) return ZR_ERR;
        if (ps[i]->ndim != 1 || ps[i]->shape[0] != *D)
            return zr_error("%s: %s has shape %s but x is %s; expected (%lld)", op, names[i],
                            zr_tensor_shape_str(ps[i], b1), zr_tensor_shape_str(x, b2), (long long)*D);
    }
    if (!zr_is_cpu(x) && x->dtype == ZR_F64)
        return zr_error("%s on cuda: f64 is not supported (use f32, bf16 or f16)", op);
    return ZR_OK;
}

static zr_dtype compute_dtype(zr_tensor *x, zr_tensor *w, zr_tensor *b) {
    int f64 = x->dtype == ZR_F64 || (w && w->dtype == ZR_F64) || (b && b->dtype == ZR_F64);
    return f64 ? ZR_F64 : ZR_F32;
}

/* --- CUDA path (kernels/cuda/norm.h): rows of D in x's dtype, statistics in f32 (saved as f32
 * (N) tensors); a weight of another dtype is converted to x's. Weight gradients are reduced
 * deterministically by the kernels. --- */
#ifdef ZR_HAVE_CUDA
#include "cuda/device.h"
#include "kernels/cuda/norm.h"
#endif

/* ln 0: rms_norm (b, mean unused; unit: Gemma's (1 + w)); 1: layer_norm. out, mean, rstd allocated by the
 * caller. */
static zr_status norm_forward_dev(int ln, int unit, zr_tensor *out, zr_tensor *mean, zr_tensor *rstd, zr_tensor *x,
                                  zr_tensor *w, zr_tensor *b, int64_t N, int64_t D, double eps) {
#ifdef ZR_HAVE_CUDA
    const char *op = ln ? "layer_norm" : "rms_norm";
    zr_device dev = zr_tensor_device(x);
    zr_dtype dt = x->dtype;
    cudaStream_t s = zr_cuda_stream(dev);
    zr_tensor *xi = zr_tensor_contiguous_raw(x), *wi = xi && w ? zr_tensor_to_raw(w, dt, dev) : NULL;
    zr_tensor *bi = xi && b ? zr_tensor_to_raw(b, dt, dev) : NULL;
    zr_status st = ZR_ERR;
    if (xi && (!w || wi) && (!b || bi)) {
        int rc;
        if (ln)
            rc = layernorm_forward_cuda(zr_tensor_data(out), zr_tensor_data(mean), zr_tensor_data(rstd),
                                        zr_tensor_data(xi), wi ? zr_tensor_data(wi) : NULL,
                                        bi ? zr_tensor_data(bi) : NULL, N, D, (float)eps, dt, s);
        else /* LlamaRMSNorm, as on the CPU: weight * (x * rstd).to(input_dtype), in one pass (unit: Gemma's) */
            rc = rmsnorm_forward_cuda(zr_tensor_data(out), zr_tensor_data(rstd), zr_tensor_data(xi),
                                      wi ? zr_tensor_data(wi) : NULL, N, D, (float)eps, unit ? 1.f : 0.f, dt, s);
        st = zr_dev_status(rc, op, dev);
    }
    zr_tensor_release(xi);
    zr_tensor_release(wi);
    zr_tensor_release(bi);
    return st;
#else
    (void)unit, (void)out, (void)mean, (void)rstd, (void)x, (void)w, (void)b, (void)N, (void)D, (void)eps;
    return zr_no_cuda(ln ? "layer_norm" : "rms_norm");
#endif
}

/* Backward of either norm on a GPU: gin[0..2] for x, weight, bias (those the node needs). */
static zr_status norm_backward_dev(int ln, zr_node *n, zr_tensor *g, zr_tensor *x, zr_tensor *w, zr_tensor *mean,
                                   zr_tensor *rstd, zr_tensor **gin) {
#ifdef ZR_HAVE_CUDA
    const char *op = ln ? "layer_norm backward" : "rms_norm backward";
    zr_device dev = zr_tensor_device(x);
    zr_dtype dt = x->dtype;
    int64_t D = x->shape[x->ndim - 1], N = zr_tensor_numel(x) / D;
    int nin = ln ? 3 : 2;
    int want_w = w && zr_node_needs_grad(n, 1), want_b = ln && n->n_inputs > 2 && zr_node_needs_grad(n, 2);
    size_t wsz = !(want_w || want_b) ? 0 : ln ? layernorm_backward_workspace_size(N, D)
                                              : rmsnorm_backward_workspace_size(N, D);
    zr_tensor *gi = zr_tensor_to_raw(g, dt, dev), *xi = zr_tensor_contiguous_raw(x);
    zr_tensor *wi = w ? zr_tensor_to_raw(w, dt, dev) : NULL, *ws = NULL, *d[3] = {NULL, NULL, NULL};
    zr_status st = ZR_ERR;
    if (!gi || !xi || (w && !wi)) goto done;
    /* dx straight into the producer's pending gradient (the residual stream's, typically): the
     * kernel adds what is there in the same pass (dres aliasing dx) instead of a separate add */
    zr_tensor *buf = NULL;
    int state = ZR_GRADBUF_NEW;
    if (n->edges[0].fn && n->edges[0].dtype == dt && zr_node_input_grad_buffer(n, 0, NULL, NULL, &buf, &state))
        goto done;
    if (!buf && !(d[0] = zr_tensor_new_cat(dt, dev, x->ndim, x->shape, ZR_MEM_ACTIVATIONS, 0))) goto done;
    /* The weight's (and LayerNorm's bias's) gradient straight into the parameter's existing
     * gradient (the ZeRO engine's fp32 partition, as linear's dW): the reduction kernel writes it (a
     * stale one) or adds to it, instead of a 16-bit dW and a cast or add kernel after */
    zr_tensor *lg[3] = {NULL, NULL, NULL};
    for (int i = 1; i < 3; i++) {
        if (!(i == 1 ? want_w : want_b) || N == 0) continue;
        lg[i] = zr_node_leaf_grad(n, i);
        if (lg[i] && lg[i]->dtype != ZR_F32 && lg[i]->dtype != dt) lg[i] = NULL;
        if (!lg[i] && !(d[i] = zr_tensor_new_cat(dt, dev, 1, &D, ZR_MEM_ACTIVATIONS, 0))) goto done;
    }
    if (wsz && !(ws = zr_tensor_new_cat(ZR_U8, dev, 1, (int64_t[]){(int64_t)wsz}, ZR_MEM_WORKSPACE, 0))) goto done;
    cudaStream_t s = zr_cuda_stream(dev);
    void *p[3];
    zr_dtype pt[3];
    int acc[3];
    for (int i = 0; i < 3; i++) {
        zr_tensor *t = i == 0 && buf ? buf : lg[i] ? lg[i] : d[i];
        p[i] = t ? zr_tensor_data(t) : NULL;
        pt[i] = t ? t->dtype : dt;
        acc[i] = lg[i] && !n->edges[i].leaf->grad_stale;
    }
    const void *dres = buf && state == ZR_GRADBUF_SHARED ? p[0] : NULL;
    int rc = ln ? layernorm_backward_acc_cuda(p[0], p[1], pt[1], acc[1], p[2], pt[2], acc[2], zr_tensor_data(gi),
                                              zr_tensor_data(xi), wi ? zr_tensor_data(wi) : NULL,
                                              zr_tensor_data(mean), zr_tensor_data(rstd), dres,
                                              ws ? zr_tensor_data(ws) : NULL, N, D, dt, s)
                : rmsnorm_backward_acc_cuda(p[0], p[1], pt[1], acc[1], zr_tensor_data(gi), zr_tensor_data(xi),
                                            wi ? zr_tensor_data(wi) : NULL, zr_tensor_data(rstd), dres,
                                            ws ? zr_tensor_data(ws) : NULL, N, D, n->i[0] ? 1.f : 0.f, dt, s);
    if (zr_dev_status(rc, op, dev)) goto done;
    for (int i = 1; i < 3; i++) /* d[i] NULL: the leaf counts as done, its hook fires */
        if (lg[i]) n->edges[i].leaf->grad_stale = 0;
    if (zr_give_grads(n, nin, d, gin)) goto done;
    st = ZR_OK;
done:
    for (int i = 0; i < 3; i++) zr_tensor_release(d[i]);
    zr_tensor_release(gi);
    zr_tensor_release(xi);
    zr_tensor_release(wi);
    zr_tensor_release(ws);
    return st;
#else
    (void)ln, (void)n, (void)g, (void)x, (void)w, (void)mean, (void)rstd, (void)gin;
    return zr_no_cuda(ln ? "layer_norm" : "rms_norm");
#endif
}

static zr_status rmsnorm_backward(zr_node *n, zr_tensor *g, zr_tensor **gin);
static zr_status layernorm_backward(zr_node *n, zr_tensor *g, zr_tensor **gin);

/* The whole op on a GPU: output, f32 statistics (mean only for layer_norm), the node (i[0] = unit). */
static zr_tensor *norm_dev(int ln, int unit, zr_tensor *x, zr_tensor *w, zr_tensor *b, int64_t N, int64_t D,
                           double eps) {
    zr_device dev = zr_tensor_device(x);
    zr_tensor *out = zr_tensor_new_cat(x->dtype, dev, x->ndim, x->shape, ZR_MEM_ACTIVATIONS, 0);
    zr_tensor *rstd = out ? zr_tensor_new_cat(ZR_F32, dev, 1, &N, ZR_MEM_ACTIVATIONS, 0) : NULL;
    zr_tensor *mean = rstd && ln ? zr_tensor_new_cat(ZR_F32, dev, 1, &N, ZR_MEM_ACTIVATIONS, 0) : NULL;
    zr_node *n;
    if (!rstd || (ln && !mean) || norm_forward_dev(ln, unit, out, mean, rstd, x, w, b, N, D, eps)) goto fail;
    if (ln) {
        if (zr_autograd_record(out, "layer_norm", layernorm_backward, 3, (zr_tensor *[]){x, w, b}, &n)) goto fail;
    } else if (zr_autograd_record(out, "rms_norm", rmsnorm_backward, 2, (zr_tensor *[]){x, w}, &n))
        goto fail;
    if (n) {
        n->f[0] = eps, n->i[0] = unit;
        if (zr_node_save(n, x) || zr_node_save(n, w) || (ln && zr_node_save(n, mean)) || zr_node_save(n, rstd))
            goto fail;
    }
    zr_tensor_release(mean);
    zr_tensor_release(rstd);
    return out;
fail:
    zr_tensor_release(mean);
    zr_tensor_release(rstd);
    zr_tensor_release(out);
    return NULL;
}

/* --- RMSNorm --- */

/* The weight as the CPU kernels take it, in ct: (1 + w) for Gemma's norm (unit), a new tensor, else w. */
static zr_tensor *cpu_weight(zr_tensor *w, zr_dtype ct, int unit) {
    zr_tensor *wi = w ? zr_cpu_in(w, ct) : NULL;
    if (!wi || !unit) return wi;
    zr_tensor *u = zr_tensor_new_cat(ct, zr_tensor_device(w), 1, wi->shape, ZR_MEM_WORKSPACE, 0);
    if (u) {
        int64_t D = wi->shape[0];
        if (ct == ZR_F64)
            for (int64_t j = 0; j < D; j++) ((double *)zr_tensor_data(u))[j] = 1.0 + ((const double *)zr_tensor_data(wi))[j];
        else
            for (int64_t j = 0; j < D; j++) ((float *)zr_tensor_data(u))[j] = 1.0f + ((const float *)zr_tensor_data(wi))[j];
    }
    zr_tensor_release(wi);
    return u;
}

/* saved: x, weight (or NULL), rstd (N, compute dtype); i[0]: Gemma's (1 + w) */
static zr_status rmsnorm_backward(zr_node *n, zr_tensor *g, zr_tensor **gin) {
    zr_tensor *x = n->saved[0], *w = n->saved[1], *rstd = n->saved[2];
    if (!zr_is_cpu(x)) return norm_backward_dev(0, n, g, x, w, NULL, rstd, gin);
    zr_dtype ct = rstd->dtype;
    int64_t D = x->shape[x->ndim - 1], N = zr_tensor_numel(x) / D;
    zr_tensor *gi = zr_cpu_in(g, ct), *xi = zr_cpu_in(x, ct), *wi = cpu_weight(w, ct, (int)n->i[0]);
    zr_tensor *dx = NULL, *dw = NULL;
    zr_status st = ZR_ERR;
    if (!gi || !xi || (w && !wi)) goto done;
    if (zr_node_needs_grad(n, 0) &&
        !(dx = zr_tensor_new_cat(ct, zr_tensor_device(x), x->ndim, x->shape, ZR_MEM_ACTIVATIONS, 0)))
        goto done;
    if (w && zr_node_needs_grad(n, 1) &&
        !(dw = zr_tensor_new_cat(ct, zr_tensor_device(x), 1, &D, ZR_MEM_ACTIVATIONS, 0)))
        goto done;
    ZR_CPU_CALL(ct, rmsnorm_backward_cpu, dx ? zr_tensor_data(dx) : NULL, dw ? zr_tensor_data(dw) : NULL,
                zr_tensor_data(gi), zr_tensor_data(xi), wi ? zr_tensor_data(wi) : NULL,
                zr_tensor_data(rstd), N, D);
    if (dx && !(gin[0] = zr_take_as(dx, n->edges[0].dtype))) {
        dx = NULL;
        goto done;
    }
    dx = NULL;
    if (dw && !(gin[1] = zr_take_as(dw, n->edges[1].dtype))) {
        dw = NULL;
        goto done;
    }
    dw = NULL;
    st = ZR_OK;
done:
    zr_tensor_release(dx);
    zr_tensor_release(dw);
    zr_tensor_release(gi);
    zr_tensor_release(xi);
    zr_tensor_release(wi);
    return st;
}

/* Gemma's norm (unit) takes a weight, on CUDA one that x's dtype holds exactly (the kernels read it in x's dtype):
 * x's own dtype, or any 16-bit one under f32 x. */
static zr_status check_unit(const char *op, zr_tensor *x, zr_tensor *w, int unit) {
    if (!unit) return ZR_OK;
    if (!w) return zr_error("%s: unit_offset (Gemma's 1 + weight) needs a weight", op);
    if (!zr_is_cpu(x) && w->dtype != x->dtype && !(x->dtype == ZR_F32 && zr_dtype_size(w->dtype) == 2))
        return zr_error("%s: unit_offset on cuda reads the weight in x's dtype (%s), so a %s weight would be rounded "
                        "first; give x in the weight's dtype or the weight in x's",
                        op, zr_dtype_name(x->dtype), zr_dtype_name(w->dtype));
    return ZR_OK;
}

zr_tensor *zr_rmsnorm(zr_tensor *x, zr_tensor *weight, double eps) { return zr_rmsnorm_ex(x, weight, eps, 0); }

zr_tensor *zr_rmsnorm_ex(zr_tensor *x, zr_tensor *weight, double eps, int unit) {
    int64_t D, N;
    if (check_args("rms_norm", x, weight, NULL, &D, &N) || check_unit("rms_norm", x, weight, unit)) return NULL;
    if (!zr_is_cpu(x)) return norm_dev(0, unit, x, weight, NULL, N, D, eps);
    zr_dtype ct = compute_dtype(x, weight, NULL);
    zr_device dev = zr_tensor_device(x);
    zr_tensor *out = zr_tensor_new_cat(x->dtype, dev, x->ndim, x->shape, ZR_MEM_ACTIVATIONS, 0);
    zr_tensor *rstd = out ? zr_tensor_new_cat(ct, dev, 1, &N, ZR_MEM_ACTIVATIONS, 0) : NULL;
    zr_tensor *xi = rstd ? zr_cpu_in(x, ct) : NULL;
    zr_tensor *wi = xi && weight ? cpu_weight(weight, ct, unit) : NULL;
    zr_tensor *o = NULL;
    if (!xi || (weight && !wi)) goto fail;
    if (is_low(x->dtype) && weight && !unit) {
        /* LlamaRMSNorm: weight * (x * rstd).to(input_dtype): round, then scale, then round. */
        zr_tensor *h = zr_tensor_new_cat(ZR_F32, dev, x->ndim, x->shape, ZR_MEM_WORKSPACE, 0);
        if (!h) goto fail;
        rmsnorm_forward_cpu_f32(zr_tensor_data(h), zr_tensor_data(rstd), zr_tensor_data(xi), NULL, N, D, eps);
        zr_tensor *hr = zr_tensor_to_raw(h, x->dtype, dev);
        zr_tensor_release(h);
        zr_tensor *hw = hr ? zr_tensor_to_raw(hr, ZR_F32, dev) : NULL;
        zr_tensor_release(hr);
        if (!hw) goto fail;
        scale_cols_cpu_f32(zr_tensor_data(hw), zr_tensor_data(wi), N, D);
        zr_status st = zr_tensor_copy_(out, hw);
        zr_tensor_release(hw);
        if (st) goto fail;
    } else {
        if (!(o = zr_cpu_out_begin(out, ct))) goto fail;
        ZR_CPU_CALL(ct, rmsnorm_forward_cpu, zr_tensor_data(o), zr_tensor_data(rstd), zr_tensor_data(xi),
                    wi ? zr_tensor_data(wi) : NULL, N, D, eps);
        zr_status st = zr_cpu_out_end(out, o);
        o = NULL;
        if (st) goto fail;
    }
    zr_node *n;
    if (zr_autograd_record(out, "rms_norm", rmsnorm_backward, 2, (zr_tensor *[]){x, weight}, &n)) goto fail;
    if (n) {
        n->f[0] = eps, n->i[0] = unit;
        if (zr_node_save(n, x) || zr_node_save(n, weight) || zr_node_save(n, rstd)) goto fail;
    }
    zr_tensor_release(xi);
    zr_tensor_release(wi);
    zr_tensor_release(rstd);
    return out;
fail:
    zr_tensor_release(o);
    zr_tensor_release(xi);
    zr_tensor_release(wi);
    zr_tensor_release(rstd);
    zr_tensor_release(out);
    return NULL;
}

/* --- residual add + norm (RMSNorm or LayerNorm) --- */

#ifdef ZR_HAVE_CUDA
/* h = x + r: both inputs receive h's gradient itself (as zr_add's backward) */
static zr_status residual_backward(zr_node *n, zr_tensor *g, zr_tensor **gin) {
    for (int i = 0; i < 2; i++)
        if (zr_node_needs_grad(n, i) && zr_grad_to_input(n, i, zr_tensor_retain(g), gin)) return ZR_ERR;
    return ZR_OK;
}
#endif

/* The fused GPU forward (ln 0: RMSNorm, b unused; 1: LayerNorm): h, y and the statistics allocated
 * in the composition's order (add's h, then the norm's y, rstd (and mean)) so that the memory
 * plan's Sim:add_rms_norm is Sim:add then Sim:rms_norm; the nodes are the composition's too (an
 * add on h, the norm on y saving h), so backward is the plain norm's, whose dx kernel adds the
 * gradient already pending at h in the same pass. */
static zr_tensor *add_norm_dev(int ln, int unit, zr_tensor *x, zr_tensor *r, zr_tensor *w, zr_tensor *b,
                               int64_t N, int64_t D, double eps, zr_tensor **hp) {
    const char *op = ln ? "add_layer_norm" : "add_rms_norm";
#ifdef ZR_HAVE_CUDA
    zr_device dev = zr_tensor_device(x);
    zr_dtype dt = x->dtype;
    zr_tensor *h = zr_tensor_new_cat(dt, dev, x->ndim, x->shape, ZR_MEM_ACTIVATIONS, 0);
    zr_tensor *y = h ? zr_tensor_new_cat(dt, dev, x->ndim, x->shape, ZR_MEM_ACTIVATIONS, 0) : NULL;
    zr_tensor *rstd = y ? zr_tensor_new_cat(ZR_F32, dev, 1, &N, ZR_MEM_ACTIVATIONS, 0) : NULL;
    zr_tensor *mean = rstd && ln ? zr_tensor_new_cat(ZR_F32, dev, 1, &N, ZR_MEM_ACTIVATIONS, 0) : NULL;
    zr_tensor *xi = rstd && (!ln || mean) ? zr_tensor_contiguous_raw(x) : NULL;
    zr_tensor *ri = xi ? zr_tensor_contiguous_raw(r) : NULL;
    zr_tensor *wi = ri && w ? zr_tensor_to_raw(w, dt, dev) : NULL, *bi = ri && b ? zr_tensor_to_raw(b, dt, dev) : NULL;
    zr_status st = ZR_ERR;
    if (ri && (!w || wi) && (!b || bi)) {
        void *pw = wi ? zr_tensor_data(wi) : NULL;
        cudaStream_t s = zr_cuda_stream(dev);
        int rc = ln ? add_layernorm_forward_cuda(zr_tensor_data(y), zr_tensor_data(h), zr_tensor_data(mean),
                                                 zr_tensor_data(rstd), zr_tensor_data(xi), zr_tensor_data(ri), pw,
                                                 bi ? zr_tensor_data(bi) : NULL, N, D, (float)eps, dt, s)
                    : add_rmsnorm_forward_cuda(zr_tensor_data(y), zr_tensor_data(h), zr_tensor_data(rstd),
                                               zr_tensor_data(xi), zr_tensor_data(ri), pw, N, D, (float)eps,
                                               unit ? 1.f : 0.f, dt, s);
        st = zr_dev_status(rc, op, dev);
    }
    zr_tensor_release(xi);
    zr_tensor_release(ri);
    zr_tensor_release(wi);
    zr_tensor_release(bi);
    zr_node *n;
    if (st || zr_autograd_record(h, "add", residual_backward, 2, (zr_tensor *[]){x, r}, &n)) goto fail;
    if (ln ? zr_autograd_record(y, "layer_norm", layernorm_backward, 3, (zr_tensor *[]){h, w, b}, &n)
           : zr_autograd_record(y, "rms_norm", rmsnorm_backward, 2, (zr_tensor *[]){h, w}, &n))
        goto fail;
    if (n) {
        n->f[0] = eps, n->i[0] = unit;
        if (zr_node_save(n, h) || zr_node_save(n, w) || (ln && zr_node_save(n, mean)) || zr_node_save(n, rstd))
            goto fail;
    }
    zr_tensor_release(mean);
    zr_tensor_release(rstd);
    *hp = h;
    return y;
fail:
    zr_tensor_release(mean);
    zr_tensor_release(rstd);
    zr_tensor_release(y);
    zr_tensor_release(h);
    return NULL;
#else
    (void)ln, (void)unit, (void)x, (void)r, (void)w, (void)b, (void)N, (void)D, (void)eps, (void)hp;
    zr_no_cuda(op);
    return NULL;
#endif
}

/* Both ops' front: checks, then one kernel on a GPU for x and r of one shape and dtype, else the
 * composition (zr_add, then the norm). */
static zr_tensor *add_norm(int ln, int unit, zr_tensor *x, zr_tensor *r, zr_tensor *weight, zr_tensor *bias,
                           double eps, zr_tensor **h) {
    const char *op = ln ? "add_layer_norm" : "add_rms_norm";
    int64_t D, N;
    *h = NULL;
    if (zr_check_float(op, r) || zr_check_same_device(op, 2, (zr_tensor *[]){x, r}) ||
        check_args(op, x, weight, bias, &D, &N) || check_unit(op, x, weight, unit))
        return NULL;
    if (!zr_is_cpu(x) && r->dtype == x->dtype && zr_tensor_same_shape(x, r))
        return add_norm_dev(ln, unit, x, r, weight, bias, N, D, eps, h);
    zr_tensor *s = zr_add(x, r);
    zr_tensor *y = !s ? NULL : ln ? zr_layernorm(s, weight, bias, eps) : zr_rmsnorm_ex(s, weight, eps, unit);
    if (!y) {
        zr_tensor_release(s);
        return NULL;
    }
    *h = s;
    return y;
}

zr_tensor *zr_add_rmsnorm(zr_tensor *x, zr_tensor *r, zr_tensor *weight, double eps, zr_tensor **h) {
    return add_norm(0, 0, x, r, weight, NULL, eps, h);
}

zr_tensor *zr_add_rmsnorm_ex(zr_tensor *x, zr_tensor *r, zr_tensor *weight, double eps, int unit_offset,
                             zr_tensor **h) {
    return add_norm(0, unit_offset != 0, x, r, weight, NULL, eps, h);
}

zr_tensor *zr_add_layernorm(zr_tensor *x, zr_tensor *r, zr_tensor *weight, zr_tensor *bias, double eps,
                            zr_tensor **h) {
    return add_norm(1, 0, x, r, weight, bias, eps, h);
}

/* --- LayerNorm --- */

/* saved: x, weight (or NULL), mean (N), rstd (N) */
static zr_status layernorm_backward(zr_node *n, zr_tensor *g, zr_tensor **gin) {
    zr_tensor *x = n->saved[0], *w = n->saved[1], *mean = n->saved[2], *rstd = n->saved[3];
    if (!zr_is_cpu(x)) return norm_backward_dev(1, n, g, x, w, mean, rstd, gin);
    zr_dtype ct = rstd->dtype;
    zr_device dev = zr_tensor_device(x);
    int64_t D = x->shape[x->ndim - 1], N = zr_tensor_numel(x) / D;
    zr_tensor *gi = zr_cpu_in(g, ct), *xi = zr_cpu_in(x, ct), *wi = w ? zr_cpu_in(w, ct) : NULL;
    zr_tensor *d[3] = {NULL, NULL, NULL};
    zr_status st = ZR_ERR;
    if (!gi || !xi || (w && !wi)) goto done;
    for (int i = 0; i < 3; i++) {
        if (!zr_node_needs_grad(n, i)) continue;
        d[i] = i == 0 ? zr_tensor_new_cat(ct, dev, x->ndim, x->shape, ZR_MEM_ACTIVATIONS, 0)
                      : zr_tensor_new_cat(ct, dev, 1, &D, ZR_MEM_ACTIVATIONS, 0);
        if (!d[i]) goto done;
    }
    ZR_CPU_CALL(ct, layernorm_backward_cpu, d[0] ? zr_tensor_data(d[0]) : NULL,
                d[1] ? zr_tensor_data(d[1]) : NULL, d[2] ? zr_tensor_data(d[2]) : NULL,
                zr_tensor_data(gi), zr_tensor_data(xi), wi ? zr_tensor_data(wi) : NULL,
                zr_tensor_data(mean), zr_tensor_data(rstd), N, D);
    if (zr_give_grads(n, 3, d, gin)) goto done;
    st = ZR_OK;
done:
    for (int i = 0; i < 3; i++) zr_tensor_release(d[i]);
    zr_tensor_release(gi);
    zr_tensor_release(xi);
    zr_tensor_release(wi);
    return st;
}

zr_tensor *zr_layernorm(zr_tensor *x, zr_tensor *weight, zr_tensor *bias, double eps) {
    int64_t D, N;
    if (check_args("layer_norm", x, weight, bias, &D, &N)) return NULL;
    if (!zr_is_cpu(x)) return norm_dev(1, 0, x, weight, bias, N, D, eps);
    zr_dtype ct = compute_dtype(x, weight, bias);
    zr_device dev = zr_tensor_device(x);
    zr_tensor *out = zr_tensor_new_cat(x->dtype, dev, x->ndim, x->shape, ZR_MEM_ACTIVATIONS, 0);
    zr_tensor *mean = out ? zr_tensor_new_cat(ct, dev, 1, &N, ZR_MEM_ACTIVATIONS, 0) : NULL;
    zr_tensor *rstd = mean ? zr_tensor_new_cat(ct, dev, 1, &N, ZR_MEM_ACTIVATIONS, 0) : NULL;
    zr_tensor *xi = rstd ? zr_cpu_in(x, ct) : NULL;
    zr_tensor *wi = xi && weight ? zr_cpu_in(weight, ct) : NULL;
    zr_tensor *bi = xi && bias ? zr_cpu_in(bias, ct) : NULL;
    zr_tensor *o = NULL;
    if (!xi || (weight && !wi) || (bias && !bi) || !(o = zr_cpu_out_begin(out, ct))) goto fail;
    ZR_CPU_CALL(ct, layernorm_forward_cpu, zr_tensor_data(o), zr_tensor_data(mean), zr_tensor_data(rstd),
                zr_tensor_data(xi), wi ? zr_tensor_data(wi) : NULL, bi ? zr_tensor_data(bi) : NULL, N, D, eps);
    zr_status st = zr_cpu_out_end(out, o);
    o = NULL;
    if (st) goto fail;
    zr_node *n;
    if (zr_autograd_record(out, "layer_norm", layernorm_backward, 3, (zr_tensor *[]){x, weight, bias}, &n))
        goto fail;
    if (n) {
        n->f[0] = eps;
        if (zr_node_save(n, x) || zr_node_save(n, weight) || zr_node_save(n, mean) || zr_node_save(n, rstd))
            goto fail;
    }
    zr_tensor_release(xi);
    zr_tensor_release(wi);
    zr_tensor_release(bi);
    zr_tensor_release(mean);
    zr_tensor_release(rstd);
    return out;
fail:
    zr_tensor_release(o);
    zr_tensor_release(xi);
    zr_tensor_release(wi);
    zr_tensor_release(bi);
    zr_tensor_release(mean);
    zr_tensor_release(rstd);
    zr_tensor_release(out);
    return NULL;
}
