/* LoRA on fused frozen projections: forward and backward side by side (see ops/lora.h). The
 * products run through ops/linear_multi.h's row-major GEMMs (OpenBLAS in f32/f64 on the CPU,
 * cuBLASLt in the tensors' dtype with f32 accumulation on CUDA); the dropout masks come from the
 * Philox kernels of kernels/{cpu,cuda}/dropout.h, made where they are applied. */
#include "ops/lora.h"

#include <math.h>
#include <string.h>

#include "core/random.h"
#include "ops/linear_multi.h"
#include "ops/matmul.h"
#include "ops/util.h"
#ifdef ZR_HAVE_CUDA
#include "cuda/device.h"
#include "kernels/cuda/dropout.h"
#endif

/* One op's projections: y's column blocks (off), h's (roff: r_i wide, 0 for a plain projection),
 * the adapters as a compact list (for one GEMM over adjacent A_i), the masks' Philox state. */
typedef struct {
    int n, na, drop;
    int64_t rows, in, N, R;
    int64_t off[ZR_LORA_MULTI_MAX + 1], roff[ZR_LORA_MULTI_MAX + 1], aoff[ZR_LORA_MULTI_MAX + 1];
    zr_tensor *alist[ZR_LORA_MULTI_MAX]; /* the A_i of the adapted projections, in order */
    double keep_scale;
    uint32_t thresh;
    uint64_t seed, moff[ZR_LORA_MULTI_MAX];
} lora_shape;

static void *at(zr_tensor *t, int64_t elems) {
    return (char *)zr_tensor_data(t) + elems * (int64_t)zr_dtype_size(t->dtype);
}

/* Offsets from the weights and adapters (w_i (out_i, in), A[i] (r_i, in) or NULL). */
static void layout(lora_shape *s, int n, zr_tensor *const *w, zr_tensor *const *A) {
    s->n = n, s->na = 0, s->off[0] = s->roff[0] = s->aoff[0] = 0;
    for (int i = 0; i < n; i++) {
        int64_t r = A && A[i] ? A[i]->shape[0] : 0;
        s->off[i + 1] = s->off[i] + w[i]->shape[0];
        s->roff[i + 1] = s->roff[i] + r;
        if (r) {
            s->alist[s->na] = A[i];
            s->aoff[s->na + 1] = s->aoff[s->na] + r;
            s->na++;
        }
    }
    s->N = s->off[n], s->R = s->roff[n];
}

/* Dropout keeping 1 - p: the integer threshold on 24 Philox bits (u < keep exactly as
 * zr_tensor_bernoulli_ compares: k / 2^24 < keep <=> k < ceil(keep 2^24)) and the kept values'
 * scale. */
static void set_drop(lora_shape *s, double p) {
    s->thresh = (uint32_t)ceil((1.0 - p) * 16777216.0);
    s->keep_scale = 1.0 / (1.0 - p);
}

/* y = D(x) for the mask at Philox offset moff, or y += D(x) (accumulate); n elements in ct. */
static zr_status dropout_rows(zr_device dev, zr_dtype ct, void *y, const void *x, int64_t n,
                              const lora_shape *s, uint64_t moff, int accumulate) {
    if (dev.type == ZR_CPU) {
        ZR_CPU_CALL(ct, dropout_philox_cpu, y, x, n, s->thresh, s->keep_scale, s->seed, moff,
                    accumulate);
        return ZR_OK;
    }
#ifdef ZR_HAVE_CUDA
    return zr_dev_status(dropout_philox_cuda(y, x, n, s->thresh, s->keep_scale, s->seed, moff,
                                             accumulate, ct, zr_cuda_stream(dev)),
                         "lora_multi (dropout)", dev);
#else
    (void)ct, (void)y, (void)x, (void)n, (void)s, (void)moff, (void)accumulate;
    return zr_no_cuda("lora_multi");
#endif
}

/* h (rows, R; ct) = [D_i(x) A_iᵀ]: without dropout one GEMM per run of adjacent A_i; with it each
 * adapter's dropped copy of x in tmp (rows, in), then its product. */
