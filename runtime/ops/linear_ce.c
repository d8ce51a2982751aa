/* The linear cross-entropy (see linear_ce.h): forward and backward side by side, a CPU path (the reference: f32/f64
 * products and the kernels of kernels/cpu/cross_entropy.c, every slice rounded to the dtype as linear's output is) and
 * a CUDA one (cuBLASLt products, kernels/cuda/cross_entropy.h's chunk kernels). The targets are read on the host
 * once (from a GPU: one copy, which waits for the forward so far) to size the products by the counted rows. Saved for
 * backward: the counted rows of h and w (contiguous), their targets as i64, each row's logsumexp (compute dtype; f32 on
 * CUDA), on CUDA the count as a device scalar, and the rows' positions when some were ignored; and the counted rows' whole logits when
 * they fit the keep budget (zr_linear_ce_keeps: no product again in backward). */
#include "ops/linear_ce.h"

#include <math.h>
#include <string.h>

#include "ops/util.h"

#ifdef ZR_HAVE_CUDA
#include "cuda/blas_plan.h"
#include "cuda/device.h"
#include "kernels/cuda/cross_entropy.h"
#include "kernels/cuda/embedding.h"
#endif

int64_t zr_linear_ce_chunk(int64_t rows, int64_t V, zr_dtype dt, int64_t chunk) {
    if (chunk <= 0) {
        int64_t row_bytes = rows * (int64_t)zr_dtype_size(dt);
        chunk = row_bytes > 0 ? ZR_LCE_CHUNK_BYTES / row_bytes / 256 * 256 : V;
        if (chunk < ZR_LCE_MIN_CHUNK) chunk = ZR_LCE_MIN_CHUNK;
    }
    return chunk < V ? chunk : V;
}

int zr_linear_ce_keeps(int64_t rows, int64_t V, size_t elem, int64_t chunk, int64_t keep) {
    if (chunk > 0) return 0; /* slices asked for */
    if (keep < 0) keep = ZR_LCE_KEEP_BYTES;
    return rows > 0 && (double)rows * (double)V * (double)elem <= (double)keep;
}

/* One call's operands: h (n, d), w (v, d) contiguous in dt, tgt (n) i64; vc columns a slice. The forward's token
 * statistics (NULL: none): ent (f32; f64 on the CPU for f64) and amax (i64) of every row of the call, zeroed, written
 * at the counted rows idx (NULL: every row counts). */
typedef struct {
    zr_tensor *h, *w, *tgt;
    int64_t n, d, v, vc, ignore;
    double eps;
    zr_dtype dt;
    zr_tensor *ent, *amax, *idx;
} lce_args;

/* The running token statistics of the n counted rows (m, s, t, bv in dtype ct; bi i64), as the kernels start them. */
typedef struct {
    zr_tensor *m, *s, *t, *bv, *bi;
} lce_stats;
static void stats_release(lce_stats *st) {
    zr_tensor_release(st->m), zr_tensor_release(st->s), zr_tensor_release(st->t), zr_tensor_release(st->bv);
    zr_tensor_release(st->bi);
}
static zr_status stats_new(lce_stats *st, const lce_args *a, zr_dtype ct) {
    zr_device dev = zr_tensor_device(a->h);
    zr_tensor **f[4] = {&st->m, &st->s, &st->t, &st->bv};
    for (int i = 0; i < 4; i++)
        if (!(*f[i] = zr_tensor_new_cat(ct, dev, 1, &a->n, ZR_MEM_WORKSPACE, 0))) return ZR_ERR;
    if (!(st->bi = zr_tensor_new_cat(ZR_I64, dev, 1, &a->n, ZR_MEM_WORKSPACE, 0))) return ZR_ERR;
    if (zr_tensor_fill_(st->m, -INFINITY) || zr_tensor_fill_(st->s, 0) || zr_tensor_fill_(st->t, 0) ||
        zr_tensor_fill_(st->bv, -INFINITY) || zr_tensor_fill_(st->bi, 0))
        return ZR_ERR;
    return ZR_OK;
}

static void *row_ptr(zr_tensor *t, int64_t row, int64_t width) {
    return (char *)zr_tensor_data(t) + (size_t)(row * width) * zr_dtype_size(t->dtype);
}

/* The rows of h (rows, d) contiguous named by idx (n) i64 on h's device, a new contiguous (n, d) tensor. */
static zr_tensor *gather_rows(zr_tensor *h, zr_tensor *idx) {
    int64_t n = zr_tensor_numel(idx), d = h->shape[1];
    zr_device dev = zr_tensor_device(h);
    zr_tensor *out = zr_tensor_new_cat(h->dtype, dev, 2, (int64_t[]){n, d}, ZR_MEM_ACTIVATIONS, 0);
    if (!out) return NULL;
    if (zr_is_cpu(h)) {
        const int64_t *ix = zr_tensor_data(idx);
        size_t row = (size_t)d * zr_dtype_size(h->dtype);
        for (int64_t i = 0; i < n; i++) memcpy(row_ptr(out, i, d), row_ptr(h, ix[i], d), row);
        return out;
    }
#ifdef ZR_HAVE_CUDA
    if (!zr_dev_status(embedding_forward_cuda(zr_tensor_data(out), zr_tensor_data(h), zr_tensor_data(idx), n,
                                              h->shape[0], d, h->dtype, zr_cuda_stream(dev)),
                       "linear_cross_entropy", dev))
        return out;
#endif
    zr_tensor_release(out);
    return NULL;
}

