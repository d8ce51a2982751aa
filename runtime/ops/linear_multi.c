/* linear_multi: forward and backward side by side (see ops/linear_multi.h). The
 * GEMMs run through kernels/cpu/matmul.h (f32/f64; bf16/f16 widened to f32) or cuBLASLt
 * (kernels/cuda/matmul.h, in the promoted dtype with f32 accumulation); weights are read in place
 * where their layout allows (zr_gemm_operand_prepare), column blocks of y and gy through their
 * leading dimension. */
#include "ops/linear_multi.h"

#include <stdlib.h>
#include <string.h>

#include "ops/elementwise.h"
#include "ops/matmul.h"
#include "ops/util.h"
#ifdef ZR_HAVE_CUDA
#include "cuda/blas_plan.h"
#include "cuda/device.h"
#endif

zr_status zr_gemm_rows(zr_device dev, zr_dtype dt, zr_dtype cdt, int ta, int tb, int64_t m, int64_t n, int64_t k,
                       double alpha, const void *a, int64_t lda, const void *b, int64_t ldb, double beta, void *c,
                       int64_t ldc, const void *bias) {
    if (m == 0 || n == 0) return ZR_OK;
    if (dev.type == ZR_CPU) {
        (void)cdt, (void)bias;
        ZR_CPU_CALL(dt, gemm_cpu, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        return ZR_OK;
    }
#ifdef ZR_HAVE_CUDA
    zr_gemm_desc g;
    memset(&g, 0, sizeof g);
    g.ta = ta, g.tb = tb, g.m = m, g.n = n, g.k = k;
    g.a = a, g.lda = lda, g.b = b, g.ldb = ldb, g.c = c, g.ldc = ldc, g.batch = 1, g.bias = bias;
    g.alpha = alpha, g.beta = beta, g.ab_dtype = dt, g.c_dtype = cdt;
    return zr_dev_status(gemm_ex_cuda(&g, zr_cuda_stream(dev)), "linear_multi", dev);
#else
    (void)cdt, (void)ta, (void)tb, (void)k, (void)alpha, (void)a, (void)lda, (void)b, (void)ldb, (void)beta,
        (void)c, (void)ldc, (void)bias;
    return zr_no_cuda("linear_multi");
#endif
}

/* C = op(A) · op(B) + beta C: zr_gemm_rows with alpha 1. */
static zr_status mm(zr_device dev, zr_dtype dt, zr_dtype cdt, int ta, int tb, int64_t m, int64_t n,
                    int64_t k, const void *a, int64_t lda, const void *b, int64_t ldb, double beta,
                    void *c, int64_t ldc, const void *bias) {
    return zr_gemm_rows(dev, dt, cdt, ta, tb, m, n, k, 1.0, a, lda, b, ldb, beta, c, ldc, bias);
}

static void *at(zr_tensor *t, int64_t elems) {
    return (char *)zr_tensor_data(t) + elems * (int64_t)zr_dtype_size(t->dtype);
}

/* True when b starts where a ends in one storage, both contiguous and of one dtype, so that
 * together they are one contiguous block. */
static int follows(const zr_tensor *a, const zr_tensor *b) {
    return a->storage == b->storage && a->dtype == b->dtype && zr_tensor_is_contiguous(a) &&
           zr_tensor_is_contiguous(b) && b->offset == a->offset + zr_tensor_numel(a);
}

/* Runs of adjacent weights: run r is weights starts[r] .. starts[r+1]-1. Returns the count. */
static int weight_runs(int n, zr_tensor *const *w, int *starts) {
    int r = 0;
    starts[r++] = 0;
    for (int i = 1; i < n; i++)
        if (!follows(w[i - 1], w[i])) starts[r++] = i;
    starts[r] = n;
    return r;
}

int zr_linear_multi_runs(int n, zr_tensor *const *w) {
    int starts[ZR_LINEAR_MULTI_MAX + 1];
    return n < 1 || n > ZR_LINEAR_MULTI_MAX ? 0 : weight_runs(n, w, starts);
}

/* The (rows, in) matrix of weights s..e-1: a view spanning the run, or the weight itself. */
static zr_tensor *run_view(zr_tensor *const *w, int s, int e, int64_t in) {
    if (e - s == 1) return zr_tensor_retain(w[s]);
    int64_t rows = 0;
    for (int i = s; i < e; i++) rows += w[i]->shape[0];
    return zr_tensor_as_strided(w[s], 2, (int64_t[]){rows, in}, (int64_t[]){in > 1 ? in : 1, 1},
                                w[s]->offset);
}

/* The n biases end to end, (N) contiguous in dtype dt on dev (workspace; tiny). */
static zr_tensor *concat_biases(zr_tensor *const *b, int n, const int64_t *off, int64_t N, zr_dtype dt,
                                zr_device dev) {
    zr_tensor *c = zr_tensor_new_cat(dt, dev, 1, &N, ZR_MEM_WORKSPACE, 0);
    for (int i = 0; c && i < n; i++) {
        zr_tensor *s = zr_tensor_narrow_raw(c, 0, off[i], b[i]->shape[0]);
        zr_status st = s ? zr_tensor_copy_(s, b[i]) : ZR_ERR;
        zr_tensor_release(s);
        if (st) {
            zr_tensor_release(c);
            c = NULL;
        }
    }
    return c;
}

/* --- linear_multi --- */

zr_status zr_gemm_right(zr_device dev, zr_dtype ct, zr_tensor *t, int transpose, int64_t m, int64_t n, int64_t k,
                        double alpha, const void *a, int64_t lda, double beta, void *c, int64_t ldc, const void *bias) {
    zr_tensor *v = transpose ? zr_tensor_transpose_raw(t, 0, 1) : zr_tensor_retain(t);
    zr_gemm_operand op = {0};
    zr_status st = v ? zr_gemm_operand_prepare(v, ct, &op) : ZR_ERR;
    if (!st)
        st = zr_gemm_rows(dev, ct, ct, 0, op.trans, m, n, k, alpha, a, lda, zr_tensor_data(op.t), op.ld, beta, c, ldc,
                          bias);
    zr_tensor_release(op.t);
    zr_tensor_release(v);
    return st;
}

zr_status zr_linear_multi_into(zr_device dev, zr_dtype ct, void *y, int64_t ldy, const void *x, int n,
                               zr_tensor *const *w, int64_t rows, int64_t in, const int64_t *off, double alpha,
                               double beta, const void *bias) {
    int starts[ZR_LINEAR_MULTI_MAX + 1], nr = weight_runs(n, w, starts);
    size_t es = zr_dtype_size(ct);
    for (int r = 0; r < nr; r++) {
        int s = starts[r], e = starts[r + 1];
        zr_tensor *wv = run_view(w, s, e, in);
        zr_status st = wv ? zr_gemm_right(dev, ct, wv, 1, rows, off[e] - off[s], in, alpha, x, in, beta,
                                          (char *)y + off[s] * es, ldy, bias ? (const char *)bias + off[s] * es : NULL)
                          : ZR_ERR;
        zr_tensor_release(wv);
        if (st) return st;
    }
    return ZR_OK;
}

zr_status zr_linear_multi_dx_into(zr_device dev, zr_dtype ct, void *dx, const void *g, int64_t ldg, int n,
                                  zr_tensor *const *w, int64_t rows, int64_t in, const int64_t *off,
                                  double beta) {
    int starts[ZR_LINEAR_MULTI_MAX + 1], nr = weight_runs(n, w, starts);
    size_t es = zr_dtype_size(ct);
    for (int k = 0; k < nr; k++) {
        int s = starts[k], t = starts[k + 1];
        zr_tensor *wv = run_view(w, s, t, in);
        zr_status st = wv ? zr_gemm_right(dev, ct, wv, 0, rows, in, off[t] - off[s], 1.0, (const char *)g + off[s] * es,
                                          ldg, k ? 1.0 : beta, dx, in, NULL)
                          : ZR_ERR;
        zr_tensor_release(wv);
        if (st) return st;
    }
    return ZR_OK;
}

zr_status zr_linear_multi_rows(zr_tensor *o, zr_tensor *xi, int n, zr_tensor *const *w, zr_tensor *bc,
                               int64_t rows, int64_t in, int64_t N, const int64_t *off) {
    zr_device dev = zr_tensor_device(o);
    int cpu = dev.type == ZR_CPU;
    if (cpu && bc) ZR_CPU_CALL(o->dtype, fill_rows_cpu, zr_tensor_data(o), zr_tensor_data(bc), rows, N);
    return zr_linear_multi_into(dev, o->dtype, zr_tensor_data(o), N, zr_tensor_data(xi), n, w, rows, in, off, 1.0,
                                cpu && bc ? 1.0 : 0.0, !cpu && bc ? zr_tensor_data(bc) : NULL);
}

zr_tensor *zr_linear_multi_biases(zr_tensor *const *b, int n, const int64_t *off, zr_dtype ct, zr_device dev) {
    return concat_biases(b, n, off, off[n], ct, dev);
}

/* out (rows, N) contiguous = x · Wᵀ (+ biases): one GEMM per run of adjacent weights, each into
 * its column block. CPU: computed in f32/f64 (the biases are filled in first, the GEMMs add);
 * CUDA: in out's dtype, each run's biases through the GEMM epilogue. */
static zr_status lm_forward(zr_tensor *out, zr_tensor *x, int n, zr_tensor *const *w, zr_tensor *const *b,
                            int64_t rows, int64_t in, int64_t N, const int64_t *off) {
    zr_device dev = zr_tensor_device(out);
    int cpu = dev.type == ZR_CPU;
    zr_dtype ct = cpu ? zr_cpu_compute_dtype(out->dtype) : out->dtype;
    zr_tensor *xi = NULL, *o = NULL, *bc = NULL;
    zr_status st = ZR_ERR;
    if (b && !(bc = concat_biases(b, n, off, N, ct, dev))) goto done;
    if (in == 0) { /* no product: every row is the bias (or zero) */
        zr_tensor *e = bc ? zr_tensor_expand_raw(bc, out->ndim, out->shape) : NULL;
        st = bc ? (e ? zr_tensor_copy_(out, e) : ZR_ERR) : zr_tensor_fill_(out, 0);
        zr_tensor_release(e);
        goto done;
    }
    if (!(xi = zr_tensor_to_raw(x, ct, dev))) goto done;
    if (!(o = cpu ? zr_cpu_out_begin(out, ct) : zr_tensor_retain(out))) goto done;
    if (zr_linear_multi_rows(o, xi, n, w, bc, rows, in, N, off)) goto done;
    st = cpu ? zr_cpu_out_end(out, o) : ZR_OK;
    if (cpu) o = NULL;
done:
    zr_tensor_release(o);
    zr_tensor_release(xi);
    zr_tensor_release(bc);
    return st;
}

/* True when a leaf gradient lg can be the output of the dW GEMM computed in dtype ct on dev. */
static int gemm_writable(const zr_tensor *lg, zr_dtype ct, int cpu) {
    if (!lg) return 0;
    if (cpu) return lg->dtype == ct;
    return (lg->dtype == ZR_F32 || lg->dtype == ct) && (ct == ZR_BF16 || ct == ZR_F16 || ct == ZR_F32);
}

zr_status zr_grad_product(zr_node *nd, int e, zr_device dev, zr_dtype ct, int64_t m, int64_t n, int64_t k,
                          double alpha, const void *a, int64_t lda, const void *b, int64_t ldb, zr_tensor **gin) {
    if (!zr_node_needs_grad(nd, e)) return ZR_OK;
    zr_tensor *lg = zr_node_leaf_grad(nd, e);
    if (gemm_writable(lg, ct, dev.type == ZR_CPU)) { /* straight into it; a stale one is overwritten */
        zr_tensor *leaf = nd->edges[e].leaf;
        if (zr_gemm_rows(dev, ct, lg->dtype, 1, 0, m, n, k, alpha, a, lda, b, ldb, leaf->grad_stale ? 0.0 : 1.0,
                         zr_tensor_data(lg), n, NULL))
            return ZR_ERR;
        leaf->grad_stale = 0;
        return ZR_OK;
    }
    zr_tensor *d = zr_tensor_new_cat(ct, dev, 2, (int64_t[]){m, n}, ZR_MEM_ACTIVATIONS, 0);
    if (!d) return ZR_ERR;
    if (zr_gemm_rows(dev, ct, ct, 1, 0, m, n, k, alpha, a, lda, b, ldb, 0.0, zr_tensor_data(d), n, NULL)) {
        zr_tensor_release(d);
        return ZR_ERR;
    }
    return (gin[e] = zr_take_as(d, nd->edges[e].dtype)) ? ZR_OK : ZR_ERR;
}

/* dW for every weight that needs it, from gi (rows, N) and xi (rows, in), both contiguous in ct:
 * into the leaf gradients (one GEMM over all of them when they are adjacent), else returned. */
static zr_status lm_backward_dw(zr_node *nd, int n, zr_tensor *const *w, zr_tensor *gi, zr_tensor *xi,
                                int64_t rows, int64_t in, int64_t N, const int64_t *off, zr_dtype ct,
                                zr_tensor **gin) {
    zr_device dev = zr_tensor_device(gi);
    int cpu = dev.type == ZR_CPU;
    zr_tensor *lg[ZR_LINEAR_MULTI_MAX];
    int all = 1;
    for (int i = 0; i < n; i++) {
        lg[i] = zr_node_needs_grad(nd, 1 + i) ? zr_node_leaf_grad(nd, 1 + i) : NULL;
        if (!gemm_writable(lg[i], ct, cpu)) lg[i] = NULL;
        if (!lg[i] || (i > 0 && (!lg[i - 1] || !follows(lg[i - 1], lg[i]) ||
                                 nd->edges[i].leaf->grad_stale != nd->edges[1 + i].leaf->grad_stale)))
            all = 0;
    }
    if (all) { /* one GEMM over the spanning region: dW (N, in) = gyᵀ · x */
        int stale = nd->edges[1].leaf->grad_stale;
        if (mm(dev, ct, lg[0]->dtype, 1, 0, N, in, rows, zr_tensor_data(gi), N, zr_tensor_data(xi), in,
               stale ? 0.0 : 1.0, zr_tensor_data(lg[0]), in, NULL))
            return ZR_ERR;
        for (int i = 0; i < n; i++) nd->edges[1 + i].leaf->grad_stale = 0;
        return ZR_OK;
    }
    for (int i = 0; i < n; i++) /* per weight: into its gradient where it can be, else returned */
        if (zr_grad_product(nd, 1 + i, dev, ct, w[i]->shape[0], in, rows, 1.0, at(gi, off[i]), N, zr_tensor_data(xi),
                            in, gin))
            return ZR_ERR;
    return ZR_OK;
}

/* saved: x, w_1..w_n; edges: x, w_1..w_n, b_1..b_n (NULL without biases); i[0] = n. */
static zr_status linear_multi_backward(zr_node *nd, zr_tensor *g, zr_tensor **gin) {
    int n = (int)nd->i[0];
    zr_tensor *x = nd->saved[0], *const *w = nd->saved + 1;
    zr_device dev = zr_tensor_device(g);
    int cpu = dev.type == ZR_CPU;
    int64_t in = w[0]->shape[1], N = g->shape[g->ndim - 1], rows = N ? zr_tensor_numel(g) / N : 0;
    int64_t off[ZR_LINEAR_MULTI_MAX + 1];
    zr_dtype dt = zr_promote(g->dtype, x->dtype);
    off[0] = 0;
    for (int i = 0; i < n; i++) {
        off[i + 1] = off[i] + w[i]->shape[0];
        dt = zr_promote(dt, w[i]->dtype);
    }
    zr_dtype ct = cpu ? zr_cpu_compute_dtype(dt) : dt;
    if (rows == 0) { /* nothing flowed: zero gradients */
        for (int i = 0; i < 1 + 2 * n; i++) {
            zr_edge *e = &nd->edges[i];
            if (zr_node_needs_grad(nd, i) && !(gin[i] = zr_tensor_zeros(e->dtype, dev, e->ndim, e->shape)))
                return ZR_ERR;
        }
        return ZR_OK;
    }
    zr_tensor *gi = zr_tensor_to_raw(g, ct, dev), *xi = NULL, *r = NULL;
    zr_status st = ZR_ERR;
    if (!gi) goto done;
    if (zr_node_needs_grad(nd, 0)) { /* dx (rows, in) = Σ runs gy[:, run] · W_run */
        zr_edge *e = &nd->edges[0];
        if (!(r = zr_tensor_new_cat(ct, dev, e->ndim, e->shape, ZR_MEM_ACTIVATIONS, 0))) goto done;
        if (zr_linear_multi_dx_into(dev, ct, zr_tensor_data(r), zr_tensor_data(gi), N, n, w, rows, in, off, 0.0))
            goto done;
        if (!(gin[0] = zr_take_as(r, e->dtype))) goto done;
        r = NULL;
    }
    int need_w = 0, need_b = 0;
    for (int i = 0; i < n; i++) {
        need_w |= zr_node_needs_grad(nd, 1 + i);
        need_b |= zr_node_needs_grad(nd, 1 + n + i);
    }
    if (need_w) {
        if (!(xi = zr_tensor_to_raw(x, ct, dev))) goto done;
        if (lm_backward_dw(nd, n, w, gi, xi, rows, in, N, off, ct, gin)) goto done;
    }
    if (need_b) { /* db: one column sum of gy, sliced per bias */
        if (!(r = zr_tensor_new_cat(ct, dev, 1, &N, ZR_MEM_ACTIVATIONS, 0))) goto done;
        if (cpu) ZR_CPU_CALL(ct, sum_cols_cpu, zr_tensor_data(r), zr_tensor_data(gi), rows, N);
#ifdef ZR_HAVE_CUDA
        else if (zr_dev_status(linear_bias_grad_cuda(zr_tensor_data(r), zr_tensor_data(gi), rows, N, ct,
                                                     zr_cuda_stream(dev)),
                               "linear_multi backward (bias)", dev))
            goto done;
#endif
        for (int i = 0; i < n; i++) {
            zr_edge *e = &nd->edges[1 + n + i];
            if (!zr_node_needs_grad(nd, 1 + n + i)) continue;
            zr_tensor *v = zr_tensor_narrow_raw(r, 0, off[i], off[i + 1] - off[i]);
            if (!(gin[1 + n + i] = zr_take_as(v, e->dtype))) goto done;
        }
    }
    st = ZR_OK;
done:
    zr_tensor_release(r);
    zr_tensor_release(gi);
    zr_tensor_release(xi);
    return st;
}

zr_tensor *zr_linear_multi(zr_tensor *x, int n, zr_tensor *const *w, zr_tensor *const *b) {
    char b1[128], b2[128];
    if (!x || !w || n < 1 || n > ZR_LINEAR_MULTI_MAX)
        return zr_error_null("linear_multi: expected an input and 1 to %d weights, got %d", ZR_LINEAR_MULTI_MAX,
                             x && w ? n : 0);
    zr_tensor *inputs[1 + 2 * ZR_LINEAR_MULTI_MAX] = {x};
    if (zr_check_float("linear_multi", x)) return NULL;
    if (x->ndim == 0) return zr_error_null("linear_multi: the input must have at least 1 dim, got a 0-dim tensor");
    int64_t in = x->shape[x->ndim - 1], N = 0, off[ZR_LINEAR_MULTI_MAX + 1];
    zr_dtype dt = x->dtype;
    for (int i = 0; i < n; i++) {
        zr_tensor *wi = w[i], *bi = b ? b[i] : NULL;
        if (!wi) return zr_error_null("linear_multi: weight %d is missing", i + 1);
        if (b && !bi) return zr_error_null("linear_multi: bias %d is missing (give all %d biases or none)", i + 1, n);
        if (zr_check_float("linear_multi", wi) || (bi && zr_check_float("linear_multi", bi))) return NULL;
        if (wi->ndim != 2 || wi->shape[1] != in)
            return zr_error_null("linear_multi: weight %d must be (out_features, %lld) to match input %s, got %s", i + 1,
                                 (long long)in, zr_tensor_shape_str(x, b1), zr_tensor_shape_str(wi, b2));
        if (bi && (bi->ndim != 1 || bi->shape[0] != wi->shape[0]))
            return zr_error_null("linear_multi: bias %d must have shape (%lld) to match weight %d %s, got %s", i + 1,
                                 (long long)wi->shape[0], i + 1, zr_tensor_shape_str(wi, b1), zr_tensor_shape_str(bi, b2));
        off[i] = N;
        N += wi->shape[0];
        dt = zr_promote(dt, wi->dtype);
        if (bi) dt = zr_promote(dt, bi->dtype);
        inputs[1 + i] = wi;
        inputs[1 + n + i] = bi;
    }
    off[n] = N;
    if (zr_check_same_device("linear_multi", 1 + 2 * n, inputs)) return NULL;
    int64_t shape[ZR_MAX_DIMS], rows = 1;
    memcpy(shape, x->shape, sizeof shape);
    shape[x->ndim - 1] = N;
    for (int i = 0; i < x->ndim - 1; i++) rows *= x->shape[i];
    zr_tensor *out = zr_tensor_new_cat(dt, zr_tensor_device(x), x->ndim, shape, ZR_MEM_ACTIVATIONS, 0);
    if (!out) return NULL;
    if (rows && N && lm_forward(out, x, n, w, b, rows, in, N, off)) goto fail;
    zr_node *nd;
    if (zr_autograd_record(out, "linear_multi", linear_multi_backward, 1 + 2 * n, inputs, &nd)) goto fail;
    if (nd) {
        nd->i[0] = n;
        if (zr_node_save(nd, x)) goto fail;
        for (int i = 0; i < n; i++)
            if (zr_node_save(nd, w[i])) goto fail;
    }
    return out;
fail:
    zr_tensor_release(out);
    return NULL;
}
