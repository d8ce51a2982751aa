/* Optimizer steps (AdamW, SGD; Lion, Adagrad, SGD and Lamb on flat segments, the ZeRO engine's kernels)
 * over parameter tensors and flat buffers: argument checks, the
 * per-step scalars (bias corrections), and dispatch to the fused CPU kernels, or for parameters
 * on a GPU to kernels/cuda/optim.h (AdamW: one segment per tensor; f32 or bf16/f16 gradients
 * read as they are; SGD). Nothing waits for the GPU. */
#include "ops/optim.h"

#include <math.h>

#include "kernels/cpu/offload.h" /* optim_step_cpu */
#include "ops/util.h"

#ifdef ZR_HAVE_CUDA
#include "cuda/device.h"
#include "kernels/cuda/optim.h"
#endif

/* Fails for f64 parameters on a GPU (the CUDA kernels update f32 master weights). */
static zr_status check_dev_param(const char *op, const zr_tensor *p) {
    char b[192];
    if (p->dtype == ZR_F64)
        return zr_error("%s: parameters on CUDA must be f32, got %s", op, zr_tensor_describe(p, b));
    return ZR_OK;
}

static const char *optim_name(int kind) {
    return kind == ZR_OPTIM_LION      ? "lion"
           : kind == ZR_OPTIM_ADAGRAD ? "adagrad"
           : kind == ZR_OPTIM_SGD     ? "sgd"
           : kind == ZR_OPTIM_LAMB    ? "lamb"
                                      : "adamw";
}

zr_status zr_adamw_config_check(const zr_adamw_config *c) {
    const char *op = optim_name(c->kind);
    if (c->kind < ZR_OPTIM_ADAMW || c->kind > ZR_OPTIM_LAMB)
        return zr_error("optimizer kind %d is not AdamW, Lion, Adagrad, SGD or Lamb", c->kind);
    if (!(c->lr >= 0)) return zr_error("%s: lr must be >= 0, got %g", op, c->lr);
    if (!(c->eps >= 0)) return zr_error("%s: eps must be >= 0, got %g", op, c->eps);
    if (!(c->beta1 >= 0 && c->beta1 < 1))
        return zr_error("%s: betas[1] must be in [0, 1), got %g", op, c->beta1);
    if (!(c->beta2 >= 0 && c->beta2 < 1))
        return zr_error("%s: betas[2] must be in [0, 1), got %g", op, c->beta2);
    if (!(c->weight_decay >= 0))
        return zr_error("%s: weight_decay must be >= 0, got %g", op, c->weight_decay);
    if (!(c->lr_decay >= 0)) return zr_error("%s: lr_decay must be >= 0, got %g", op, c->lr_decay);
    if (!(c->momentum >= 0)) return zr_error("%s: momentum must be >= 0, got %g", op, c->momentum);
    if (c->kind == ZR_OPTIM_LAMB && !(c->min_coeff >= 0 && c->max_coeff >= 0))
        return zr_error("%s: max_coeff and min_coeff must be >= 0, got %g and %g", op, c->max_coeff, c->min_coeff);
    if (c->nesterov && (c->momentum <= 0 || c->dampening != 0))
        return zr_error("%s: nesterov momentum requires momentum > 0 and dampening = 0 (got momentum %g, dampening %g)",
                        op, c->momentum, c->dampening);
    return ZR_OK;
}

zr_status zr_sgd_config_check(const zr_sgd_config *c) {
    if (!(c->lr >= 0)) return zr_error("sgd: lr must be >= 0, got %g", c->lr);
    if (!(c->momentum >= 0)) return zr_error("sgd: momentum must be >= 0, got %g", c->momentum);
    if (!(c->weight_decay >= 0))
        return zr_error("sgd: weight_decay must be >= 0, got %g", c->weight_decay);
    if (c->nesterov && (c->momentum <= 0 || c->dampening != 0))
        return zr_error("sgd: nesterov momentum requires momentum > 0 and dampening = 0 "
                        "(got momentum %g, dampening %g)", c->momentum, c->dampening);
    return ZR_OK;
}