/* full (rows, d) contiguous = g (n, d) contiguous scattered to the rows idx (n) names, 0 in the others. */
static zr_status scatter_rows(zr_tensor *full, zr_tensor *g, zr_tensor *idx) {
    int64_t n = zr_tensor_numel(idx), d = g->shape[1], rows = zr_tensor_numel(full) / (d ? d : 1);
    zr_device dev = zr_tensor_device(full);
    if (zr_is_cpu(full)) {
        if (zr_tensor_fill_(full, 0)) return ZR_ERR;
        const int64_t *ix = zr_tensor_data(idx);
        size_t row = (size_t)d * zr_dtype_size(g->dtype);
        for (int64_t i = 0; i < n; i++) memcpy(row_ptr(full, ix[i], d), row_ptr(g, i, d), row);
        return ZR_OK;
    }
#ifdef ZR_HAVE_CUDA
    size_t wsz = embedding_backward_workspace_size(n, rows);
    zr_tensor *ws = wsz ? zr_tensor_new_cat(ZR_U8, dev, 1, (int64_t[]){(int64_t)wsz}, ZR_MEM_WORKSPACE, 0) : NULL;
    if (wsz && !ws) return ZR_ERR;
    int rc = embedding_backward_cuda(zr_tensor_data(full), zr_tensor_data(g), zr_tensor_data(idx),
                                     ws ? zr_tensor_data(ws) : NULL, n, rows, d, 0, g->dtype, zr_cuda_stream(dev));
    zr_tensor_release(ws);
    return zr_dev_status(rc, "linear_cross_entropy backward", dev);
#else
    (void)rows, (void)dev;
    return zr_no_cuda("linear_cross_entropy");
#endif
}

/* The counted rows: the targets read on the host (one copy from a device: the products are sized by the count), each
 * checked against the classes; *idx (their positions, on dev) and *tc (their targets, on dev) when some row is
 * ignored (the products then skip it: its loss and gradient are 0), else *idx NULL and *tc all the targets. */
static zr_status counted_rows(zr_tensor *targets, int64_t ignore, int64_t V, zr_device dev, zr_tensor **idx,
                              zr_tensor **tc) {
    zr_device cpu = {ZR_CPU, 0};
    zr_tensor *th = zr_tensor_to_raw(targets, ZR_I64, cpu), *ih = NULL;
    *idx = *tc = NULL;
    if (!th) return ZR_ERR;
    const int64_t *t = zr_tensor_data(th);
    int64_t rows = zr_tensor_numel(th), n = 0;
    zr_status st = ZR_ERR;
    for (int64_t i = 0; i < rows; i++) {
        if (t[i] == ignore) continue;
        if (t[i] < 0 || t[i] >= V) {
            zr_error("linear_cross_entropy: target %lld (at flat position %lld) is out of range for %lld classes: "
                     "expected 0..%lld, or ignore_index %lld", (long long)t[i], (long long)i + 1, (long long)V,
                     (long long)V - 1, (long long)ignore);
            goto done;
        }
        n++;
    }
    if (n == rows) { /* (the targets themselves where they are i64 and contiguous on dev already) */
        st = (*tc = zr_tensor_to_raw(targets, ZR_I64, dev)) ? ZR_OK : ZR_ERR;
        goto done;
    }
    zr_tensor *ch = zr_tensor_new_cat(ZR_I64, cpu, 1, &n, ZR_MEM_WORKSPACE, 0);
    if (!ch || !(ih = zr_tensor_new_cat(ZR_I64, cpu, 1, &n, ZR_MEM_WORKSPACE, 0))) {
        zr_tensor_release(ch);
        goto done;
    }
    int64_t *c = zr_tensor_data(ch), *ix = zr_tensor_data(ih);
    for (int64_t i = 0, k = 0; i < rows; i++)
        if (t[i] != ignore) c[k] = t[i], ix[k++] = i;
    *tc = zr_tensor_to_raw(ch, ZR_I64, dev);
    *idx = zr_tensor_to_raw(ih, ZR_I64, dev);
    zr_tensor_release(ch);
    st = *tc && *idx ? ZR_OK : ZR_ERR;
done:
    zr_tensor_release(th);
    zr_tensor_release(ih);
    return st;
}

/* --- CPU --- */

/* x (n) in f32 rounded to dt's precision (bf16/f16: what a 16-bit linear's output holds); f64/f32: as it is. */
static void round_to(zr_dtype dt, zr_tensor *buf, int64_t n) {
    if (buf->dtype != ZR_F32 || (dt != ZR_BF16 && dt != ZR_F16)) return;
    float *f = zr_tensor_data(buf);
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; i++)
        f[i] = dt == ZR_BF16 ? zr_bf16_to_f32(zr_f32_to_bf16(f[i])) : zr_f16_to_f32(zr_f32_to_f16(f[i]));
}

