/* matmul, bmm and linear: forward and backward side by side (see ops/matmul.h). The CPU path
 * hands strided operands straight to GEMM (a transposed view becomes a transposition flag), and
 * folds a batched left operand times a 2-D right operand into one GEMM. */
#include "ops/matmul.h"

#include <string.h>

#include "ops/util.h"

/* How GEMM can read a (rows, cols) matrix with strides (rs, cs) in place: row-major with leading
 * dim ld (trans 0), or as the transpose of a row-major (cols, rows) matrix (trans 1). Returns 0
 * when neither works (e.g. both strides > 1, or an expanded dim) and a copy is needed. */
static int gemm_layout(int64_t rows, int64_t cols, int64_t rs, int64_t cs, int *trans, int64_t *ld) {
    int64_t min_row = cols > 1 ? cols : 1, min_col = rows > 1 ? rows : 1;
    if (cs == 1 || cols == 1) {
        int64_t l = rows == 1 ? min_row : rs;
        if (l >= min_row) {
            *trans = 0;
            *ld = l;
            return 1;
        }
    }
    if (rs == 1 || rows == 1) {
        int64_t l = cols == 1 ? min_col : cs;
        if (l >= min_col) {
            *trans = 1;
            *ld = l;
            return 1;
        }
    }
    return 0;
}

/* An operand ready for GEMM: t holds a reference (t itself, or a copy in the compute dtype). */
typedef zr_gemm_operand gemm_operand;

/* Makes t readable by GEMM in dtype ct: a new reference to t when it already is, else a
 * contiguous copy. The matrix is t's last two dims. */
static zr_status operand_prepare(zr_tensor *t, zr_dtype ct, gemm_operand *op) {
    int nd = t->ndim;
    op->t = NULL;
    if (t->dtype == ct &&
        gemm_layout(t->shape[nd - 2], t->shape[nd - 1], t->stride[nd - 2], t->stride[nd - 1],
                    &op->trans, &op->ld)) {
        op->t = zr_tensor_retain(t);
        return ZR_OK;
    }
    /* A matrix that is a transposed view (a weight read as Wᵀ) in another dtype: cast in its own
     * layout, row by row, and read transposed by the GEMM (cast in the view's order, the copy
     * would read the source a column at a time) */
    zr_tensor *tt = NULL;
    int trans = 0;
    if (nd == 2 && t->shape[0] > 1 && t->shape[1] > 1 &&
        gemm_layout(t->shape[0], t->shape[1], t->stride[0], t->stride[1], &trans, &op->ld) && trans &&
        !(tt = zr_tensor_transpose_raw(t, 0, 1)))
        return ZR_ERR;
    zr_tensor *src = tt ? tt : t;
    zr_tensor *c = zr_tensor_new_cat(ct, zr_tensor_device(t), nd, src->shape, ZR_MEM_WORKSPACE, 0);
    zr_status st = c && !zr_tensor_copy_(c, src) ? ZR_OK : ZR_ERR;
    zr_tensor_release(tt);
    if (st) {
        zr_tensor_release(c);
        return ZR_ERR;
    }
    op->t = c;
    op->trans = tt != NULL;
    op->ld = c->shape[nd - 1] > 1 ? c->shape[nd - 1] : 1;
    return ZR_OK;
}

zr_status zr_gemm_operand_prepare(zr_tensor *t, zr_dtype ct, zr_gemm_operand *op) {
    return operand_prepare(t, ct, op);
}

/* Batch strides of t (matrix in its last two dims) read as out's batch shape (bn dims): 0 where
 * t broadcasts. */
static void batch_strides(const zr_tensor *t, int bn, const int64_t *bshape, int64_t *st) {
    int tb = t->ndim - 2;
    for (int i = 0; i < bn; i++) {
        int it = i - (bn - tb);
        st[i] = (it < 0 || (t->shape[it] == 1 && bshape[i] != 1)) ? 0 : t->stride[it];
    }
}

/* --- CUDA path: the same operand preparation (transposed views become GEMM flags), then
 * cuBLASLt through kernels/cuda/matmul.h in the result dtype (bf16/f16 accumulate in f32, f32
 * stays f32). Batches whose offsets are one stride apart (or broadcast: stride 0) are one
 * strided-batched call; other batch layouts take one call per matrix. --- */
#ifdef ZR_HAVE_CUDA
#include "cuda/blas_plan.h"
#include "cuda/device.h"

/* True when the batch offsets st (over bshape) are a single stride apart in row-major batch
 * order (size-1 dims skipped); *stride is that stride (0 for a broadcast operand). */
static int batch_linear(int bn, const int64_t *bshape, const int64_t *st, int64_t *stride) {
    int64_t s = -1, expect = 0;
    for (int i = bn - 1; i >= 0; i--) {
        if (bshape[i] == 1) continue;
        if (s < 0) s = st[i];
        else if (st[i] != expect) return 0;
        expect = st[i] * bshape[i];
    }
    *stride = s < 0 ? 0 : s;
    return 1;
}
#endif