/* Checks that state tensor s can be updated alongside param p. */
static zr_status check_state(const char *op, const char *what, const zr_tensor *p,
                             const zr_tensor *s) {
    char b1[192], b2[192];
    if (!s) return zr_error("%s: %s is missing", op, what);
    if (s->dtype != p->dtype || !zr_device_eq(zr_tensor_device(s), zr_tensor_device(p)) ||
        !zr_tensor_same_shape(s, p) || !zr_tensor_is_contiguous(s))
        return zr_error("%s: %s is %s%s, expected a contiguous tensor like the parameter (%s)", op,
                        what, zr_tensor_describe(s, b1),
                        zr_tensor_is_contiguous(s) ? "" : " (not contiguous)",
                        zr_tensor_describe(p, b2));
    if (s->storage == p->storage) return zr_error("%s: %s shares memory with the parameter", op, what);
    return ZR_OK;
}

static zr_status check_param(const char *op, const zr_tensor *p) {
    char b[192];
    if (!p) return zr_error("%s: parameter is NULL", op);
    if ((p->dtype != ZR_F32 && p->dtype != ZR_F64) || !zr_tensor_is_contiguous(p))
        return zr_error("%s: parameters must be contiguous f32 (or f64) tensors, got %s%s", op,
                        zr_tensor_describe(p, b), zr_tensor_is_contiguous(p) ? "" : " (not contiguous)");
    return ZR_OK;
}

/* The gradient as the kernel reads it: a new reference to g itself when it is contiguous and of
 * the parameter's dtype (or bf16 for f32 parameters), else a converted copy. */
static zr_tensor *grad_in(const char *op, zr_tensor *p, zr_tensor *g, int allow_bf16, int *kind) {
    char b1[192], b2[192];
    if (!g) return zr_error_null("%s: parameter %s has no gradient", op, zr_tensor_describe(p, b1));
    if (!zr_tensor_same_shape(g, p) || !zr_device_eq(zr_tensor_device(g), zr_tensor_device(p)))
        return zr_error_null("%s: gradient %s does not match parameter %s", op,
                             zr_tensor_describe(g, b1), zr_tensor_describe(p, b2));
    if (g->storage == p->storage) return zr_error_null("%s: gradient shares memory with the parameter", op);
    *kind = ZR_OPTIM_GRAD_REAL;
    if (zr_tensor_is_contiguous(g)) {
        if (g->dtype == p->dtype) return zr_tensor_retain(g);
        if (allow_bf16 && g->dtype == ZR_BF16 && p->dtype == ZR_F32) {
            *kind = ZR_OPTIM_GRAD_BF16;
            return zr_tensor_retain(g);
        }
    }
    return zr_tensor_to_raw(g, p->dtype, zr_tensor_device(p));
}

zr_status zr_adamw_step(zr_tensor *param, zr_tensor *grad, zr_tensor *exp_avg,
                        zr_tensor *exp_avg_sq, int64_t step, const zr_adamw_config *c) {
    const char *op = "adamw";
    if (check_param(op, param) || check_state(op, "exp_avg", param, exp_avg) ||
        check_state(op, "exp_avg_sq", param, exp_avg_sq) || zr_adamw_config_check(c))
        return ZR_ERR;
    if (exp_avg->storage == exp_avg_sq->storage)
        return zr_error("adamw: exp_avg and exp_avg_sq share memory");
    if (step < 1) return zr_error("adamw: step must be >= 1 (the count including this step), got %lld", (long long)step);
    if (!zr_is_cpu(param)) {
#ifdef ZR_HAVE_CUDA
        if (check_dev_param(op, param)) return ZR_ERR;
        char b1[192], b2[192];
        zr_device dev = zr_tensor_device(param);
        if (!grad) return zr_error("adamw: parameter %s has no gradient", zr_tensor_describe(param, b1));
        if (!zr_tensor_same_shape(grad, param) || !zr_device_eq(zr_tensor_device(grad), dev))
            return zr_error("adamw: gradient %s does not match parameter %s", zr_tensor_describe(grad, b1),
                            zr_tensor_describe(param, b2));
        int low = grad->dtype == ZR_BF16 || grad->dtype == ZR_F16;
        zr_tensor *gi = zr_tensor_is_contiguous(grad) && (low || grad->dtype == ZR_F32)
                            ? zr_tensor_retain(grad)
                            : zr_tensor_to_raw(grad, ZR_F32, dev);
        if (!gi) return ZR_ERR;
        zr_adamw_segment seg = {0, zr_tensor_numel(param), (float)c->weight_decay, (float)c->lr};
        int rc = seg.n == 0 ? 0
                            : adamw_step_cuda(zr_tensor_data(param), zr_tensor_data(exp_avg), zr_tensor_data(exp_avg_sq),
                                              NULL, ZR_F32, zr_tensor_data(gi), gi->dtype, &seg, 1, c, step, NULL,
                                              zr_cuda_stream(dev));
        zr_tensor_release(gi);
        return zr_dev_status(rc, op, dev);
#else
        return zr_no_cuda("adamw");
#endif
    }
    int kind;
    zr_tensor *g = grad_in(op, param, grad, 1, &kind);
    if (!g) return ZR_ERR;
    ZR_CPU_CALL(param->dtype, adamw_step_cpu, zr_tensor_data(param), zr_tensor_data(g), kind,
                zr_tensor_data(exp_avg), zr_tensor_data(exp_avg_sq), zr_tensor_numel(param), c, step);
    zr_tensor_release(g);
    return ZR_OK;
}