/* buf (n, vc) = the logits of classes v0 .. v0 + vc - 1 (hi, wi: h and w in the compute dtype). */
static void slice_cpu(const lce_args *a, zr_tensor *hi, zr_tensor *wi, zr_tensor *buf, int64_t v0, int64_t vc) {
    ZR_CPU_CALL(buf->dtype, gemm_cpu, 0, 1, a->n, vc, a->d, 1.0, zr_tensor_data(hi), a->d, row_ptr(wi, v0, a->d), a->d,
                0.0, zr_tensor_data(buf), vc);
    round_to(a->dt, buf, a->n * vc);
}

/* h's gradient (the input's shape; dtype: dh's, or the input's when every row counted) from dh (its counted rows'
 * gradient, contiguous (n, d)): dh copied when every row counted, else scattered, 0 in the ignored rows. A new
 * reference, or NULL. */
static zr_tensor *h_grad(zr_node *n, zr_tensor *dh, zr_tensor *idx) {
    zr_edge *e = &n->edges[0];
    zr_tensor *full = zr_tensor_new_cat(idx ? dh->dtype : e->dtype, zr_tensor_device(dh), e->ndim, e->shape,
                                        ZR_MEM_ACTIVATIONS, 0);
    if (full && (idx ? scatter_rows(full, dh, idx) : zr_tensor_copy_(full, dh))) {
        zr_tensor_release(full);
        return NULL;
    }
    return full;
}

/* The counted rows' positions a node saved last (i[4]: some rows were ignored), or NULL. */
static zr_tensor *saved_idx(zr_node *n) { return n->i[4] ? n->saved[n->n_saved - 1] : NULL; }

/* The forward's logits a node kept (i[5] = 1: saved before idx), for a backward that turns them into their gradient
 * in place; NULL when none were kept, or once a backward has used them (i[5] = 2: a retain_graph backward that comes
 * again makes them again, in the same storage). */
static zr_tensor *saved_logits(zr_node *n) { return n->i[5] ? n->saved[n->n_saved - 1 - (n->i[4] ? 1 : 0)] : NULL; }

/* saved: h's counted rows, w, their targets, lse [, idx]; i[0] = ignore_index, i[1] = reduction, i[2] = counted
 * targets, i[3] = columns a slice, i[4] = 1 when idx (some rows ignored); f[0] = eps. */
static zr_status lce_backward_cpu(zr_node *n, zr_tensor *g, zr_tensor **gin) {
    lce_args a = {n->saved[0], n->saved[1], n->saved[2], 0, 0, 0, n->i[3], n->i[0], n->f[0], ZR_F32, NULL, NULL, NULL};
    zr_tensor *lse = n->saved[3];
    a.dt = a.h->dtype, a.d = a.w->shape[1], a.v = a.w->shape[0], a.n = zr_tensor_numel(a.tgt);
    zr_dtype ct = lse->dtype;
    zr_device dev = zr_tensor_device(a.h);
    double scale;
    if (zr_tensor_get(g, 0, &scale)) return ZR_ERR;
    if (n->i[1] == ZR_LOSS_MEAN) scale /= (double)n->i[2]; /* no counted target: every row is skipped */
    int need_h = zr_node_needs_grad(n, 0), need_w = zr_node_needs_grad(n, 1);
    zr_tensor *d[2] = {NULL, NULL}, *dh = NULL, *hi = zr_cpu_in(a.h, ct), *wi = hi ? zr_cpu_in(a.w, ct) : NULL;
    zr_tensor *kept = saved_logits(n);
    zr_tensor *buf = !wi ? NULL : kept ? zr_tensor_retain(kept)
                                       : zr_tensor_new_cat(ct, dev, 2, (int64_t[]){a.n, a.vc}, ZR_MEM_WORKSPACE, 0);
    int fresh = kept && n->i[5] == 1; /* the forward's logits, not yet turned into their gradient */
    zr_status st = ZR_ERR;
    if (!buf || (need_h && !(dh = zr_tensor_new_cat(ct, dev, 2, (int64_t[]){a.n, a.d}, ZR_MEM_WORKSPACE, 0))) ||
        (need_w && !(d[1] = zr_tensor_new_cat(ct, dev, 2, a.w->shape, ZR_MEM_ACTIVATIONS, 0))))
        goto done;
    for (int64_t v0 = 0; v0 < a.v; v0 += a.vc) {
        int64_t vc = a.v - v0 < a.vc ? a.v - v0 : a.vc;
        if (!fresh) slice_cpu(&a, hi, wi, buf, v0, vc);
        ZR_CPU_CALL(ct, lce_chunk_grad_cpu, zr_tensor_data(buf), zr_tensor_data(buf), zr_tensor_data(lse),
                    (const int64_t *)zr_tensor_data(a.tgt), scale, a.n, vc, v0, a.v, a.ignore, a.eps);
        round_to(a.dt, buf, a.n * vc); /* the gradient in the logits' dtype, as cross_entropy's backward gives it */
        if (need_w) /* dW rows v0.. (vc, d) = gᵀ (vc, n) · h (n, d) */
            ZR_CPU_CALL(ct, gemm_cpu, 1, 0, vc, a.d, a.n, 1.0, zr_tensor_data(buf), vc, zr_tensor_data(hi), a.d, 0.0,
                        row_ptr(d[1], v0, a.d), a.d);
        if (need_h) /* dh (n, d) += g (n, vc) · w rows v0.. (vc, d) */
            ZR_CPU_CALL(ct, gemm_cpu, 0, 0, a.n, a.d, vc, 1.0, zr_tensor_data(buf), vc, row_ptr(wi, v0, a.d), a.d,
                        v0 ? 1.0 : 0.0, zr_tensor_data(dh), a.d);
    }
    if (kept) n->i[5] = 2;
    if (need_h && !(d[0] = h_grad(n, dh, saved_idx(n)))) goto done;
    st = zr_give_grads(n, 2, d, gin);
done:
    zr_tensor_release(dh);
    zr_tensor_release(d[0]);
    zr_tensor_release(d[1]);
    zr_tensor_release(hi);
    zr_tensor_release(wi);
    zr_tensor_release(buf);
    return st;
}