static zr_status forward_h(const lora_shape *s, zr_device dev, zr_dtype ct, zr_tensor *xi,
                           zr_tensor *const *A, zr_tensor *h) {
    if (!s->drop)
        return zr_linear_multi_into(dev, ct, zr_tensor_data(h), s->R, zr_tensor_data(xi), s->na,
                                    s->alist, s->rows, s->in, s->aoff, 1.0, 0.0, NULL);
    zr_tensor *tmp =
        zr_tensor_new_cat(ct, dev, 2, (int64_t[]){s->rows, s->in}, ZR_MEM_WORKSPACE, 0);
    zr_status st = tmp ? ZR_OK : ZR_ERR;
    for (int i = 0; !st && i < s->n; i++) {
        if (!A[i]) continue;
        st = dropout_rows(dev, ct, zr_tensor_data(tmp), zr_tensor_data(xi), s->rows * s->in, s,
                          s->moff[i], 0);
        if (!st)
            st = zr_linear_multi_into(dev, ct, at(h, s->roff[i]), s->R, zr_tensor_data(tmp), 1,
                                      &A[i], s->rows, s->in,
                                      (int64_t[]){0, s->roff[i + 1] - s->roff[i]}, 1.0, 0.0, NULL);
    }
    zr_tensor_release(tmp);
    return st;
}

/* saved: x, h, w_1..w_n, A_1..A_n, B_1..B_n (NULL for a plain projection); edges: x, w_i, b_i, A_i,
 * B_i; i[0] = n, i[1] = dropout on, i[2] = the seed, i[3 + k] = mask k's offset; f[k] = s_k,
 * f[3] = p. */