zr_status zr_adamw_step_multi(int n, zr_tensor *const *params, zr_tensor *const *grads,
                              zr_tensor *const *exp_avgs, zr_tensor *const *exp_avg_sqs,
                              int64_t step, const zr_adamw_config *c) {
    for (int i = 0; i < n; i++)
        if (zr_adamw_step(params[i], grads[i], exp_avgs[i], exp_avg_sqs[i], step, c)) {
            zr_error_prefix("parameter %d of %d: ", i + 1, n);
            return ZR_ERR;
        }
    return ZR_OK;
}

zr_status zr_adamw_step_flat(float *p, const void *g, zr_dtype grad_dtype, float *m, float *v,
                             int64_t n, int64_t step, const zr_adamw_config *c) {
    if (zr_adamw_config_check(c)) return ZR_ERR;
    if (n < 0 || step < 1) return zr_error("adamw: bad flat step (n %lld, step %lld)", (long long)n, (long long)step);
    if (grad_dtype != ZR_F32 && grad_dtype != ZR_BF16)
        return zr_error("adamw: flat gradients must be f32 or bf16, got %s", zr_dtype_name(grad_dtype));
    if (n == 0) return ZR_OK;
    if (!p || !g || !m || !v) return zr_error("adamw: NULL buffer in a flat step of %lld elements", (long long)n);
    adamw_step_cpu_f32(p, g, grad_dtype == ZR_BF16 ? ZR_OPTIM_GRAD_BF16 : ZR_OPTIM_GRAD_REAL, m, v, n, c, step);
    return ZR_OK;
}

zr_status zr_sgd_step(zr_tensor *param, zr_tensor *grad, zr_tensor *momentum_buf, int first,
                      const zr_sgd_config *c) {
    const char *op = "sgd";
    if (check_param(op, param) || zr_sgd_config_check(c)) return ZR_ERR;
    if (c->momentum != 0 && check_state(op, "momentum_buffer", param, momentum_buf)) return ZR_ERR;
    int kind;
    if (!zr_is_cpu(param) && check_dev_param(op, param)) return ZR_ERR;
    zr_tensor *g = grad_in(op, param, grad, 0, &kind);
    if (!g) return ZR_ERR;
    if (!zr_is_cpu(param)) {
#ifdef ZR_HAVE_CUDA
        zr_device dev = zr_tensor_device(param);
        int rc = sgd_step_cuda(zr_tensor_data(param), zr_tensor_data(g),
                               c->momentum != 0 ? zr_tensor_data(momentum_buf) : NULL, zr_tensor_numel(param), c->lr,
                               c->momentum, c->dampening, c->weight_decay, c->nesterov, first, param->dtype,
                               zr_cuda_stream(dev));
        zr_tensor_release(g);
        return zr_dev_status(rc, op, dev);
#else
        zr_tensor_release(g);
        return zr_no_cuda("sgd");
#endif
    }
    ZR_CPU_CALL(param->dtype, sgd_step_cpu, zr_tensor_data(param), zr_tensor_data(g),
                c->momentum != 0 ? zr_tensor_data(momentum_buf) : NULL, zr_tensor_numel(param),
                c->lr, c->momentum, c->dampening, c->weight_decay, c->nesterov, first);
    zr_tensor_release(g);
    return ZR_OK;
}

/* Checks a flat step's parameters (contiguous f32), states (each like the parameters; NULL allowed
 * where the optimizer keeps fewer), gradient (f32, bf16 or f16) and segments (inside the buffer). */