/* out (contiguous, dtype dt; batch shape bshape of bn dims) = a · b on a's GPU. */
static zr_status mm_dev(zr_tensor *out, zr_tensor *a, zr_tensor *b, int bn, const int64_t *bshape,
                        int64_t nbatch, int64_t m, int64_t n, int64_t k) {
#ifdef ZR_HAVE_CUDA
    zr_dtype dt = out->dtype;
    zr_device dev = zr_tensor_device(out);
    gemm_operand A = {0}, B = {0};
    zr_status st = ZR_ERR;
    if (operand_prepare(a, dt, &A) || operand_prepare(b, dt, &B)) goto done;
    int64_t as[ZR_MAX_DIMS], bs[ZR_MAX_DIMS], sa, sb;
    batch_strides(A.t, bn, bshape, as);
    batch_strides(B.t, bn, bshape, bs);
    int fold = !A.trans && nbatch > 1;
    int64_t expect = m * A.ld;
    for (int i = bn - 1; i >= 0 && fold; i--) {
        if (bs[i] != 0) fold = 0;
        if (bshape[i] == 1) continue;
        if (as[i] != expect) fold = 0;
        expect *= bshape[i];
    }
    zr_gemm_desc g = {0};
    g.ta = A.trans, g.tb = B.trans, g.m = m, g.n = n, g.k = k;
    g.a = zr_tensor_data(A.t), g.lda = A.ld, g.b = zr_tensor_data(B.t), g.ldb = B.ld;
    g.c = zr_tensor_data(out), g.ldc = n, g.stride_c = m * n, g.batch = 1;
    g.alpha = 1, g.beta = 0, g.ab_dtype = dt, g.c_dtype = dt;
    cudaStream_t s = zr_cuda_stream(dev);
    int rc;
    if (fold || nbatch == 1) {
        g.m = m * nbatch;
        rc = gemm_ex_cuda(&g, s);
    } else if (batch_linear(bn, bshape, as, &sa) && batch_linear(bn, bshape, bs, &sb)) {
        g.stride_a = sa, g.stride_b = sb, g.batch = nbatch;
        rc = gemm_ex_cuda(&g, s);
    } else {
        size_t es = zr_dtype_size(dt);
        int64_t idx[ZR_MAX_DIMS] = {0};
        rc = 0;
        for (int64_t q = 0; q < nbatch && !rc; q++) {
            int64_t ao = 0, bo = 0;
            for (int i = 0; i < bn; i++) {
                ao += idx[i] * as[i];
                bo += idx[i] * bs[i];
            }
            g.a = (const char *)zr_tensor_data(A.t) + ao * (int64_t)es;
            g.b = (const char *)zr_tensor_data(B.t) + bo * (int64_t)es;
            g.c = (char *)zr_tensor_data(out) + q * m * n * (int64_t)es;
            rc = gemm_ex_cuda(&g, s);
            for (int i = bn - 1; i >= 0; i--) {
                if (++idx[i] < bshape[i]) break;
                idx[i] = 0;
            }
        }
    }
    st = zr_dev_status(rc, "matmul", dev);
done:
    zr_tensor_release(A.t);
    zr_tensor_release(B.t);
    return st;
#else
    (void)out, (void)a, (void)b, (void)bn, (void)bshape, (void)nbatch, (void)m, (void)n, (void)k;
    return zr_no_cuda("matmul");
#endif
}

/* The product of a (..., m, k) and b (..., k, n), both >= 2-D with matching k and broadcastable
 * batch dims (checked by the caller), as a new contiguous tensor of dtype dt. No autograd. */