/* The loss (a scalar of dtype lt) and each row's logsumexp into lse (n, ct); every row's target counts. */
static zr_status lce_forward_cpu(const lce_args *a, zr_tensor *out, zr_tensor *lse, int red, zr_tensor **kept) {
    zr_dtype ct = lse->dtype;
    zr_device dev = zr_tensor_device(a->h);
    const int64_t *t = zr_tensor_data(a->tgt);
    zr_tensor *hi = zr_cpu_in(a->h, ct), *wi = hi ? zr_cpu_in(a->w, ct) : NULL;
    zr_tensor *xt = wi ? zr_tensor_new_cat(ct, dev, 1, &a->n, ZR_MEM_WORKSPACE, 0) : NULL;
    zr_tensor *tot = xt ? zr_tensor_new_cat(ct, dev, 1, &a->n, ZR_MEM_WORKSPACE, 0) : NULL;
    zr_tensor *buf = tot ? zr_tensor_new_cat(ct, dev, 2, (int64_t[]){a->n, a->vc}, kept ? ZR_MEM_ACTIVATIONS : ZR_MEM_WORKSPACE, 0)
                         : NULL;
    lce_stats ts = {0};
    zr_status st = ZR_ERR;
    if (!buf || zr_tensor_fill_(lse, -INFINITY) || zr_tensor_fill_(xt, 0) || zr_tensor_fill_(tot, 0) ||
        (a->ent && stats_new(&ts, a, ct)))
        goto done;
    for (int64_t v0 = 0; v0 < a->v; v0 += a->vc) {
        int64_t vc = a->v - v0 < a->vc ? a->v - v0 : a->vc;
        slice_cpu(a, hi, wi, buf, v0, vc);
        ZR_CPU_CALL(ct, lce_chunk_stats_cpu, zr_tensor_data(lse), zr_tensor_data(xt), zr_tensor_data(tot),
                    zr_tensor_data(buf), t, a->n, vc, v0, a->ignore, a->eps != 0);
        if (a->ent)
            ZR_CPU_CALL(ct, lce_chunk_token_stats_cpu, zr_tensor_data(ts.m), zr_tensor_data(ts.s), zr_tensor_data(ts.t),
                        zr_tensor_data(ts.bv), zr_tensor_data(ts.bi), zr_tensor_data(buf), t, a->n, vc, v0, a->ignore);
    }
    if (a->ent) { /* the entropy and argmax of each counted row, at its position */
        const int64_t *ix = a->idx ? zr_tensor_data(a->idx) : NULL, *bi = zr_tensor_data(ts.bi);
        for (int64_t k = 0; k < a->n; k++) {
            double sv, tv;
            int64_t r = ix ? ix[k] : k;
            if (zr_tensor_get(ts.s, k, &sv) || zr_tensor_get(ts.t, k, &tv) ||
                zr_tensor_set(a->ent, r, ct == ZR_F32 ? (double)(logf((float)sv) - (float)tv / (float)sv)
                                                      : log(sv) - tv / sv))
                goto done;
            ((int64_t *)zr_tensor_data(a->amax))[r] = bi[k];
        }
    }
    double s = 0; /* in double, in row order: deterministic; a row's loss as cross_entropy_forward_cpu's */
    for (int64_t i = 0; i < a->n; i++) {
        if (t[i] == a->ignore) continue;
        double l, x, sum;
        if (zr_tensor_get(lse, i, &l) || zr_tensor_get(xt, i, &x) || zr_tensor_get(tot, i, &sum)) goto done;
        if (ct == ZR_F32) {
            float lf = (float)l - (1.0f - (float)a->eps) * (float)x - (float)a->eps / (float)a->v * (float)sum;
            s += lf;
        } else {
            s += l - (1 - a->eps) * x - a->eps / (double)a->v * sum;
        }
    }
    if (red == ZR_LOSS_MEAN) s = a->n ? s / (double)a->n : NAN; /* torch: 0/0 */
    st = zr_tensor_set(out, 0, s);
    if (!st && kept) *kept = buf, buf = NULL;
done:
    stats_release(&ts);
    zr_tensor_release(hi);
    zr_tensor_release(wi);
    zr_tensor_release(xt);
    zr_tensor_release(tot);
    zr_tensor_release(buf);
    return st;
}