static zr_status check_flat(const char *op, zr_tensor *param, zr_tensor *const *states, int nstates, int need,
                            zr_tensor *grad, const zr_adamw_segment *segs, int nsegs) {
    char b1[192], b2[192];
    if (!param || param->dtype != ZR_F32 || !zr_tensor_is_contiguous(param))
        return zr_error("%s: parameters must be a contiguous f32 tensor, got %s", op,
                        param ? zr_tensor_describe(param, b1) : "nothing");
    const int64_t n = zr_tensor_numel(param);
    zr_device dev = zr_tensor_device(param);
    for (int k = 0; k < nstates; k++) {
        zr_tensor *state = states[k];
        if (state ? (state->dtype != ZR_F32 || zr_tensor_numel(state) != n || !zr_tensor_is_contiguous(state) ||
                     !zr_device_eq(zr_tensor_device(state), dev))
                  : k < need)
            return zr_error("%s: state %s must be a contiguous f32 tensor like the parameters (%s)", op,
                            state ? zr_tensor_describe(state, b1) : "is missing: it", zr_tensor_describe(param, b2));
    }
    if (!grad || zr_tensor_numel(grad) != n || !zr_tensor_is_contiguous(grad) ||
        !zr_device_eq(zr_tensor_device(grad), dev) ||
        (grad->dtype != ZR_F32 && grad->dtype != ZR_BF16 && grad->dtype != ZR_F16))
        return zr_error("%s: gradient %s must be contiguous f32, bf16 or f16 like the parameters (%s)", op,
                        grad ? zr_tensor_describe(grad, b1) : "(none)", zr_tensor_describe(param, b2));
    for (int k = 0; k < nsegs; k++)
        if (segs[k].offset < 0 || segs[k].n < 0 || segs[k].offset + segs[k].n > n)
            return zr_error("%s: segment %d [%lld, +%lld) is outside the %lld parameters", op, k + 1,
                            (long long)segs[k].offset, (long long)segs[k].n, (long long)n);
    return ZR_OK;
}

zr_status zr_optim_step_segments(zr_tensor *param, zr_tensor *state, zr_tensor *grad, const zr_adamw_segment *segs,
                                 int nsegs, const zr_adamw_config *c, int64_t step, double grad_scale) {
    const char *op = "optim_step";
    if (c->kind != ZR_OPTIM_LION && c->kind != ZR_OPTIM_ADAGRAD && c->kind != ZR_OPTIM_SGD)
        return zr_error("%s: optimizer kind %d is not Lion, Adagrad or SGD (AdamW has adamw_step)", op, c->kind);
    if (zr_adamw_config_check(c)) return ZR_ERR;
    if (step < 1) return zr_error("%s: step must be >= 1, got %lld", op, (long long)step);
    if (check_flat(op, param, &state, 1, zr_optim_states(c->kind, c->momentum), grad, segs, nsegs)) return ZR_ERR;
    zr_device dev = zr_tensor_device(param);
    float *s = state ? zr_tensor_data(state) : NULL;
    if (zr_is_cpu(param)) {
        const float gs = (float)grad_scale;
        optim_step_cpu(zr_tensor_data(param), s, NULL, ZR_F32, zr_tensor_data(grad), grad->dtype, segs, nsegs, c, step,
                       &gs);
        return ZR_OK;
    }
#ifdef ZR_HAVE_CUDA
    zr_tensor *gs = zr_tensor_full(ZR_F32, dev, 0, NULL, grad_scale);
    if (!gs) return ZR_ERR;
    int rc = optim_step_cuda(zr_tensor_data(param), s, NULL, ZR_F32, zr_tensor_data(grad), grad->dtype, segs, nsegs,
                             c, step, zr_tensor_data(gs), zr_cuda_stream(dev));
    zr_tensor_release(gs);
    return zr_dev_status(rc, op, dev);
#else
    (void)dev;
    return zr_no_cuda(op);
#endif
}

/* Lamb's per-segment sums: a contiguous f64 tensor of 2 nsegs elements on the parameters' device. */
static zr_status check_sums(const char *op, const zr_tensor *sums, int nsegs, zr_device dev) {
    char b[192];
    if (!sums || sums->dtype != ZR_F64 || zr_tensor_numel(sums) != 2 * (int64_t)nsegs ||
        !zr_tensor_is_contiguous(sums) || !zr_device_eq(zr_tensor_device(sums), dev))
        return zr_error("%s: sums must be a contiguous f64 tensor of %d elements (2 per segment) on the parameters' "
                        "device, got %s", op, 2 * nsegs, sums ? zr_tensor_describe(sums, b) : "nothing");
    return ZR_OK;
}