static zr_tensor *mm_raw(zr_tensor *a, zr_tensor *b, zr_dtype dt) {
    int an = a->ndim, bnd = b->ndim;
    int64_t m = a->shape[an - 2], k = a->shape[an - 1], n = b->shape[bnd - 1];
    int bn = (an > bnd ? an : bnd) - 2;
    int64_t shape[ZR_MAX_DIMS], nbatch = 1;
    for (int i = 0; i < bn; i++) {
        int ia = i - (bn - (an - 2)), ib = i - (bn - (bnd - 2));
        int64_t sa = ia >= 0 ? a->shape[ia] : 1, sb = ib >= 0 ? b->shape[ib] : 1;
        shape[i] = sa == 1 ? sb : sa;
        nbatch *= shape[i];
    }
    shape[bn] = m;
    shape[bn + 1] = n;
    zr_tensor *out = zr_tensor_new_cat(dt, zr_tensor_device(a), bn + 2, shape, ZR_MEM_ACTIVATIONS, 0);
    if (!out) return NULL;
    if (zr_tensor_numel(out) == 0) return out;
    if (k == 0) {
        if (zr_tensor_fill_(out, 0)) goto fail;
        return out;
    }
    if (!zr_is_cpu(out)) {
        if (mm_dev(out, a, b, bn, shape, nbatch, m, n, k)) goto fail;
        return out;
    }
    zr_dtype ct = zr_cpu_compute_dtype(dt);
    gemm_operand A, B;
    if (operand_prepare(a, ct, &A)) goto fail;
    if (operand_prepare(b, ct, &B)) {
        zr_tensor_release(A.t);
        goto fail;
    }
    zr_tensor *o = zr_cpu_out_begin(out, ct);
    if (!o) {
        zr_tensor_release(A.t);
        zr_tensor_release(B.t);
        goto fail;
    }
    size_t es = ct == ZR_F64 ? sizeof(double) : sizeof(float);
    char *ap = zr_tensor_data(A.t), *bp = zr_tensor_data(B.t), *cp = zr_tensor_data(o);
    int64_t as[ZR_MAX_DIMS], bs[ZR_MAX_DIMS];
    batch_strides(A.t, bn, shape, as);
    batch_strides(B.t, bn, shape, bs);
    /* Fold (batch..., m) into one row dim when b has no batch of its own and a's rows are evenly
     * spaced across batches: one large GEMM instead of nbatch small ones. */
    int fold = !A.trans && nbatch > 1;
    int64_t expect = m * A.ld;
    for (int i = bn - 1; i >= 0 && fold; i--) {
        if (bs[i] != 0) fold = 0;
        if (shape[i] == 1) continue;
        if (as[i] != expect) fold = 0;
        expect *= shape[i];
    }
    if (fold || nbatch == 1) {
        ZR_CPU_CALL(ct, gemm_cpu, A.trans, B.trans, m * nbatch, n, k, 1.0, (void *)ap, A.ld,
                    (void *)bp, B.ld, 0.0, (void *)cp, n);
    } else {
        int64_t idx[ZR_MAX_DIMS] = {0};
        for (int64_t q = 0; q < nbatch; q++) {
            int64_t ao = 0, bo = 0;
            for (int i = 0; i < bn; i++) {
                ao += idx[i] * as[i];
                bo += idx[i] * bs[i];
            }
            ZR_CPU_CALL(ct, gemm_cpu, A.trans, B.trans, m, n, k, 1.0, (void *)(ap + ao * (int64_t)es),
                        A.ld, (void *)(bp + bo * (int64_t)es), B.ld, 0.0,
                        (void *)(cp + q * m * n * (int64_t)es), n);
            for (int i = bn - 1; i >= 0; i--) { /* next batch index, row-major */
                if (++idx[i] < shape[i]) break;
                idx[i] = 0;
            }
        }
    }
    zr_tensor_release(A.t);
    zr_tensor_release(B.t);
    if (zr_cpu_out_end(out, o)) goto fail;
    return out;
fail:
    zr_tensor_release(out);
    return NULL;
}

/* A raw 2-D view of a 1-D t with a unit dim added in front ((1,k): a row) or at the end ((k,1));
 * used to treat a 1-D operand as a row or column vector. */
static zr_tensor *insert_unit_dim(zr_tensor *t, int at_end) {
    int64_t sh[2], st[2];
    int64_t s = t->ndim ? t->stride[0] : 1, len = t->ndim ? t->shape[0] : 1;
    if (at_end) {
        sh[0] = len, sh[1] = 1, st[0] = s, st[1] = 1;
    } else {
        sh[0] = 1, sh[1] = len, st[0] = len * s, st[1] = s;
    }
    return zr_tensor_as_strided(t, 2, sh, st, t->offset);
}

/* Reduces a product-shaped gradient g (owned) to edge i's shape (summing broadcast batch dims,
 * dropping the unit dim of a 1-D operand) and dtype, and stores it in gin[i]. */
static zr_status finish_grad(zr_node *n, int i, zr_tensor *g, int ndim2, const int64_t *shape2,
                             zr_tensor **gin) {
    if (!g) return ZR_ERR;
    zr_edge *e = &n->edges[i];
    zr_tensor *r = zr_sum_to_shape(g, ndim2, shape2);
    zr_tensor_release(g);
    if (!r) return ZR_ERR;
    if (e->ndim != ndim2) {
        zr_tensor *c = zr_tensor_contiguous_raw(r);
        zr_tensor *v = c ? zr_tensor_view_raw(c, e->ndim, e->shape) : NULL;
        zr_tensor_release(c);
        zr_tensor_release(r);
        if (!v) return ZR_ERR;
        r = v;
    }
    gin[i] = zr_take_as(r, e->dtype);
    return gin[i] ? ZR_OK : ZR_ERR;
}

/* Views of the saved operands and of g with the 1-D operands' unit dims restored. */
typedef struct {
    zr_tensor *a, *b, *g;
} mm_views;

static void mm_views_release(mm_views *v) {
    zr_tensor_release(v->a);
    zr_tensor_release(v->b);
    zr_tensor_release(v->g);
}