/* --- CUDA --- */
#ifdef ZR_HAVE_CUDA
/* buf (n, vc) = the logits of classes v0 .. v0 + vc - 1, in dt (cuBLASLt, f32 accumulation). */
static zr_status slice_dev(const lce_args *a, zr_tensor *buf, int64_t v0, int64_t vc, cudaStream_t s, zr_device dev) {
    zr_gemm_desc g = {0};
    g.ta = 0, g.tb = 1, g.m = a->n, g.n = vc, g.k = a->d, g.a = zr_tensor_data(a->h), g.lda = a->d;
    g.b = row_ptr(a->w, v0, a->d), g.ldb = a->d, g.c = zr_tensor_data(buf), g.ldc = vc, g.batch = 1;
    g.alpha = 1, g.beta = 0, g.ab_dtype = a->dt, g.c_dtype = a->dt;
    return zr_dev_status(gemm_ex_cuda(&g, s), "linear_cross_entropy (logits)", dev);
}

/* saved: h's counted rows, w, their targets, lse (f32), n_valid (0-dim f32) [, idx]; i[] and f[] as the CPU's. */
static zr_status lce_backward_dev(zr_node *n, zr_tensor *g, zr_tensor **gin) {
    lce_args a = {n->saved[0], n->saved[1], n->saved[2], 0, 0, 0, n->i[3], n->i[0], n->f[0], ZR_F32, NULL, NULL, NULL};
    zr_tensor *lse = n->saved[3], *nv = n->saved[4];
    a.dt = a.h->dtype, a.d = a.w->shape[1], a.v = a.w->shape[0], a.n = zr_tensor_numel(a.tgt);
    zr_device dev = zr_tensor_device(a.h);
    cudaStream_t s = zr_cuda_stream(dev);
    int need_h = zr_node_needs_grad(n, 0), need_w = zr_node_needs_grad(n, 1);
    zr_tensor *d[2] = {NULL, NULL}, *dh = NULL, *dhc = NULL, *buf = NULL, *dl = zr_tensor_to_raw(g, ZR_F32, dev);
    zr_tensor *lg = need_w ? zr_node_leaf_grad(n, 1) : NULL, *leaf = n->edges[1].leaf, *kept = saved_logits(n);
    int fresh = kept && n->i[5] == 1; /* the forward's logits, not yet turned into their gradient */
    /* dW straight into the weight's existing gradient (the engine's fp32 one, or one of dt), as linear's backward */
    int direct = lg && (lg->dtype == ZR_F32 || lg->dtype == a.dt);
    int beta_w = direct && !leaf->grad_stale;
    zr_status st = ZR_ERR;
    if (!dl || !(buf = kept ? zr_tensor_retain(kept)
                            : zr_tensor_new_cat(a.dt, dev, 2, (int64_t[]){a.n, a.vc}, ZR_MEM_WORKSPACE, 0)))
        goto done;
    if (need_h && !(dh = zr_tensor_new_cat(ZR_F32, dev, 2, (int64_t[]){a.n, a.d}, ZR_MEM_WORKSPACE, 0))) goto done;
    if (need_w && !direct && !(d[1] = zr_tensor_new_cat(a.dt, dev, 2, a.w->shape, ZR_MEM_ACTIVATIONS, 0))) goto done;
    zr_tensor *wg = direct ? lg : d[1];
    /* no counted row: dW is 0 (over a stale gradient too), dh 0 */
    if (a.n == 0 && ((need_w && (!direct || !beta_w) && zr_tensor_fill_(wg, 0)) || (dh && zr_tensor_fill_(dh, 0))))
        goto done;
    for (int64_t v0 = 0; a.n > 0 && v0 < a.v; v0 += a.vc) {
        int64_t vc = a.v - v0 < a.vc ? a.v - v0 : a.vc;
        if ((!fresh && slice_dev(&a, buf, v0, vc, s, dev)) ||
            zr_dev_status(lce_chunk_grad_cuda(zr_tensor_data(buf), zr_tensor_data(a.tgt), zr_tensor_data(lse),
                                              zr_tensor_data(dl), n->i[1] == ZR_LOSS_MEAN ? zr_tensor_data(nv) : NULL,
                                              a.n, v0, vc, a.v, a.ignore, (float)a.eps, a.dt, s),
                          "linear_cross_entropy backward", dev))
            goto done;
        if (need_w) { /* dW rows v0.. (vc, d) = gᵀ (vc, n) · h (n, d) */
            zr_gemm_desc gd = {0};
            gd.ta = 1, gd.tb = 0, gd.m = vc, gd.n = a.d, gd.k = a.n, gd.a = zr_tensor_data(buf), gd.lda = vc;
            gd.b = zr_tensor_data(a.h), gd.ldb = a.d, gd.c = row_ptr(wg, v0, a.d), gd.ldc = a.d, gd.batch = 1;
            gd.alpha = 1, gd.beta = beta_w, gd.ab_dtype = a.dt, gd.c_dtype = wg->dtype;
            if (zr_dev_status(gemm_ex_cuda(&gd, s), "linear_cross_entropy backward (dW)", dev)) goto done;
        }
        if (need_h) { /* dh (n, d) += g (n, vc) · w rows v0.. (vc, d), in f32 */
            zr_gemm_desc gd = {0};
            gd.ta = 0, gd.tb = 0, gd.m = a.n, gd.n = a.d, gd.k = vc, gd.a = zr_tensor_data(buf), gd.lda = vc;
            gd.b = row_ptr(a.w, v0, a.d), gd.ldb = a.d, gd.c = zr_tensor_data(dh), gd.ldc = a.d, gd.batch = 1;
            gd.alpha = 1, gd.beta = v0 ? 1 : 0, gd.ab_dtype = a.dt, gd.c_dtype = ZR_F32;
            if (zr_dev_status(gemm_ex_cuda(&gd, s), "linear_cross_entropy backward (dh)", dev)) goto done;
        }
    }
    if (kept) n->i[5] = 2;
    if (direct) leaf->grad_stale = 0; /* d[1] NULL: the leaf counts as done, its hook fires */
    if (need_h) { /* rounded once to h's dtype (then scattered back to h's rows when some were ignored) */
        zr_edge *e = &n->edges[0];
        if (!n->i[4]) {
            if (!(d[0] = h_grad(n, dh, NULL))) goto done;
        } else if (!(dhc = zr_tensor_new_cat(e->dtype, dev, 2, (int64_t[]){a.n, a.d}, ZR_MEM_WORKSPACE, 0)) ||
                   zr_tensor_copy_(dhc, dh) || !(d[0] = h_grad(n, dhc, saved_idx(n))))
            goto done;
    }
    st = zr_give_grads(n, 2, d, gin);
done:
    zr_tensor_release(d[0]);
    zr_tensor_release(d[1]);
    zr_tensor_release(dh);
    zr_tensor_release(dhc);
    zr_tensor_release(buf);
    zr_tensor_release(dl);
    return st;
}