static zr_status lora_backward(zr_node *nd, zr_tensor *g, zr_tensor **gin) {
    int n = (int)nd->i[0];
    zr_tensor *x = nd->saved[0], *h = nd->saved[1], *const *w = nd->saved + 2,
              *const *A = nd->saved + 2 + n, *const *B = nd->saved + 2 + 2 * n;
    zr_device dev = zr_tensor_device(g);
    int cpu = dev.type == ZR_CPU;
    lora_shape s;
    layout(&s, n, w, A);
    s.in = w[0]->shape[1], s.rows = s.N ? zr_tensor_numel(g) / s.N : 0, s.drop = (int)nd->i[1];
    s.seed = (uint64_t)nd->i[2];
    for (int i = 0; i < n; i++)
        s.moff[i] = (uint64_t)nd->i[3 + i];
    set_drop(&s, nd->f[3]);
    zr_dtype dt = zr_promote(g->dtype, h->dtype), ct = cpu ? zr_cpu_compute_dtype(dt) : dt;
    int need_x = zr_node_needs_grad(nd, 0);
    if (s.rows == 0) { /* nothing flowed: zero gradients */
        for (int i = 0; i < 1 + 4 * n; i++) {
            zr_edge *e = &nd->edges[i];
            if (zr_node_needs_grad(nd, i) &&
                !(gin[i] = zr_tensor_zeros(e->dtype, dev, e->ndim, e->shape)))
                return ZR_ERR;
        }
        return ZR_OK;
    }
    for (int i = 0; i < n; i++)
        if (zr_node_needs_grad(nd, 1 + i) || zr_node_needs_grad(nd, 1 + n + i))
            return zr_error("lora_multi backward: base projection %d needs a gradient; the op "
                            "takes frozen bases",
                            i + 1);
    zr_tensor *gi = zr_tensor_to_raw(g, ct, dev), *hi = zr_tensor_to_raw(h, ct, dev), *xi = NULL,
              *dh = NULL, *dx = NULL, *tmp = NULL;
    zr_status st = ZR_ERR;
    if (!gi || !hi || !(xi = zr_tensor_to_raw(x, ct, dev))) goto done;
    if (!(dh = zr_tensor_new_cat(ct, dev, 2, (int64_t[]){s.rows, s.R}, ZR_MEM_WORKSPACE, 0)))
        goto done;
    for (int i = 0; i < n; i++) { /* dB_i = s_i gy_iᵀ h_i; dh_i = s_i gy_i B_i */
        if (!A[i]) continue;
        int64_t out = s.off[i + 1] - s.off[i], r = s.roff[i + 1] - s.roff[i];
        if (zr_grad_product(nd, 1 + 3 * n + i, dev, ct, out, r, s.rows, nd->f[i], at(gi, s.off[i]),
                            s.N, at(hi, s.roff[i]), s.R, gin) ||
            zr_gemm_right(dev, ct, B[i], 0, s.rows, r, out, nd->f[i], at(gi, s.off[i]), s.N, 0.0,
                          at(dh, s.roff[i]), s.R, NULL))
            goto done;
    }
    if (need_x) { /* dx = gy · W, one GEMM per run of adjacent bases */
        zr_edge *e = &nd->edges[0];
        if (!(dx = zr_tensor_new_cat(ct, dev, e->ndim, e->shape, ZR_MEM_ACTIVATIONS, 0))) goto done;
        if (zr_linear_multi_dx_into(dev, ct, zr_tensor_data(dx), zr_tensor_data(gi), s.N, n, w,
                                    s.rows, s.in, s.off, 0.0))
            goto done;
    }
    if (!s.drop) { /* dA_i = dh_iᵀ x; dx += dh · [A_i] */
        for (int i = 0; i < n; i++)
            if (A[i] &&
                zr_grad_product(nd, 1 + 2 * n + i, dev, ct, s.roff[i + 1] - s.roff[i], s.in, s.rows,
                                1.0, at(dh, s.roff[i]), s.R, zr_tensor_data(xi), s.in, gin))
                goto done;
        if (need_x && zr_linear_multi_dx_into(dev, ct, zr_tensor_data(dx), zr_tensor_data(dh), s.R,
                                              s.na, s.alist, s.rows, s.in, s.aoff, 1.0))
            goto done;
    } else { /* per adapter: D_i(x) made again for dA_i, then dx += D_i(dh_i A_i) in the same buffer
              */
        if (!(tmp = zr_tensor_new_cat(ct, dev, 2, (int64_t[]){s.rows, s.in}, ZR_MEM_WORKSPACE, 0)))
            goto done;
        for (int i = 0; i < n; i++) {
            if (!A[i]) continue;
            int64_t r = s.roff[i + 1] - s.roff[i], ne = s.rows * s.in;
            if (dropout_rows(dev, ct, zr_tensor_data(tmp), zr_tensor_data(xi), ne, &s, s.moff[i],
                             0) ||
                zr_grad_product(nd, 1 + 2 * n + i, dev, ct, r, s.in, s.rows, 1.0, at(dh, s.roff[i]),
                                s.R, zr_tensor_data(tmp), s.in, gin))
                goto done;
            if (need_x && (zr_gemm_right(dev, ct, A[i], 0, s.rows, s.in, r, 1.0, at(dh, s.roff[i]),
                                         s.R, 0.0, zr_tensor_data(tmp), s.in, NULL) ||
                           dropout_rows(dev, ct, zr_tensor_data(dx), zr_tensor_data(tmp), ne, &s,
                                        s.moff[i], 1)))
                goto done;
        }
    }
    if (need_x) {
        if (!(gin[0] = zr_take_as(dx, nd->edges[0].dtype))) goto done;
        dx = NULL;
    }
    st = ZR_OK;
done:
    zr_tensor_release(tmp);
    zr_tensor_release(dx);
    zr_tensor_release(dh);
    zr_tensor_release(xi);
    zr_tensor_release(hi);
    zr_tensor_release(gi);
    return st;
}