static zr_status matmul_backward(zr_node *n, zr_tensor *g, zr_tensor **gin) {
    zr_tensor *a = n->saved[0], *b = n->saved[1];
    mm_views v = {0};
    zr_status st = ZR_ERR;
    v.a = a->ndim == 1 ? insert_unit_dim(a, 0) : zr_tensor_retain(a);
    v.b = b->ndim == 1 ? insert_unit_dim(b, 1) : zr_tensor_retain(b);
    if (!v.a || !v.b) goto done;
    if (a->ndim == 1 || b->ndim == 1) {
        int an = v.a->ndim, bn = v.b->ndim, nd = an > bn ? an : bn;
        int64_t sh[ZR_MAX_DIMS];
        for (int i = 0; i < nd - 2; i++) sh[i] = g->shape[i];
        sh[nd - 2] = v.a->shape[an - 2];
        sh[nd - 1] = v.b->shape[bn - 1];
        zr_tensor *gc = zr_tensor_contiguous_raw(g);
        v.g = gc ? zr_tensor_view_raw(gc, nd, sh) : NULL;
        zr_tensor_release(gc);
    } else
        v.g = zr_tensor_retain(g);
    if (!v.g) goto done;
    if (zr_node_needs_grad(n, 0)) { /* dA = g · Bᵀ */
        zr_tensor *bt = zr_tensor_transpose_raw(v.b, -1, -2);
        zr_tensor *ga = bt ? mm_raw(v.g, bt, zr_promote(v.g->dtype, b->dtype)) : NULL;
        zr_tensor_release(bt);
        if (finish_grad(n, 0, ga, v.a->ndim, v.a->shape, gin)) goto done;
    }
    if (zr_node_needs_grad(n, 1)) { /* dB = Aᵀ · g */
        zr_dtype dt = zr_promote(v.g->dtype, a->dtype);
        zr_tensor *gb = NULL;
        if (v.b->ndim == 2 && v.a->ndim > 2) {
            /* b was shared by every batch: fold the batch into the rows, one GEMM of
             * (k, B*m) x (B*m, n) instead of B products summed afterwards. */
            int64_t ka = v.a->shape[v.a->ndim - 1], nn = v.g->shape[v.g->ndim - 1];
            zr_tensor *ac = zr_tensor_contiguous_raw(v.a), *gc = zr_tensor_contiguous_raw(v.g);
            zr_tensor *af = ac ? zr_tensor_view_raw(ac, 2, (int64_t[]){-1, ka}) : NULL;
            zr_tensor *gf = gc ? zr_tensor_view_raw(gc, 2, (int64_t[]){-1, nn}) : NULL;
            zr_tensor *at = af ? zr_tensor_transpose_raw(af, 0, 1) : NULL;
            gb = at && gf ? mm_raw(at, gf, dt) : NULL;
            zr_tensor_release(ac);
            zr_tensor_release(gc);
            zr_tensor_release(af);
            zr_tensor_release(gf);
            zr_tensor_release(at);
        } else {
            zr_tensor *at = zr_tensor_transpose_raw(v.a, -1, -2);
            gb = at ? mm_raw(at, v.g, dt) : NULL;
            zr_tensor_release(at);
        }
        if (finish_grad(n, 1, gb, v.b->ndim, v.b->shape, gin)) goto done;
    }
    st = ZR_OK;
done:
    mm_views_release(&v);
    return st;
}

/* Shared checks of matmul-like ops; a2/b2 are the >= 2-D forms of a and b. */
static zr_status check_operands(const char *op, zr_tensor *a, zr_tensor *b, zr_tensor *a2,
                                zr_tensor *b2) {
    char b1[128], b2s[128];
    int an = a2->ndim, bn = b2->ndim;
    if (a2->shape[an - 1] != b2->shape[bn - 2])
        return zr_error("%s: shapes %s and %s do not match: %lld ≠ %lld", op,
                        zr_tensor_shape_str(a, b1), zr_tensor_shape_str(b, b2s),
                        (long long)a2->shape[an - 1], (long long)b2->shape[bn - 2]);
    int nb = (an > bn ? an : bn) - 2;
    for (int i = 0; i < nb; i++) {
        int ia = i - (nb - (an - 2)), ib = i - (nb - (bn - 2));
        int64_t sa = ia >= 0 ? a2->shape[ia] : 1, sb = ib >= 0 ? b2->shape[ib] : 1;
        if (sa != sb && sa != 1 && sb != 1)
            return zr_error("%s: batch dims of %s and %s cannot be broadcast (%lld vs %lld)", op,
                            zr_tensor_shape_str(a, b1), zr_tensor_shape_str(b, b2s),
                            (long long)sa, (long long)sb);
    }
    return ZR_OK;
}