/* The loss (0-dim f32), lse (n) f32 and nv (0-dim f32: the counted targets). */
static zr_status lce_forward_dev(const lce_args *a, zr_tensor *out, zr_tensor *lse, zr_tensor *nv, int red,
                                 zr_tensor **kept) {
    zr_device dev = zr_tensor_device(a->h);
    cudaStream_t s = zr_cuda_stream(dev);
    zr_tensor *xt = zr_tensor_new_cat(ZR_F32, dev, 1, &a->n, ZR_MEM_WORKSPACE, 0);
    zr_tensor *tot = a->eps != 0 ? zr_tensor_new_cat(ZR_F32, dev, 1, &a->n, ZR_MEM_WORKSPACE, 0) : NULL;
    zr_tensor *loss = zr_tensor_new_cat(ZR_F32, dev, 1, &a->n, ZR_MEM_WORKSPACE, 0);
    zr_tensor *mean = zr_tensor_new_cat(ZR_F32, dev, 0, NULL, ZR_MEM_WORKSPACE, 0);
    zr_tensor *buf = zr_tensor_new_cat(a->dt, dev, 2, (int64_t[]){a->n, a->vc}, kept ? ZR_MEM_ACTIVATIONS : ZR_MEM_WORKSPACE,
                                       0);
    lce_stats ts = {0};
    zr_status st = ZR_ERR;
    if (!xt || (a->eps != 0 && !tot) || !loss || !mean || !buf || (a->ent && stats_new(&ts, a, ZR_F32))) goto done;
    /* xt NaN: a target outside [0, V) never finds its logit, and its loss is NaN as cross_entropy's */
    if (zr_tensor_fill_(lse, -INFINITY) || zr_tensor_fill_(xt, NAN) || (tot && zr_tensor_fill_(tot, 0))) goto done;
    for (int64_t v0 = 0; a->n > 0 && v0 < a->v; v0 += a->vc) {
        int64_t vc = a->v - v0 < a->vc ? a->v - v0 : a->vc;
        if (slice_dev(a, buf, v0, vc, s, dev) ||
            zr_dev_status(lce_chunk_stats_cuda(zr_tensor_data(lse), zr_tensor_data(xt), tot ? zr_tensor_data(tot) : NULL,
                                               zr_tensor_data(buf), zr_tensor_data(a->tgt), a->n, v0, vc, a->ignore,
                                               (float)a->eps, a->dt, s),
                          "linear_cross_entropy", dev))
            goto done;
        if (a->ent && zr_dev_status(lce_chunk_token_stats_cuda(zr_tensor_data(ts.m), zr_tensor_data(ts.s),
                                                               zr_tensor_data(ts.t), zr_tensor_data(ts.bv),
                                                               zr_tensor_data(ts.bi), zr_tensor_data(buf),
                                                               zr_tensor_data(a->tgt), a->n, v0, vc, a->ignore, a->dt, s),
                                    "linear_cross_entropy (token statistics)", dev))
            goto done;
    }
    if (a->ent && zr_dev_status(lce_token_stats_out_cuda(zr_tensor_data(a->ent), zr_tensor_data(a->amax),
                                                         zr_tensor_data(ts.s), zr_tensor_data(ts.t), zr_tensor_data(ts.bi),
                                                         a->idx ? zr_tensor_data(a->idx) : NULL, a->n, s),
                                "linear_cross_entropy (token statistics)", dev))
        goto done;
    if (zr_dev_status(lce_loss_cuda(zr_tensor_data(loss), zr_tensor_data(mean), zr_tensor_data(nv), zr_tensor_data(lse),
                                    zr_tensor_data(xt), tot ? zr_tensor_data(tot) : NULL, zr_tensor_data(a->tgt), a->n,
                                    a->v, a->ignore, (float)a->eps, s),
                      "linear_cross_entropy", dev))
        goto done;
    if (red == ZR_LOSS_SUM && zr_cross_entropy_sum_dev(mean, loss)) goto done;
    st = zr_tensor_copy_(out, mean);
    if (!st && kept) *kept = buf, buf = NULL;
done:
    stats_release(&ts);
    zr_tensor_release(xt);
    zr_tensor_release(tot);
    zr_tensor_release(loss);
    zr_tensor_release(mean);
    zr_tensor_release(buf);
    return st;
}
#endif