/* Argument checks; fills s's layout and inputs (x, w_i, b_i, A_i, B_i) and the promoted dtype. */
static zr_status check_args(lora_shape *s, zr_tensor *x, int n, zr_tensor *const *w,
                            zr_tensor *const *b, zr_tensor *const *A, zr_tensor *const *B, double p,
                            zr_tensor **inputs, zr_dtype *dt) {
    char b1[128], b2[128], b3[128];
    if (!x || !w || n < 1 || n > ZR_LORA_MULTI_MAX)
        return zr_error("lora_multi: expected an input and 1 to %d projections, got %d",
                        ZR_LORA_MULTI_MAX, x && w ? n : 0);
    if (zr_check_float("lora_multi", x)) return ZR_ERR;
    if (x->ndim == 0)
        return zr_error("lora_multi: the input must have at least 1 dim, got a 0-dim tensor");
    if (!(p >= 0 && p < 1)) return zr_error("lora_multi: dropout p must be in [0, 1), got %g", p);
    int64_t in = x->shape[x->ndim - 1];
    if (in == 0) return zr_error("lora_multi: the input has no features (last dim 0)");
    *dt = x->dtype;
    inputs[0] = x;
    for (int i = 0; i < n; i++) {
        zr_tensor *wi = w[i], *bi = b ? b[i] : NULL, *ai = A ? A[i] : NULL, *Bi = B ? B[i] : NULL;
        if (!wi) return zr_error("lora_multi: weight %d is missing", i + 1);
        if (b && !bi)
            return zr_error("lora_multi: bias %d is missing (give all %d biases or none)", i + 1,
                            n);
        if (!ai != !Bi)
            return zr_error("lora_multi: projection %d has lora_%s without lora_%s", i + 1,
                            ai ? "A" : "B", ai ? "B" : "A");
        zr_tensor *all[4] = {wi, bi, ai, Bi};
        for (int k = 0; k < 4; k++)
            if (all[k] && zr_check_float("lora_multi", all[k])) return ZR_ERR;
        if (wi->ndim != 2 || wi->shape[1] != in)
            return zr_error(
                "lora_multi: weight %d must be (out_features, %lld) to match input %s, got %s",
                i + 1, (long long)in, zr_tensor_shape_str(x, b1), zr_tensor_shape_str(wi, b2));
        if (bi && (bi->ndim != 1 || bi->shape[0] != wi->shape[0]))
            return zr_error("lora_multi: bias %d must have shape (%lld), got %s", i + 1,
                            (long long)wi->shape[0], zr_tensor_shape_str(bi, b1));
        if (zr_tensor_needs_grad(wi) || (bi && zr_tensor_needs_grad(bi)))
            return zr_error("lora_multi: base projection %d requires a gradient; this op takes "
                            "frozen bases (as PEFT "
                            "freezes them): call the projections one by one to train a base",
                            i + 1);
        if (ai && (ai->ndim != 2 || ai->shape[1] != in || ai->shape[0] < 1))
            return zr_error("lora_multi: lora_A %d must be (r, %lld), got %s", i + 1, (long long)in,
                            zr_tensor_shape_str(ai, b1));
        if (ai && (Bi->ndim != 2 || Bi->shape[0] != wi->shape[0] || Bi->shape[1] != ai->shape[0]))
            return zr_error(
                "lora_multi: lora_B %d must be (%lld, %lld) for weight %s and lora_A %s, got %s",
                i + 1, (long long)wi->shape[0], (long long)ai->shape[0],
                zr_tensor_shape_str(wi, b1), zr_tensor_shape_str(ai, b2),
                zr_tensor_shape_str(Bi, b3));
        for (int k = 0; k < 4; k++)
            if (all[k]) *dt = zr_promote(*dt, all[k]->dtype);
        inputs[1 + i] = wi, inputs[1 + n + i] = bi, inputs[1 + 2 * n + i] = ai,
                   inputs[1 + 3 * n + i] = Bi;
    }
    layout(s, n, w, A);
    s->in = in;
    return zr_check_same_device("lora_multi", 1 + 4 * n, inputs);
}