static zr_tensor *matmul_impl(const char *op, zr_tensor *a, zr_tensor *b) {
    if (!a || !b) return zr_error_null("%s: missing operand", op);
    if (zr_check_float(op, a) || zr_check_float(op, b)) return NULL;
    if (zr_check_same_device(op, 2, (zr_tensor *[]){a, b})) return NULL;
    if (a->ndim == 0 || b->ndim == 0)
        return zr_error_null("%s: both operands need at least 1 dim, got %d-dim and %d-dim", op,
                             a->ndim, b->ndim);
    zr_tensor *a2 = a->ndim == 1 ? insert_unit_dim(a, 0) : zr_tensor_retain(a);
    zr_tensor *b2 = b->ndim == 1 ? insert_unit_dim(b, 1) : zr_tensor_retain(b);
    zr_tensor *out = NULL;
    if (!a2 || !b2 || check_operands(op, a, b, a2, b2)) goto fail;
    out = mm_raw(a2, b2, zr_promote(a->dtype, b->dtype));
    if (!out) goto fail;
    if (a->ndim == 1 || b->ndim == 1) { /* drop the unit dims of 1-D operands */
        int64_t sh[ZR_MAX_DIMS];
        int nd = 0;
        for (int i = 0; i < out->ndim - 2; i++) sh[nd++] = out->shape[i];
        if (a->ndim != 1) sh[nd++] = out->shape[out->ndim - 2];
        if (b->ndim != 1) sh[nd++] = out->shape[out->ndim - 1];
        zr_tensor *v = zr_tensor_view_raw(out, nd, sh);
        zr_tensor_release(out);
        if (!(out = v)) goto fail;
    }
    zr_node *n;
    if (zr_autograd_record(out, op, matmul_backward, 2, (zr_tensor *[]){a, b}, &n)) goto fail;
    if (n && (zr_node_save(n, a) || zr_node_save(n, b))) goto fail;
    zr_tensor_release(a2);
    zr_tensor_release(b2);
    return out;
fail:
    zr_tensor_release(a2);
    zr_tensor_release(b2);
    zr_tensor_release(out);
    return NULL;
}

zr_tensor *zr_matmul(zr_tensor *a, zr_tensor *b) { return matmul_impl("matmul", a, b); }

zr_tensor *zr_bmm(zr_tensor *a, zr_tensor *b) {
    char b1[128], b2[128];
    if (!a || !b) return zr_error_null("bmm: missing operand");
    if (a->ndim != 3 || b->ndim != 3 || a->shape[0] != b->shape[0])
        return zr_error_null("bmm: expected (B,m,k) and (B,k,n) with the same B, got %s and %s",
                             zr_tensor_shape_str(a, b1), zr_tensor_shape_str(b, b2));
    return matmul_impl("bmm", a, b);
}

/* --- linear (y = x · wᵀ + b, w stored (out, in)) and conv1d (Hugging Face's Conv1D: y = x · w + b,
 * w stored (in, out)) share one implementation over wv, w seen as (out, in): w itself, or conv1d's
 * transposed view (never copied). The node's edge and saved[1] are w as given, with n->i[0] = 1
 * for conv1d, so dW is made in w's own layout and can go straight into w's existing gradient. --- */

zr_tensor *zr_weight_out_in(zr_tensor *w, int in_out) {
    return in_out && w->ndim == 2 ? zr_tensor_transpose_raw(w, 0, 1) : zr_tensor_retain(w);
}

/* The forward on a GPU: x and b converted to the result dtype dt (contiguous), the weight read in
 * place where GEMM can (row- or column-major with any leading dimension: Conv1D's (in, out), its
 * column slices), then one cuBLASLt call with the bias in its epilogue. */
static zr_status linear_forward_dev(const char *op, zr_tensor *out, zr_tensor *x, zr_tensor *wv, zr_tensor *b,
                                    int64_t rows, int64_t in, int64_t nout) {
#ifdef ZR_HAVE_CUDA
    zr_dtype dt = out->dtype;
    zr_device dev = zr_tensor_device(out);
    zr_tensor *xi = zr_tensor_to_raw(x, dt, dev), *wt = xi ? zr_tensor_transpose_raw(wv, 0, 1) : NULL;
    zr_tensor *bi = wt && b ? zr_tensor_to_raw(b, dt, dev) : NULL;
    gemm_operand W = {0};
    zr_status st = ZR_ERR;
    if (wt && (!b || bi) && !operand_prepare(wt, dt, &W)) { /* y (rows, out) = x (rows, in) · wᵀ (in, out) */
        zr_gemm_desc g = {0};
        g.ta = 0, g.tb = W.trans, g.m = rows, g.n = nout, g.k = in;
        g.a = zr_tensor_data(xi), g.lda = in > 1 ? in : 1, g.b = zr_tensor_data(W.t), g.ldb = W.ld;
        g.c = zr_tensor_data(out), g.ldc = nout > 1 ? nout : 1, g.batch = 1, g.bias = bi ? zr_tensor_data(bi) : NULL;
        g.alpha = 1, g.beta = 0, g.ab_dtype = dt, g.c_dtype = dt;
        st = zr_dev_status(gemm_ex_cuda(&g, zr_cuda_stream(dev)), op, dev);
    }
    zr_tensor_release(W.t);
    zr_tensor_release(xi);
    zr_tensor_release(wt);
    zr_tensor_release(bi);
    return st;
#else
    (void)op, (void)out, (void)x, (void)wv, (void)b, (void)rows, (void)in, (void)nout;
    return zr_no_cuda(op);
#endif
}