static zr_status check_args(const zr_tensor *h, const zr_tensor *w, const zr_tensor *targets, double eps, int red) {
    char b1[128], b2[128];
    if (zr_check_float("linear_cross_entropy", h) || zr_check_float("linear_cross_entropy", w)) return ZR_ERR;
    /* (targets on the host beside h on a GPU: read there, no copy back) */
    if (zr_check_same_device("linear_cross_entropy", 2, (zr_tensor *[]){(zr_tensor *)h, (zr_tensor *)w}) ||
        (!zr_is_cpu(targets) &&
         zr_check_same_device("linear_cross_entropy", 2, (zr_tensor *[]){(zr_tensor *)h, (zr_tensor *)targets})))
        return ZR_ERR;
    if (h->dtype != w->dtype)
        return zr_error("linear_cross_entropy: h is %s and w is %s; give them one dtype", zr_dtype_name(h->dtype),
                        zr_dtype_name(w->dtype));
    if (w->ndim != 2 || h->ndim < 1 || h->shape[h->ndim - 1] != w->shape[1])
        return zr_error("linear_cross_entropy: expected h (..., D) and w (V, D), got %s and %s",
                        zr_tensor_shape_str(h, b1), zr_tensor_shape_str(w, b2));
    if (targets->dtype != ZR_I64 && targets->dtype != ZR_I32)
        return zr_error("linear_cross_entropy: targets must be i64 or i32 class indices, got %s",
                        zr_dtype_name(targets->dtype));
    int ok = targets->ndim == h->ndim - 1;
    for (int i = 0; ok && i < targets->ndim; i++) ok = targets->shape[i] == h->shape[i];
    if (!ok)
        return zr_error("linear_cross_entropy: h %s and targets %s do not match: expected h (N, D) with targets (N), "
                        "or (..., D) with targets (...)", zr_tensor_shape_str(h, b1), zr_tensor_shape_str(targets, b2));
    if (!(eps >= 0 && eps <= 1))
        return zr_error("linear_cross_entropy: label_smoothing must be in [0, 1], got %g", eps);
    if (red != ZR_LOSS_MEAN && red != ZR_LOSS_SUM)
        return zr_error("linear_cross_entropy: reduction must be 'mean' or 'sum' (the per-row losses of 'none' need "
                        "the logits: use linear then cross_entropy)");
    return ZR_OK;
}

zr_tensor *zr_linear_cross_entropy(zr_tensor *h, zr_tensor *w, zr_tensor *targets, int64_t ignore_index,
                                   zr_loss_reduction reduction, double label_smoothing, int64_t chunk) {
    return zr_linear_cross_entropy_stats(h, w, targets, ignore_index, reduction, label_smoothing, chunk, -1, NULL, NULL);
}