zr_tensor *zr_lora_multi(zr_tensor *x, int n, zr_tensor *const *w, zr_tensor *const *b,
                         zr_tensor *const *A, zr_tensor *const *B, const double *scale, double p,
                         int training) {
    lora_shape s;
    memset(&s, 0, sizeof s);
    zr_tensor *inputs[1 + 4 * ZR_LORA_MULTI_MAX] = {0};
    zr_dtype dt = ZR_F32;
    if (check_args(&s, x, n, w, b, A, B, p, inputs, &dt)) return NULL;
    zr_device dev = zr_tensor_device(x);
    int cpu = dev.type == ZR_CPU;
    zr_dtype ct = cpu ? zr_cpu_compute_dtype(dt) : dt;
    int64_t shape[ZR_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    shape[x->ndim - 1] = s.N;
    s.rows = 1;
    for (int i = 0; i < x->ndim - 1; i++)
        s.rows *= x->shape[i];
    s.drop = training && p > 0 && s.na > 0;
    if (s.drop) { /* the generator's offsets, adapter by adapter, as zr_dropout would reserve them
                   */
        uint64_t cur;
        zr_random_get_state(&s.seed, &cur);
        set_drop(&s, p);
        for (int i = 0; i < n; i++)
            if (A[i]) s.moff[i] = zr_random_reserve(s.rows * s.in);
    }
    zr_tensor *out = zr_tensor_new_cat(dt, dev, x->ndim, shape, ZR_MEM_ACTIVATIONS, 0);
    zr_tensor *xi = NULL, *o = NULL, *bc = NULL, *hc = NULL, *h = NULL;
    zr_status st = ZR_ERR;
    if (!out || !(xi = zr_tensor_to_raw(x, ct, dev)) ||
        !(o = cpu ? zr_cpu_out_begin(out, ct) : zr_tensor_retain(out)))
        goto done;
    if (b && !(bc = zr_linear_multi_biases(b, n, s.off, ct, dev))) goto done;
    if (s.rows && zr_linear_multi_rows(o, xi, n, w, bc, s.rows, s.in, s.N, s.off)) goto done;
    /* h = [D_i(x) A_iᵀ], kept in y's dtype (rounded there first on the CPU, as a bf16 lora_A would)
     */
    int64_t hs[2] = {s.rows, s.R};
    if (!(hc = zr_tensor_new_cat(ct, dev, 2, hs, ct == dt ? ZR_MEM_ACTIVATIONS : ZR_MEM_WORKSPACE,
                                 0)))
        goto done;
    if (s.rows && s.R && forward_h(&s, dev, ct, xi, A, hc)) goto done;
    if (ct == dt)
        h = zr_tensor_retain(hc);
    else if (!(h = zr_tensor_new_cat(dt, dev, 2, hs, ZR_MEM_ACTIVATIONS, 0)) ||
             zr_tensor_copy_(h, hc) || zr_tensor_copy_(hc, h))
        goto done;
    for (int i = 0; s.rows && i < n; i++) /* y_i += s_i h_i B_iᵀ */
        if (A[i] && zr_gemm_right(dev, ct, B[i], 1, s.rows, s.off[i + 1] - s.off[i],
                                  s.roff[i + 1] - s.roff[i], scale[i], at(hc, s.roff[i]), s.R, 1.0,
                                  at(o, s.off[i]), s.N, NULL))
            goto done;
    if (cpu) {
        zr_status e = zr_cpu_out_end(out, o);
        o = NULL;
        if (e) goto done;
    }
    zr_node *nd;
    if (zr_autograd_record(out, "lora_multi", lora_backward, 1 + 4 * n, inputs, &nd)) goto done;
    if (nd) {
        nd->i[0] = n, nd->i[1] = s.drop, nd->i[2] = (int64_t)s.seed, nd->f[3] = p;
        for (int i = 0; i < n; i++)
            nd->i[3 + i] = (int64_t)s.moff[i], nd->f[i] = scale[i];
        int bad = zr_node_save(nd, x) || zr_node_save(nd, h);
        for (int i = 0; i < n; i++)
            bad = bad || zr_node_save(nd, w[i]);
        for (int i = 0; i < n; i++)
            bad = bad || zr_node_save(nd, A[i]);
        for (int i = 0; i < n; i++)
            bad = bad || zr_node_save(nd, B[i]);
        if (bad) goto done;
    }
    st = ZR_OK;
done:
    zr_tensor_release(h), zr_tensor_release(hc), zr_tensor_release(bc), zr_tensor_release(o),
        zr_tensor_release(xi);
    if (st) {
        zr_tensor_release(out);
        return NULL;
    }
    return out;
}