/* The backward on a GPU, in the promoted dtype of g, x and w; results cast to each input's dtype.
 * Only the operands a requested gradient needs are converted; the weight is read in place as in
 * the forward. */
static zr_status linear_backward_dev(zr_node *n, zr_tensor *g, zr_tensor *x, zr_tensor *w, int in_out, int64_t rows,
                                     int64_t in, int64_t out, zr_tensor **gin) {
#ifdef ZR_HAVE_CUDA
    zr_dtype dt = zr_promote(g->dtype, zr_promote(x->dtype, w->dtype));
    zr_device dev = zr_tensor_device(g);
    int64_t ldi = in > 1 ? in : 1, ldo = out > 1 ? out : 1;
    int need[3] = {zr_node_needs_grad(n, 0), zr_node_needs_grad(n, 1), zr_node_needs_grad(n, 2)};
    zr_tensor *gi = zr_tensor_to_raw(g, dt, dev), *xi = NULL, *wv = NULL, *d[3] = {NULL, NULL, NULL};
    gemm_operand W = {0};
    zr_status st = ZR_ERR;
    if (!gi || (need[1] && !(xi = zr_tensor_to_raw(x, dt, dev))) ||
        (need[0] && (!(wv = zr_weight_out_in(w, in_out)) || operand_prepare(wv, dt, &W))))
        goto done;
    if (need[0]) { /* dX (rows, in) = g (rows, out) · wv (out, in) */
        /* straight into the producer's pending gradient: a GEMM with beta 1 adds it when other
         * consumers' gradients are there already (GPT-2's three c_attn products), no add pass */
        zr_tensor *buf = NULL;
        int state = ZR_GRADBUF_NEW;
        if (n->edges[0].fn && n->edges[0].dtype == dt && zr_node_input_grad_buffer(n, 0, NULL, NULL, &buf, &state))
            goto done;
        zr_edge *e = &n->edges[0];
        if (!buf && !(buf = d[0] = zr_tensor_new_cat(dt, dev, e->ndim, e->shape, ZR_MEM_ACTIVATIONS, 0))) goto done;
        zr_gemm_desc gd = {0};
        gd.ta = 0, gd.tb = W.trans, gd.m = rows, gd.n = in, gd.k = out;
        gd.a = zr_tensor_data(gi), gd.lda = ldo, gd.b = zr_tensor_data(W.t), gd.ldb = W.ld;
        gd.c = zr_tensor_data(buf), gd.ldc = ldi, gd.batch = 1, gd.alpha = 1;
        gd.beta = state == ZR_GRADBUF_SHARED ? 1 : 0, gd.ab_dtype = dt, gd.c_dtype = dt;
        if (zr_dev_status(gemm_ex_cuda(&gd, zr_cuda_stream(dev)), "linear backward (dX)", dev)) goto done;
    }
    if (need[1]) {
        /* dW straight into an existing gradient (e.g. the ZeRO engine's fp32 partition): one GEMM
         * with beta 1 (0 for a stale gradient the engine's zero_grad left: overwritten) and an fp32
         * output instead of a 16-bit dW plus an accumulation pass. The algorithm stays cuBLASLt's
         * (autotuned, runtime/cuda/blas_plan.c): a small dW over many rows (GPT-2's 768 x 768 over
         * 65536) has too few output tiles to fill the GPU, so it splits k; a 16-bit output then
         * needs a separate reduction of fp32 partials (splitKreduce), an fp32 one may take the
         * in-place reduction scheme instead. */
        zr_tensor *lg = zr_node_leaf_grad(n, 1), *leaf = n->edges[1].leaf;
        int direct = lg && (lg->dtype == ZR_F32 || lg->dtype == dt) && (dt == ZR_BF16 || dt == ZR_F16 || dt == ZR_F32);
        if (!direct && !(d[1] = zr_tensor_new_cat(dt, dev, 2, w->shape, ZR_MEM_ACTIVATIONS, 0))) goto done;
        zr_gemm_desc gd = {0};
        if (in_out) { /* dW (in, out) = xᵀ (in, rows) · g (rows, out) */
            gd.m = in, gd.n = out, gd.a = zr_tensor_data(xi), gd.lda = ldi, gd.b = zr_tensor_data(gi), gd.ldb = ldo;
            gd.ldc = ldo;
        } else { /* dW (out, in) = gᵀ (out, rows) · x (rows, in) */
            gd.m = out, gd.n = in, gd.a = zr_tensor_data(gi), gd.lda = ldo, gd.b = zr_tensor_data(xi), gd.ldb = ldi;
            gd.ldc = ldi;
        }
        gd.ta = 1, gd.tb = 0, gd.k = rows, gd.batch = 1, gd.alpha = 1, gd.ab_dtype = dt;
        gd.c = zr_tensor_data(direct ? lg : d[1]), gd.c_dtype = direct ? lg->dtype : dt;
        gd.beta = direct && !leaf->grad_stale ? 1 : 0;
        if (zr_dev_status(gemm_ex_cuda(&gd, zr_cuda_stream(dev)), "linear backward (dW)", dev)) goto done;
        if (direct) leaf->grad_stale = 0; /* d[1] NULL: the leaf counts as done, its hook fires */
    }
    if (need[2]) { /* db (out) = column sums of g */
        if (!(d[2] = zr_tensor_new_cat(dt, dev, 1, &out, ZR_MEM_ACTIVATIONS, 0)) ||
            zr_dev_status(linear_bias_grad_cuda(zr_tensor_data(d[2]), zr_tensor_data(gi), rows, out, dt, zr_cuda_stream(dev)),
                          "linear backward (db)", dev))
            goto done;
    }
    if (zr_give_grads(n, 3, d, gin)) goto done;
    st = ZR_OK;
done:
    for (int i = 0; i < 3; i++) zr_tensor_release(d[i]);
    zr_tensor_release(gi);
    zr_tensor_release(xi);
    zr_tensor_release(wv);
    zr_tensor_release(W.t);
    return st;
#else
    (void)n, (void)g, (void)x, (void)w, (void)in_out, (void)rows, (void)in, (void)out, (void)gin;
    return zr_no_cuda("linear");
#endif
}