zr_tensor *zr_linear_cross_entropy_stats(zr_tensor *h, zr_tensor *w, zr_tensor *targets, int64_t ignore_index,
                                         zr_loss_reduction reduction, double label_smoothing, int64_t chunk,
                                         int64_t keep, zr_tensor **entropy, zr_tensor **argmax) {
    if (entropy) *entropy = *argmax = NULL;
    if (!h || !w || !targets) return zr_error_null("linear_cross_entropy: missing h, w or targets");
    if (check_args(h, w, targets, label_smoothing, (int)reduction)) return NULL;
    int cpu = zr_is_cpu(h);
    zr_device dev = zr_tensor_device(h);
    char dn[16];
    if (!cpu && h->dtype == ZR_F64)
        return zr_error_null("linear_cross_entropy on %s: f64 is not supported (use f32, bf16 or f16)",
                             zr_device_name(dev, dn));
#ifndef ZR_HAVE_CUDA
    if (!cpu) return zr_no_cuda("linear_cross_entropy"), NULL;
#endif
    int64_t D = w->shape[1], rows = D ? zr_tensor_numel(h) / D : zr_tensor_numel(targets);
    lce_args a = {NULL, NULL, NULL, 0, D, w->shape[0], 0, ignore_index, label_smoothing, h->dtype, NULL, NULL, NULL};
    if (a.v == 0) return zr_error_null("linear_cross_entropy: w has 0 classes");
    zr_dtype ct = cpu ? zr_cpu_compute_dtype(h->dtype) : ZR_F32;
    zr_tensor *out = NULL, *lse = NULL, *nv = NULL, *idx = NULL, *hc = NULL, *result = NULL, *kept = NULL;
    if (counted_rows(targets, ignore_index, a.v, dev, &idx, &a.tgt) ||
        !(hc = zr_tensor_contiguous_raw(h)) || !(a.w = zr_tensor_contiguous_raw(w)))
        goto done;
    a.n = zr_tensor_numel(a.tgt);
    if (idx) {
        zr_tensor *h2 = zr_tensor_view_raw(hc, 2, (int64_t[]){rows, D});
        a.h = h2 ? gather_rows(h2, idx) : NULL;
        zr_tensor_release(h2);
    } else {
        a.h = zr_tensor_view_raw(hc, 2, (int64_t[]){rows, D});
    }
    int keeps = zr_linear_ce_keeps(a.n, a.v, zr_dtype_size(cpu ? ct : a.dt), chunk, keep);
    a.vc = keeps ? a.v : zr_linear_ce_chunk(a.n, a.v, a.dt, chunk);
    a.idx = idx;
    if (entropy && (!(a.ent = zr_tensor_new_cat(ct, dev, targets->ndim, targets->shape, ZR_MEM_WORKSPACE, 0)) ||
                    !(a.amax = zr_tensor_new_cat(ZR_I64, dev, targets->ndim, targets->shape, ZR_MEM_WORKSPACE, 0)) ||
                    zr_tensor_fill_(a.ent, 0) || zr_tensor_fill_(a.amax, 0)))
        goto done;
    out = zr_tensor_new_cat(ct, dev, 0, NULL, ZR_MEM_ACTIVATIONS, 0);
    lse = zr_tensor_new_cat(ct, dev, 1, &a.n, ZR_MEM_ACTIVATIONS, 0);
    nv = cpu ? NULL : zr_tensor_new_cat(ZR_F32, dev, 0, NULL, ZR_MEM_ACTIVATIONS, 0);
    if (!a.h || !out || !lse || (!cpu && !nv)) goto done;
    zr_status st;
#ifdef ZR_HAVE_CUDA
    /* (the logits kept only where backward will read them) */
    zr_tensor **kp = keeps && zr_grad_enabled() && (zr_tensor_needs_grad(h) || zr_tensor_needs_grad(w)) ? &kept : NULL;
    st = cpu ? lce_forward_cpu(&a, out, lse, reduction, kp) : lce_forward_dev(&a, out, lse, nv, reduction, kp);
#else
    zr_tensor **kp = keeps && zr_grad_enabled() && (zr_tensor_needs_grad(h) || zr_tensor_needs_grad(w)) ? &kept : NULL;
    st = lce_forward_cpu(&a, out, lse, reduction, kp);
#endif
    if (st) goto done;
    zr_node *n;
    zr_backward_fn bwd = lce_backward_cpu;
#ifdef ZR_HAVE_CUDA
    if (!cpu) bwd = lce_backward_dev;
#endif
    if (zr_autograd_record(out, "linear_cross_entropy", bwd, 2, (zr_tensor *[]){h, w}, &n)) goto done;
    if (n) { /* saved: h's counted rows, w, their targets, lse [, nv (CUDA)] [, the logits] [, idx: the rows' positions] */
        n->i[0] = ignore_index, n->i[1] = reduction, n->i[2] = a.n, n->i[3] = a.vc, n->i[4] = idx != NULL;
        n->i[5] = kept != NULL;
        n->f[0] = label_smoothing;
        if (zr_node_save(n, a.h) || zr_node_save(n, a.w) || zr_node_save(n, a.tgt) || zr_node_save(n, lse) ||
            (nv && zr_node_save(n, nv)) || (kept && zr_node_save(n, kept)) || (idx && zr_node_save(n, idx)))
            goto done;
    }
    result = out;
    out = NULL;
    if (entropy) *entropy = a.ent, *argmax = a.amax, a.ent = a.amax = NULL;
done:
    zr_tensor_release(kept);
    zr_tensor_release(a.ent);
    zr_tensor_release(a.amax);
    zr_tensor_release(a.h);
    zr_tensor_release(a.w);
    zr_tensor_release(a.tgt);
    zr_tensor_release(hc);
    zr_tensor_release(idx);
    zr_tensor_release(out);
    zr_tensor_release(lse);
    zr_tensor_release(nv);
    return result;
}