zr_status zr_lamb_sums(zr_tensor *param, zr_tensor *m, zr_tensor *v, zr_tensor *grad, const zr_adamw_segment *segs,
                       int nsegs, const zr_adamw_config *c, double grad_scale, zr_tensor *sums) {
    const char *op = "lamb";
    if (c->kind != ZR_OPTIM_LAMB) return zr_error("%s: optimizer kind %d is not Lamb", op, c->kind);
    zr_tensor *st[2] = {m, v};
    if (zr_adamw_config_check(c) || check_flat(op, param, st, 2, 2, grad, segs, nsegs)) return ZR_ERR;
    zr_device dev = zr_tensor_device(param);
    if (check_sums(op, sums, nsegs, dev)) return ZR_ERR;
    if (zr_is_cpu(param)) {
        const float gs = (float)grad_scale;
        lamb_sums_cpu(zr_tensor_data(param), zr_tensor_data(m), zr_tensor_data(v), zr_tensor_data(grad), grad->dtype,
                      segs, nsegs, c, &gs, zr_tensor_data(sums));
        return ZR_OK;
    }
#ifdef ZR_HAVE_CUDA
    int64_t nw = lamb_workspace_cuda(segs, nsegs);
    zr_tensor *gs = zr_tensor_full(ZR_F32, dev, 0, NULL, grad_scale);
    zr_tensor *ws = gs ? zr_tensor_new_cat(ZR_F64, dev, 1, &nw, ZR_MEM_WORKSPACE, 0) : NULL;
    int rc = ws ? lamb_sums_cuda(zr_tensor_data(param), zr_tensor_data(m), zr_tensor_data(v), zr_tensor_data(grad),
                                 grad->dtype, segs, nsegs, c, zr_tensor_data(gs), zr_tensor_data(sums),
                                 zr_tensor_data(ws), zr_cuda_stream(dev))
                : ZR_ERR;
    zr_tensor_release(gs);
    zr_tensor_release(ws); /* stream-ordered reuse: the caching allocator hands it out after this work */
    return ws ? zr_dev_status(rc, op, dev) : ZR_ERR;
#else
    return zr_no_cuda(op);
#endif
}

zr_status zr_lamb_apply(zr_tensor *param, zr_tensor *m, zr_tensor *v, const zr_adamw_segment *segs, int nsegs,
                        const zr_adamw_config *c, int64_t step, zr_tensor *sums) {
    const char *op = "lamb";
    if (step < 1) return zr_error("%s: step must be >= 1, got %lld", op, (long long)step);
    /* the same checks as the first pass (m stands in for the gradient) */
    zr_tensor *st[2] = {m, v};
    if (c->kind != ZR_OPTIM_LAMB) return zr_error("%s: optimizer kind %d is not Lamb", op, c->kind);
    if (zr_adamw_config_check(c) || check_flat(op, param, st, 2, 2, m, segs, nsegs)) return ZR_ERR;
    zr_device dev = zr_tensor_device(param);
    if (check_sums(op, sums, nsegs, dev)) return ZR_ERR;
    if (zr_is_cpu(param)) {
        lamb_apply_cpu(zr_tensor_data(param), zr_tensor_data(m), zr_tensor_data(v), NULL, ZR_F32, segs, nsegs, c, step,
                       zr_tensor_data(sums));
        return ZR_OK;
    }
#ifdef ZR_HAVE_CUDA
    int rc = lamb_apply_cuda(zr_tensor_data(param), zr_tensor_data(m), zr_tensor_data(v), NULL, ZR_F32, segs, nsegs,
                             c, step, zr_tensor_data(sums), zr_cuda_stream(dev));
    return zr_dev_status(rc, op, dev);
#else
    return zr_no_cuda(op);
#endif
}

zr_status zr_lamb_step_segments(zr_tensor *param, zr_tensor *m, zr_tensor *v, zr_tensor *grad,
                                const zr_adamw_segment *segs, int nsegs, const zr_adamw_config *c, int64_t step,
                                double grad_scale) {
    if (!param) return zr_error("lamb: parameter is NULL");
    int64_t ns = 2 * (int64_t)nsegs;
    zr_tensor *sums = zr_tensor_new_cat(ZR_F64, zr_tensor_device(param), 1, &ns, ZR_MEM_WORKSPACE, 0);
    zr_status st = sums ? zr_lamb_sums(param, m, v, grad, segs, nsegs, c, grad_scale, sums) : ZR_ERR;
    if (!st) st = zr_lamb_apply(param, m, v, segs, nsegs, c, step, sums);
    zr_tensor_release(sums);
    return st;
}