/* saved[0] = x, saved[1] = w; edges x, w, b; n->i[0] = 1 when w is stored (in, out) (conv1d). */
zr_status zr_linear_backward(zr_node *n, zr_tensor *g, zr_tensor **gin) {
    zr_tensor *x = n->saved[0], *w = n->saved[1];
    int in_out = n->i[0] != 0;
    int64_t in = w->shape[in_out ? 0 : 1], out = w->shape[in_out ? 1 : 0], rows = in ? zr_tensor_numel(x) / in : 0;
    if (in == 0) rows = zr_tensor_numel(g) / (out ? out : 1);
    if (!zr_is_cpu(g)) return linear_backward_dev(n, g, x, w, in_out, rows, in, out, gin);
    zr_dtype ct = zr_cpu_compute_dtype(zr_promote(g->dtype, zr_promote(x->dtype, w->dtype)));
    zr_device dev = zr_tensor_device(g);
    int64_t ldi = in > 1 ? in : 1, ldo = out > 1 ? out : 1;
    zr_tensor *gi = zr_cpu_in(g, ct), *xi = NULL, *r = NULL, *wv = NULL;
    gemm_operand W = {0};
    zr_status st = ZR_ERR;
    if (!gi) goto done;
    if (zr_node_needs_grad(n, 0)) { /* dx (rows, in) = g (rows, out) · w as (out, in) */
        if (!(wv = zr_weight_out_in(w, in_out)) || operand_prepare(wv, ct, &W)) goto done;
        zr_edge *e = &n->edges[0];
        r = zr_tensor_new_cat(ct, dev, e->ndim, e->shape, ZR_MEM_ACTIVATIONS, 0);
        if (!r) goto done;
        ZR_CPU_CALL(ct, gemm_cpu, 0, W.trans, rows, in, out, 1.0, zr_tensor_data(gi), out,
                    zr_tensor_data(W.t), W.ld, 0.0, zr_tensor_data(r), in);
        if (!(gin[0] = zr_take_as(r, e->dtype))) goto done;
        r = NULL;
    }
    if (zr_node_needs_grad(n, 1)) { /* dW in w's layout: (out, in) = gᵀ · x, or (in, out) = xᵀ · g */
        if (!(xi = zr_cpu_in(x, ct))) goto done;
        r = zr_tensor_new_cat(ct, dev, 2, w->shape, ZR_MEM_ACTIVATIONS, 0);
        if (!r) goto done;
        if (in_out)
            ZR_CPU_CALL(ct, gemm_cpu, 1, 0, in, out, rows, 1.0, zr_tensor_data(xi), ldi, zr_tensor_data(gi), ldo,
                        0.0, zr_tensor_data(r), ldo);
        else
            ZR_CPU_CALL(ct, gemm_cpu, 1, 0, out, in, rows, 1.0, zr_tensor_data(gi), out, zr_tensor_data(xi), ldi,
                        0.0, zr_tensor_data(r), ldi);
        if (!(gin[1] = zr_take_as(r, n->edges[1].dtype))) goto done;
        r = NULL;
    }
    if (zr_node_needs_grad(n, 2)) { /* db (out) = column sums of g */
        r = zr_tensor_new_cat(ct, dev, 1, &out, ZR_MEM_ACTIVATIONS, 0);
        if (!r) goto done;
        ZR_CPU_CALL(ct, sum_cols_cpu, zr_tensor_data(r), zr_tensor_data(gi), rows, out);
        if (!(gin[2] = zr_take_as(r, n->edges[2].dtype))) goto done;
        r = NULL;
    }
    st = ZR_OK;
done:
    zr_tensor_release(r);
    zr_tensor_release(gi);
    zr_tensor_release(xi);
    zr_tensor_release(wv);
    zr_tensor_release(W.t);
    return st;
}

/* linear (in_out 0) or conv1d (in_out 1); op names it in errors and on the tape. */
static zr_tensor *linear_impl(const char *op, zr_tensor *x, zr_tensor *w, zr_tensor *b, int in_out) {
    char b1[128], b2[128];
    if (!x || !w) return zr_error_null("%s: missing input or weight", op);
    if (zr_check_float(op, x) || zr_check_float(op, w) || (b && zr_check_float(op, b))) return NULL;
    if (zr_check_same_device(op, 3, (zr_tensor *[]){x, w, b})) return NULL;
    if (w->ndim != 2)
        return zr_error_null("%s: weight must be 2-D %s, got %s", op,
                             in_out ? "(in_features, out_features)" : "(out_features, in_features)",
                             zr_tensor_shape_str(w, b1));
    int64_t in = w->shape[in_out ? 0 : 1], nout = w->shape[in_out ? 1 : 0];
    if (x->ndim == 0 || x->shape[x->ndim - 1] != in)
        return zr_error_null("%s: input %s and weight %s do not match: %lld ≠ %lld", op, zr_tensor_shape_str(x, b1),
                             zr_tensor_shape_str(w, b2), x->ndim ? (long long)x->shape[x->ndim - 1] : 0LL,
                             (long long)in);
    if (b && (b->ndim != 1 || b->shape[0] != nout))
        return zr_error_null("%s: bias must have shape (%lld) to match weight %s, got %s", op, (long long)nout,
                             zr_tensor_shape_str(w, b1), zr_tensor_shape_str(b, b2));
    zr_dtype dt = zr_promote(x->dtype, w->dtype);
    if (b) dt = zr_promote(dt, b->dtype);
    zr_dtype ct = zr_cpu_compute_dtype(dt);
    int64_t rows = in ? zr_tensor_numel(x) / in : 1;
    int64_t shape[ZR_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    shape[x->ndim - 1] = nout;
    if (in == 0)
        for (int i = 0; i < x->ndim - 1; i++) rows *= x->shape[i];
    zr_tensor *out = zr_tensor_new_cat(dt, zr_tensor_device(x), x->ndim, shape, ZR_MEM_ACTIVATIONS, 0);
    zr_tensor *xi = NULL, *bi = NULL, *o = NULL, *wv = NULL, *wt = NULL;
    gemm_operand W = {0};
    if (!out || !(wv = zr_weight_out_in(w, in_out))) goto fail;
    if (!zr_is_cpu(x)) {
        if (linear_forward_dev(op, out, x, wv, b, rows, in, nout)) goto fail;
        goto record;
    }
    /* GEMM reads wᵀ (in, out) in place: a row-major w becomes a transposition flag. */
    if (!(xi = zr_cpu_in(x, ct)) || !(wt = zr_tensor_transpose_raw(wv, 0, 1)) ||
        operand_prepare(wt, ct, &W) || !(o = zr_cpu_out_begin(out, ct)))
        goto fail;
    if (b) {
        if (!(bi = zr_cpu_in(b, ct))) goto fail;
        ZR_CPU_CALL(ct, fill_rows_cpu, zr_tensor_data(o), zr_tensor_data(bi), rows, nout);
    }
    ZR_CPU_CALL(ct, gemm_cpu, 0, W.trans, rows, nout, in, 1.0, zr_tensor_data(xi), in > 1 ? in : 1,
                zr_tensor_data(W.t), W.ld, b ? 1.0 : 0.0, zr_tensor_data(o), nout);
    zr_status st = zr_cpu_out_end(out, o);
    o = NULL;
    if (st) goto fail;
record:;
    zr_node *n;
    if (zr_autograd_record(out, op, zr_linear_backward, 3, (zr_tensor *[]){x, w, b}, &n)) goto fail;
    if (n) {
        n->i[0] = in_out;
        if (zr_node_save(n, x) || zr_node_save(n, w)) goto fail;
    }
    zr_tensor_release(wv);
    zr_tensor_release(xi);
    zr_tensor_release(bi);
    zr_tensor_release(wt);
    zr_tensor_release(W.t);
    return out;
fail:
    zr_tensor_release(o);
    zr_tensor_release(wv);
    zr_tensor_release(xi);
    zr_tensor_release(bi);
    zr_tensor_release(wt);
    zr_tensor_release(W.t);
    zr_tensor_release(out);
    return NULL;
}

zr_tensor *zr_linear(zr_tensor *x, zr_tensor *w, zr_tensor *b) { return linear_impl("linear", x, w, b, 0); }

zr_tensor *zr_conv1d(zr_tensor *x, zr_tensor *w, zr_tensor *b) { return linear_impl("conv1d", x, w, b, 1); }
