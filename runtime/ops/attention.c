/* Causal grouped-query attention: forward and backward side by side (see ops/attention.h).
 * CPU: bf16/f16 are widened to f32 and narrowed back. CUDA: bf16/f16 with head_dim 64, 128 or 256 run
 * the flash kernel (kernels/cuda/attention.h: no T×T tensor), a multiple of 8 between 64 and 128 the 128
 * kernels (in place on Hopper at a multiple of 16, else over zero-padded copies: sdpa_padded); every
 * other case (f32, other head
 * dims) runs a plain f32 composition of differentiable CUDA ops (matmul, masked softmax,
 * matmul) that materialises the (B, Hq, T, T) scores: correct and exact in f32, not fast. f64 on
 * CUDA is an error. zr_sdpa_packed (a packed (B, T, 3C) projection) and zr_qkv_rope_sdpa (the same
 * with Llama's rope folded in) sit at the end. Packed sequences (seg) run on the CPU kernels, the
 * flash ones (bf16/f16, head_dim 64, 128, 256 or padded between 64 and 128; zr_sdpa_segments_ok says which run) and, in
 * zr_sdpa_causal, the composition (masked by them); the packed ops' other CUDA paths refuse them. */
#include "ops/attention.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include "ops/compare.h"
#include "ops/elementwise.h"
#include "ops/matmul.h"
#include "ops/qkv_rope.h"
#include "ops/softmax.h"
#include "ops/util.h"
#include "ops/view.h"

/* The seg a node saved at slot i (after its other tensors), or NULL: plain causal attention. */
static const int32_t *saved_seg(const zr_node *n, int i) {
    return n->n_saved > i && n->saved[i] ? (const int32_t *)zr_tensor_data(n->saved[i]) : NULL;
}

/* saved: q, k, v, out (input dtypes), lse (B, Hq, T) in the compute dtype, then seg when the batch
 * holds packed sequences; f[0] = scale */
static zr_status sdpa_backward(zr_node *n, zr_tensor *g, zr_tensor **gin) {
    zr_tensor *lse = n->saved[4];
    zr_dtype ct = lse->dtype;
    zr_device dev = zr_tensor_device(lse);
    const int64_t *qs = n->edges[0].shape, *ks = n->edges[1].shape;
    int64_t B = qs[0], Hq = qs[1], T = qs[2], Dh = qs[3], Hkv = ks[1];
    zr_tensor *in[5] = {NULL}, *d[3] = {NULL}, *wk = NULL, *wv = NULL;
    zr_status st = ZR_ERR;
    for (int i = 0; i < 4; i++)
        if (!(in[i] = zr_cpu_in(n->saved[i], ct))) goto done;
    if (!(in[4] = zr_cpu_in(g, ct))) goto done;
    d[0] = zr_tensor_new_cat(ct, dev, 4, qs, ZR_MEM_ACTIVATIONS, 0);
    d[1] = zr_tensor_new_cat(ct, dev, 4, ks, ZR_MEM_ACTIVATIONS, 0);
    d[2] = zr_tensor_new_cat(ct, dev, 4, ks, ZR_MEM_ACTIVATIONS, 0);
    if (!d[0] || !d[1] || !d[2]) goto done;
    if (Hq != Hkv) {
        wk = zr_tensor_new_cat(ct, dev, 4, qs, ZR_MEM_WORKSPACE, 0);
        wv = zr_tensor_new_cat(ct, dev, 4, qs, ZR_MEM_WORKSPACE, 0);
        if (!wk || !wv) goto done;
    }
    ZR_CPU_CALL(ct, sdpa_causal_backward_cpu, zr_tensor_data(d[0]), zr_tensor_data(d[1]),
                zr_tensor_data(d[2]), wk ? zr_tensor_data(wk) : NULL, wv ? zr_tensor_data(wv) : NULL,
                zr_tensor_data(in[4]), zr_tensor_data(in[0]), zr_tensor_data(in[1]),
                zr_tensor_data(in[2]), zr_tensor_data(in[3]), zr_tensor_data(lse), saved_seg(n, 5), B, Hq,
                Hkv, T, Dh, n->f[0]);
    if (zr_give_grads(n, 3, d, gin)) goto done;
    st = ZR_OK;
done:
    for (int i = 0; i < 5; i++) zr_tensor_release(in[i]);
    for (int i = 0; i < 3; i++) zr_tensor_release(d[i]);
    zr_tensor_release(wk);
    zr_tensor_release(wv);
    return st;
}

static zr_status check_args(zr_tensor *q, zr_tensor *k, zr_tensor *v) {
    char b1[128], b2[128], b3[128];
    if (zr_check_float("sdpa", q) || zr_check_float("sdpa", k) || zr_check_float("sdpa", v)) return ZR_ERR;
    if (zr_check_same_device("sdpa", 3, (zr_tensor *[]){q, k, v})) return ZR_ERR;
    if (q->ndim != 4 || k->ndim != 4 || v->ndim != 4)
        return zr_error("sdpa: q, k, v must be (B, heads, T, head_dim), got q %s, k %s, v %s",
                        zr_tensor_shape_str(q, b1), zr_tensor_shape_str(k, b2), zr_tensor_shape_str(v, b3));
    if (!zr_tensor_same_shape(k, v))
        return zr_error("sdpa: k %s and v %s must have the same shape", zr_tensor_shape_str(k, b1),
                        zr_tensor_shape_str(v, b2));
    if (k->shape[0] != q->shape[0] || k->shape[2] != q->shape[2] || k->shape[3] != q->shape[3])
        return zr_error("sdpa: q %s and k %s must agree in batch, T and head_dim (dims 1, 3, 4)",
                        zr_tensor_shape_str(q, b1), zr_tensor_shape_str(k, b2));
    if (k->shape[1] == 0 || q->shape[1] % k->shape[1])
        return zr_error("sdpa: q has %lld heads, not a multiple of k's %lld", (long long)q->shape[1],
                        (long long)k->shape[1]);
    if (!zr_is_cpu(q) && (q->dtype == ZR_F64 || k->dtype == ZR_F64 || v->dtype == ZR_F64))
        return zr_error("sdpa on cuda: f64 is not supported (use f32, bf16 or f16)");
    return ZR_OK;
}

/* Whether lo (B, T) then hi (B, T) give each row one causal mask that the kernels read both ways:
 * query t sees keys lo[t] .. t (the forward's and the CPU's reading), key j is seen by queries
 * j .. hi[j] - 1 (the CUDA backward's); so 0 <= lo[t] <= t, lo never decreases along a row (a query
 * tile's first row has the tile's earliest key), and hi[j] is one past the last query whose lo is at
 * or before j (it never decreases either). Packed sequences (lo, hi: the bounds of each token's
 * sequence) and a sliding window over them (zr_sdpa_window_segments) are such masks. */
static zr_status seg_mask_ok(const char *op, const int32_t *lo, int64_t B, int64_t T) {
    const int32_t *hi = lo + B * T;
    for (int64_t b = 0; b < B; b++) {
        const int32_t *l = lo + b * T, *h = hi + b * T;
        for (int64_t j = 0; j < T; j++)
            if (l[j] < 0 || l[j] > j || (j > 0 && l[j] < l[j - 1]))
                return zr_error("%s: segments of row %lld, token %lld (0-based): lo %d (expected 0 <= lo <= t and never "
                                "below the token before's: the first key each query sees, as packed sequences or "
                                "zr.sdpa_window_segments give it)",
                                op, (long long)b, (long long)j, (int)l[j]);
        int64_t q = 0; /* one past the last query whose lo <= j */
        for (int64_t j = 0; j < T; j++) {
            while (q < T && l[q] <= j) q++;
            if (h[j] != q)
                return zr_error("%s: segments of row %lld, token %lld (0-based): hi %d, but the queries that see this key "
                                "end at %lld (hi: one past the last query whose lo is at or before the token, e.g. the "
                                "end of its sequence; lo %d)",
                                op, (long long)b, (long long)j, (int)h[j], (long long)q, (int)l[j]);
        }
    }
    return ZR_OK;
}

/* seg for an attention over x's B rows of T tokens: i32 (2, B, T), contiguous, on x's device; on
 * the CPU its values too (seg_mask_ok). On a GPU they are not read back. */
static zr_status check_seg(const char *op, const zr_tensor *seg, const zr_tensor *x, int64_t B, int64_t T) {
    char b1[128], d1[16], d2[16];
    if (seg->dtype != ZR_I32)
        return zr_error("%s: segments must be i32 (2, B, T), lo then hi of each token's sequence; got %s", op,
                        zr_dtype_name(seg->dtype));
    if (seg->ndim != 3 || seg->shape[0] != 2 || seg->shape[1] != B || seg->shape[2] != T)
        return zr_error("%s: segments must be (2, B, T) = (2, %lld, %lld), lo then hi of each token's sequence; got %s",
                        op, (long long)B, (long long)T, zr_tensor_shape_str(seg, b1));
    if (!zr_tensor_is_contiguous(seg))
        return zr_error("%s: segments must be a contiguous (2, B, T) tensor, got a strided view (use :contiguous())", op);
    if (!zr_device_eq(zr_tensor_device(seg), zr_tensor_device(x)))
        return zr_error("%s: segments are on %s but the attention's inputs on %s; move them there with :to()", op,
                        zr_device_name(zr_tensor_device(seg), d1), zr_device_name(zr_tensor_device(x), d2));
    if (!zr_is_cpu(seg)) return ZR_OK;
    return seg_mask_ok(op, zr_tensor_data((zr_tensor *)seg), B, T);
}

zr_tensor *zr_sdpa_window_segments(const zr_tensor *seg, int64_t B, int64_t T, int64_t window) {
    if (window < 1) {
        zr_error("sdpa_window_segments: window must be at least 1 (the keys a query sees, itself included), got %lld",
                 (long long)window);
        return NULL;
    }
    if (B < 1 || T < 1 || T > INT32_MAX) {
        zr_error("sdpa_window_segments: B and T must be at least 1 (T at most 2^31 - 1), got B %lld, T %lld",
                 (long long)B, (long long)T);
        return NULL;
    }
    if (seg && !zr_is_cpu(seg)) {
        zr_error("sdpa_window_segments: the segments to narrow must be on the CPU (pass seg:to(\"cpu\"))");
        return NULL;
    }
    int64_t shape[3] = {2, B, T};
    zr_tensor *cpu_x = zr_tensor_new(ZR_I32, zr_cpu(), 3, shape); /* (a stand-in with seg's B, T, device) */
    if (!cpu_x) return NULL;
    if (seg && check_seg("sdpa_window_segments", seg, cpu_x, B, T)) {
        zr_tensor_release(cpu_x);
        return NULL;
    }
    const int32_t *in = seg ? zr_tensor_data((zr_tensor *)seg) : NULL;
    int32_t *lo = zr_tensor_data(cpu_x), *hi = lo + B * T;
    for (int64_t x = 0; x < B * T; x++) {
        int64_t t = x % T, a = t - window + 1, z = t + window;
        int64_t l = in ? in[x] : 0, h = in ? in[B * T + x] : T;
        lo[x] = (int32_t)(a > l ? a : l);
        hi[x] = (int32_t)(z < h ? z : h);
    }
    return cpu_x;
}

/* Records the sdpa node (saving save[0..2], out, lse and seg when given; f[0] = scale), then drops
 * the caller's references to tmp[0..2] and lse. Returns out, or NULL (out released) on failure. */
static zr_tensor *record_sdpa(zr_tensor *out, zr_tensor *lse, zr_backward_fn bwd, zr_tensor *q, zr_tensor *k,
                              zr_tensor *v, zr_tensor *const *save, zr_tensor **tmp, zr_tensor *seg, double scale) {
    zr_node *n;
    zr_status st = zr_autograd_record(out, "sdpa", bwd, 3, (zr_tensor *[]){q, k, v}, &n);
    if (!st && n) {
        n->f[0] = scale;
        st = zr_node_save(n, save[0]) || zr_node_save(n, save[1]) || zr_node_save(n, save[2]) ||
                     zr_node_save(n, out) || zr_node_save(n, lse) || (seg && zr_node_save(n, seg))
                 ? ZR_ERR
                 : ZR_OK;
    }
    for (int i = 0; i < 3; i++) zr_tensor_release(tmp[i]);
    zr_tensor_release(lse);
    if (st) {
        zr_tensor_release(out);
        return NULL;
    }
    return out;
}

/* --- CUDA paths --- */
#ifdef ZR_HAVE_CUDA
#include "cuda/device.h"
#include "kernels/cuda/attention.h"

/* An operand the strided kernels read as it is: last dim contiguous, 16-byte strides and base. */
static int strided_ok(const zr_tensor *t) {
    return t->stride[3] == 1 && t->stride[0] % 8 == 0 && t->stride[1] % 8 == 0 && t->stride[2] % 8 == 0 &&
           t->stride[0] >= 0 && t->stride[1] >= 0 && t->stride[2] >= 0 &&
           ((uintptr_t)zr_tensor_data((zr_tensor *)t) & 15) == 0;
}
/* t's (B, H, T) strides, a dim of size 1 given its contiguous stride (never stepped; a view can carry any,
 * e.g. a single K/V head of a transposed projection, which contiguous copies keep as it is). */
static zr_attn_strides strides_of(const zr_tensor *t) {
    int64_t s[3], dense = t->shape[3];
    for (int i = 2; i >= 0; i--) {
        s[i] = t->shape[i] == 1 ? dense : t->stride[i];
        dense *= t->shape[i];
    }
    return (zr_attn_strides){s[0], s[1], s[2]};
}

/* A head_dim between 64 and 128 (a multiple of 8: Phi-3's 96) runs the 128-wide kernels: in place on the
 * Hopper kernels where they read it (attention_strided_ok: a multiple of 16, TMA filling the tiles' columns
 * past it with zeros), else over zero-padded copies (sdpa_padded). Either way the padding adds nothing to
 * q·k, the output's padded columns (P times V's zero ones) are dropped, and the scale stays the real
 * head_dim's. */
static int padded_dim(int64_t Dh) { return Dh > 64 && Dh < 128 && Dh % 8 == 0; }
/* The flash kernels' own widths (256: the mma.sync kernels, contiguous operands, on every sm_90 GPU). */
static int flash_width(int64_t Dh) { return Dh == 64 || Dh == 128 || Dh == 256; }
/* 1 where the flash kernels run head_dim Dh in dt (with packed sequences too), padded or not. */
static int flash_dim_ok(int64_t Dh, zr_dtype dt) {
    return attention_varlen_ok(Dh, dt) || (padded_dim(Dh) && attention_varlen_ok(128, dt));
}

/* OK where the flash kernels take packed sequences (seg) for q, k, v of dtype dt (same: k and v
 * too) and head_dim Dh on dev, else the error that says why not. */
static zr_status seg_cuda_check(const char *op, zr_device dev, zr_dtype dt, int same, int64_t Dh) {
    char why[96];
    zr_cuda_stream(dev); /* dev's GPU current: the check reads its arch */
    if ((dt == ZR_BF16 || dt == ZR_F16) && same && flash_dim_ok(Dh, dt)) return ZR_OK;
    if (!(dt == ZR_BF16 || dt == ZR_F16) || !same)
        snprintf(why, sizeof why, "the inputs are not all bf16 or all f16 (%s)", zr_dtype_name(dt));
    else if (!flash_width(Dh) && !padded_dim(Dh))
        snprintf(why, sizeof why, "head_dim is %lld", (long long)Dh);
    else
        snprintf(why, sizeof why, "this GPU is below compute capability 9.0");
    return zr_error("%s: packed sequences (segments) run on the CPU and on CUDA (compute capability 9.0 or above) in "
                    "bf16/f16 at head_dim 64, 128, 256 or a multiple of 8 between 64 and 128 (the flash kernels); "
                    "here %s: use zr.sdpa_segments_ok first",
                    op, why);
}

/* Whether a (B, H, T, Dh) operand lies in (B, T, H, Dh) order (a transposed view of a projection). */
static int is_bthd(const zr_tensor *t) { return t->stride[1] < t->stride[2]; }

/* A new (B, H, T, Dh) tensor: (B, T, H, Dh) memory seen through a transpose when bthd (a gradient
 * in the layout of its input, so that the input's own transpose and view hand it on without a
 * copy), else contiguous. */
static zr_tensor *new_bhtd(int bthd, zr_dtype dt, zr_device dev, const int64_t *shape) {
    if (bthd) {
        int64_t bthd[4] = {shape[0], shape[2], shape[1], shape[3]};
        zr_tensor *base = zr_tensor_new_cat(dt, dev, 4, bthd, ZR_MEM_ACTIVATIONS, 0);
        zr_tensor *v = base ? zr_tensor_transpose_raw(base, 1, 2) : NULL;
        zr_tensor_release(base);
        return v;
    }
    return zr_tensor_new_cat(dt, dev, 4, shape, ZR_MEM_ACTIVATIONS, 0);
}

/* saved: q, k, v, out (one dtype; contiguous, or strided when the strided kernels run), lse
 * (B, Hq, T) f32, then seg (packed sequences: the strided kernels) when given; f[0] = scale;
 * i[0] = 1 for the strided kernels, i[1..3]: q, k, v were in (B, T, H, Dh) order */
static zr_status sdpa_backward_dev(zr_node *n, zr_tensor *g, zr_tensor **gin) {
    zr_tensor *q = n->saved[0], *k = n->saved[1], *v = n->saved[2], *o = n->saved[3], *lse = n->saved[4];
    zr_device dev = zr_tensor_device(q);
    zr_dtype dt = q->dtype;
    int64_t B = q->shape[0], Hq = q->shape[1], T = q->shape[2], Dh = q->shape[3], Hkv = k->shape[1];
    int strided = (int)n->i[0], inplace = (int)n->i[4]; /* i[4]: q, k, v were read in place */
    size_t wsz = attention_backward_workspace_size(B, Hq, Hkv, T, Dh);
    zr_tensor *gi = inplace && g->dtype == dt && strided_ok(g) ? zr_tensor_retain(g) : zr_tensor_to_raw(g, dt, dev);
    zr_tensor *ws = NULL, *d[3] = {NULL, NULL, NULL};
    zr_status st = ZR_ERR;
    if (!gi) goto done;
    if (wsz && !(ws = zr_tensor_new_cat(ZR_U8, dev, 1, (int64_t[]){(int64_t)wsz}, ZR_MEM_WORKSPACE, 0))) goto done;
    for (int i = 0; i < 3; i++) /* each gradient in its input's layout */
        if (!(d[i] = new_bhtd(strided && n->i[1 + i], dt, dev, i ? k->shape : q->shape)))
            goto done;
    zr_attn_layout L = {strides_of(q),    strides_of(k),    strides_of(v),    strides_of(o),   strides_of(gi),
                        strides_of(d[0]), strides_of(d[1]), strides_of(d[2]), saved_seg(n, 5)};
    if (B * T > 0 &&
        zr_dev_status(attention_backward_cuda(zr_tensor_data(d[0]), zr_tensor_data(d[1]), zr_tensor_data(d[2]),
                                              zr_tensor_data(gi), zr_tensor_data(q), zr_tensor_data(k),
                                              zr_tensor_data(v), zr_tensor_data(o), zr_tensor_data(lse),
                                              ws ? zr_tensor_data(ws) : NULL, strided ? &L : NULL, B, Hq, Hkv, T,
                                              Dh, (float)n->f[0], dt, zr_cuda_stream(dev)),
                      "sdpa backward", dev))
        goto done;
    if (zr_give_grads(n, 3, d, gin)) goto done;
    st = ZR_OK;
done:
    for (int i = 0; i < 3; i++) zr_tensor_release(d[i]);
    zr_tensor_release(gi);
    zr_tensor_release(ws);
    return st;
}

/* What backward keeps of strided inputs: the views themselves, unless one pins a much larger
 * buffer (a head slice of a fused projection), which a compact copy then replaces. q, k and v
 * that are views of one buffer (zr_qkv_rope's) are judged together: they pin only themselves. */
static zr_status keep_for_backward(zr_tensor *const *in, zr_tensor **save) {
    size_t bytes[3], total = 0;
    for (int i = 0; i < 3; i++) total += bytes[i] = (size_t)zr_tensor_numel(in[i]) * zr_dtype_size(in[i]->dtype);
    int shared = in[0]->storage == in[1]->storage && in[1]->storage == in[2]->storage;
    for (int i = 0; i < 3; i++) {
        size_t mine = shared ? total : bytes[i];
        if (!(save[i] = in[i]->storage->nbytes > 2 * mine ? zr_tensor_contiguous_raw(in[i]) : zr_tensor_retain(in[i])))
            return ZR_ERR;
    }
    return ZR_OK;
}

/* The forward kernel: o (B, Hq, T, Dh) and lse (B, Hq, T) f32 from q, k, v (strided: through a
 * layout, as their strides say, with seg, the packed sequences, or NULL; else contiguous without a
 * layout, and seg NULL). */
static zr_status flash_run(const char *name, zr_tensor *o, zr_tensor *lse, zr_tensor *q, zr_tensor *k, zr_tensor *v,
                           zr_tensor *seg, int strided, double scale) {
    zr_device dev = zr_tensor_device(q);
    int64_t B = q->shape[0], Hq = q->shape[1], T = q->shape[2], Dh = q->shape[3], Hkv = k->shape[1];
    zr_attn_layout L = {.q = strides_of(q),
                        .k = strides_of(k),
                        .v = strides_of(v),
                        .o = strides_of(o),
                        .seg = seg ? (const int32_t *)zr_tensor_data(seg) : NULL};
    if (B * T == 0) return ZR_OK;
    return zr_dev_status(attention_forward_cuda(zr_tensor_data(o), zr_tensor_data(lse), zr_tensor_data(q),
                                                zr_tensor_data(k), zr_tensor_data(v), strided ? &L : NULL, B, Hq,
                                                Hkv, T, Dh, (float)scale, q->dtype, zr_cuda_stream(dev)),
                         name, dev);
}

/* The flash kernel: q, k, v of one bf16/f16 dtype, head_dim 64 or 128 (or a narrow one the Hopper kernels
 * take: attention_strided_ok). On the Hopper kernels
 * q, k, v are read in whatever (B, H, T, Dh)-strided layout they come (e.g. transposed views of
 * (B, T, H, Dh) projections) and the output is (B, T, Hq, Dh) memory seen as (B, Hq, T, Dh), so
 * that o.transpose(2, 3).reshape(B, T, Hq·Dh) is a view. seg (packed sequences; the caller checked
 * that the flash kernels take it) always goes in a layout (attention_forward_cuda's L), over
 * contiguous copies of q, k, v that the kernels cannot read in place (the mma.sync kernels: always). */
static zr_tensor *sdpa_flash(zr_tensor *q, zr_tensor *k, zr_tensor *v, zr_tensor *seg, double scale) {
    zr_device dev = zr_tensor_device(q);
    zr_dtype dt = q->dtype;
    int64_t B = q->shape[0], Hq = q->shape[1], T = q->shape[2], Dh = q->shape[3];
    int64_t lshape[3] = {B, Hq, T};
    int inplace = attention_strided_ok(Dh, dt) && strided_ok(q) && strided_ok(k) && strided_ok(v);
    int strided = inplace || seg != NULL;
    zr_tensor *qi, *ki = NULL, *vi = NULL, *out = NULL, *lse = NULL, *save[3] = {NULL, NULL, NULL};
    if (inplace) {
        qi = zr_tensor_retain(q), ki = zr_tensor_retain(k), vi = zr_tensor_retain(v);
        out = new_bhtd(1, dt, dev, q->shape);
    } else {
        qi = zr_tensor_contiguous_raw(q), ki = qi ? zr_tensor_contiguous_raw(k) : NULL;
        vi = ki ? zr_tensor_contiguous_raw(v) : NULL;
        out = vi ? zr_tensor_new_cat(dt, dev, 4, q->shape, ZR_MEM_ACTIVATIONS, 0) : NULL;
    }
    lse = out ? zr_tensor_new_cat(ZR_F32, dev, 3, lshape, ZR_MEM_ACTIVATIONS, 0) : NULL;
    if (!lse || flash_run("sdpa", out, lse, qi, ki, vi, seg, strided, scale)) goto fail;
    zr_tensor *ins[3] = {qi, ki, vi};
    if (inplace) {
        if (keep_for_backward(ins, save)) goto fail;
    } else
        for (int i = 0; i < 3; i++) save[i] = zr_tensor_retain(ins[i]);
    for (int i = 0; i < 3; i++) zr_tensor_release(ins[i]);
    out = record_sdpa(out, lse, sdpa_backward_dev, q, k, v, save, save, seg, scale);
    if (out && out->grad_fn) {
        zr_tensor *orig[3] = {q, k, v};
        out->grad_fn->i[0] = strided, out->grad_fn->i[4] = inplace;
        for (int i = 0; i < 3; i++) out->grad_fn->i[1 + i] = inplace && is_bthd(orig[i]);
    }
    return out;
fail:
    for (int i = 0; i < 3; i++) zr_tensor_release(save[i]);
    zr_tensor_release(qi);
    zr_tensor_release(ki);
    zr_tensor_release(vi);
    zr_tensor_release(lse);
    zr_tensor_release(out);
    return NULL;
}

/* Heads [h0, h0 + H) of t (B, T, X) with its last dim contiguous, as a (B, H, T, Dh) view: columns
 * h0·Dh .. (h0 + H)·Dh, (B, T, H, Dh) seen through a transpose. */
static zr_tensor *heads_view(zr_tensor *t, int64_t h0, int64_t H, int64_t Dh) {
    int64_t shape[4] = {t->shape[0], H, t->shape[1], Dh}, stride[4] = {t->stride[0], Dh, t->stride[1], 1};
    return zr_tensor_as_strided(t, 4, shape, stride, t->offset + h0 * Dh);
}
/* q, k, v (B, heads, T, Dh) views of a packed (B, T, (Hq + 2 Hkv)·Dh) tensor. */
static zr_status packed_views(zr_tensor *t, int64_t Hq, int64_t Hkv, int64_t Dh, zr_tensor **v) {
    v[0] = heads_view(t, 0, Hq, Dh);
    v[1] = v[0] ? heads_view(t, Hq, Hkv, Dh) : NULL;
    v[2] = v[1] ? heads_view(t, Hq + Hkv, Hkv, Dh) : NULL;
    return v[2] ? ZR_OK : ZR_ERR;
}
static void release3(zr_tensor **t) {
    for (int i = 0; i < 3; i++) zr_tensor_release(t[i]);
}

/* x (B, H, T, Dh) into a new zero-padded (B, H, T, 128) tensor of category cat. */
static zr_tensor *pad128(zr_tensor *x, zr_mem_category cat) {
    int64_t shape[4] = {x->shape[0], x->shape[1], x->shape[2], 128};
    zr_tensor *p = zr_tensor_new_cat(x->dtype, zr_tensor_device(x), 4, shape, cat, 1);
    zr_tensor *w = p ? zr_tensor_narrow_raw(p, 3, 0, x->shape[3]) : NULL;
    zr_status st = w ? zr_tensor_copy_(w, x) : ZR_ERR;
    zr_tensor_release(w);
    if (st) {
        zr_tensor_release(p);
        return NULL;
    }
    return p;
}

/* saved: q, k, v, out padded to 128 (contiguous), lse, then seg when given; f[0] = scale, i[0] = Dh.
 * dO is padded too, the kernels write padded dq, dk, dv, and each gradient is their first Dh columns. */
static zr_status sdpa_padded_backward(zr_node *n, zr_tensor *g, zr_tensor **gin) {
    zr_tensor *q = n->saved[0], *k = n->saved[1], *v = n->saved[2], *o = n->saved[3], *lse = n->saved[4];
    zr_device dev = zr_tensor_device(q);
    zr_dtype dt = q->dtype;
    int64_t B = q->shape[0], Hq = q->shape[1], T = q->shape[2], Hkv = k->shape[1], Dh = n->i[0];
    const int32_t *seg = saved_seg(n, 5);
    size_t wsz = attention_backward_workspace_size(B, Hq, Hkv, T, 128);
    /* (dO copied into the padded buffer as it comes, any strides; cast first only from another dtype) */
    zr_tensor *gc = g->dtype == dt ? zr_tensor_retain(g) : zr_tensor_to_raw(g, dt, dev);
    zr_tensor *gp = gc ? pad128(gc, ZR_MEM_ACTIVATIONS) : NULL;
    zr_tensor *ws = NULL, *dp[3] = {NULL, NULL, NULL}, *d[3] = {NULL, NULL, NULL};
    zr_status st = ZR_ERR;
    zr_tensor_release(gc);
    if (!gp) goto done;
    if (wsz && !(ws = zr_tensor_new_cat(ZR_U8, dev, 1, (int64_t[]){(int64_t)wsz}, ZR_MEM_WORKSPACE, 0))) goto done;
    for (int i = 0; i < 3; i++)
        if (!(dp[i] = zr_tensor_new_cat(dt, dev, 4, (i ? k : q)->shape, ZR_MEM_ACTIVATIONS, 0))) goto done;
    zr_attn_layout L = {strides_of(q),     strides_of(k),     strides_of(v),     strides_of(o),  strides_of(gp),
                        strides_of(dp[0]), strides_of(dp[1]), strides_of(dp[2]), seg};
    if (B * T > 0 &&
        zr_dev_status(attention_backward_cuda(zr_tensor_data(dp[0]), zr_tensor_data(dp[1]), zr_tensor_data(dp[2]),
                                              zr_tensor_data(gp), zr_tensor_data(q), zr_tensor_data(k),
                                              zr_tensor_data(v), zr_tensor_data(o), zr_tensor_data(lse),
                                              ws ? zr_tensor_data(ws) : NULL, seg ? &L : NULL, B, Hq, Hkv, T, 128,
                                              (float)n->f[0], dt, zr_cuda_stream(dev)),
                      "sdpa backward", dev))
        goto done;
    zr_tensor_release(gp);
    zr_tensor_release(ws);
    gp = ws = NULL;
    for (int i = 0; i < 3; i++) {
        zr_tensor *w = zr_tensor_narrow_raw(dp[i], 3, 0, Dh);
        d[i] = w ? zr_tensor_contiguous_raw(w) : NULL;
        zr_tensor_release(w);
        zr_tensor_release(dp[i]);
        dp[i] = NULL;
        if (!d[i]) goto done;
    }
    if (zr_give_grads(n, 3, d, gin)) goto done;
    st = ZR_OK;
done:
    for (int i = 0; i < 3; i++) {
        zr_tensor_release(dp[i]);
        zr_tensor_release(d[i]);
    }
    zr_tensor_release(gp);
    zr_tensor_release(ws);
    return st;
}

/* The flash kernels at a padded_dim head_dim: q, k, v copied into zero-padded (.., 128) tensors, the
 * 128-wide kernels (contiguous operands; seg through a layout), the output the first Dh columns of the
 * padded one (a (B, Hq, T, Dh) view of it, which the node keeps whole). */
static zr_tensor *sdpa_padded(zr_tensor *q, zr_tensor *k, zr_tensor *v, zr_tensor *seg, double scale) {
    zr_device dev = zr_tensor_device(q);
    int64_t B = q->shape[0], Hq = q->shape[1], T = q->shape[2], Dh = q->shape[3];
    int64_t lshape[3] = {B, Hq, T}, oshape[4] = {B, Hq, T, 128};
    zr_tensor *in[3] = {q, k, v}, *p[3] = {NULL, NULL, NULL}, *op = NULL, *lse = NULL, *out = NULL;
    zr_node *n;
    for (int i = 0; i < 3; i++)
        if (!(p[i] = pad128(in[i], ZR_MEM_ACTIVATIONS))) goto fail;
    if (!(op = zr_tensor_new_cat(q->dtype, dev, 4, oshape, ZR_MEM_ACTIVATIONS, 0)) ||
        !(lse = zr_tensor_new_cat(ZR_F32, dev, 3, lshape, ZR_MEM_ACTIVATIONS, 0)) ||
        flash_run("sdpa", op, lse, p[0], p[1], p[2], seg, seg != NULL, scale) ||
        !(out = zr_tensor_narrow_raw(op, 3, 0, Dh)))
        goto fail;
    if (zr_autograd_record(out, "sdpa", sdpa_padded_backward, 3, in, &n)) goto fail;
    if (n) {
        n->f[0] = scale, n->i[0] = Dh;
        if (zr_node_save(n, p[0]) || zr_node_save(n, p[1]) || zr_node_save(n, p[2]) || zr_node_save(n, op) ||
            zr_node_save(n, lse) || (seg && zr_node_save(n, seg)))
            goto fail;
    }
    release3(p);
    zr_tensor_release(op);
    zr_tensor_release(lse);
    return out;
fail:
    release3(p);
    zr_tensor_release(op);
    zr_tensor_release(lse);
    zr_tensor_release(out);
    return NULL;
}


/* sdpa_packed's node: saved qkv (B, T, W), out (B, T, Hq·Dh), lse (B, Hq, T) f32; f[0] = scale;
 * i[0] = Hq, i[1] = Hkv; q, k, v are read as views of qkv. qkv_rope_sdpa's (i[2] = 1): saved q, k,
 * v (the rotated views zr_qkv_rope_forward made), out, lse, cos, sin (f32, 16-byte aligned); dq and
 * dk are turned back through the rope on their way into the gradient. Either way seg (packed
 * sequences) comes last when i[3] = 1, and dq, dk, dv are written through strided views of one new
 * (B, T, W) gradient: the packed product's, whole. */
static zr_status packed_backward(zr_node *n, zr_tensor *g, zr_tensor **gin) {
    const int rope = (int)n->i[2];
    zr_tensor *out = n->saved[rope ? 3 : 1], *lse = n->saved[rope ? 4 : 2];
    zr_device dev = zr_tensor_device(out);
    zr_dtype dt = out->dtype;
    int64_t B = out->shape[0], T = out->shape[1], Hq = n->i[0], Hkv = n->i[1], Dh = out->shape[2] / Hq;
    zr_tensor *gi = NULL, *dqkv = NULL, *ws = NULL, *in[3] = {NULL}, *d[3] = {NULL}, *o = NULL, *dout = NULL;
    zr_status st = ZR_ERR;
    gi = zr_tensor_to_raw(g, dt, dev); /* g itself when contiguous (c_proj's dX), else a copy */
    if (!gi || !(dout = heads_view(gi, 0, Hq, Dh))) goto done;
    if (!strided_ok(dout)) { /* a misaligned gradient (a view at an odd offset): an aligned copy */
        zr_tensor *c = zr_tensor_clone_raw(gi);
        zr_tensor_release(gi);
        zr_tensor_release(dout);
        gi = c, dout = NULL;
        if (!gi || !(dout = heads_view(gi, 0, Hq, Dh))) goto done;
    }
    size_t wsz = attention_backward_workspace_size(B, Hq, Hkv, T, Dh);
    if (wsz && !(ws = zr_tensor_new_cat(ZR_U8, dev, 1, (int64_t[]){(int64_t)wsz}, ZR_MEM_WORKSPACE, 0))) goto done;
    if (rope)
        for (int i = 0; i < 3; i++) in[i] = zr_tensor_retain(n->saved[i]);
    else if (packed_views(n->saved[0], Hq, Hkv, Dh, in))
        goto done;
    if (!(dqkv = zr_tensor_new_cat(dt, dev, 3, n->edges[0].shape, ZR_MEM_ACTIVATIONS, 0)) ||
        packed_views(dqkv, Hq, Hkv, Dh, d) || !(o = heads_view(out, 0, Hq, Dh)))
        goto done;
    zr_attn_layout L = {strides_of(in[0]), strides_of(in[1]), strides_of(in[2]), strides_of(o),
                        strides_of(dout),  strides_of(d[0]),  strides_of(d[1]),  strides_of(d[2]),
                        n->i[3] ? saved_seg(n, n->n_saved - 1) : NULL};
    void *a[9] = {zr_tensor_data(d[0]),  zr_tensor_data(d[1]),  zr_tensor_data(d[2]),
                  zr_tensor_data(dout),  zr_tensor_data(in[0]), zr_tensor_data(in[1]),
                  zr_tensor_data(in[2]), zr_tensor_data(o),     ws ? zr_tensor_data(ws) : NULL};
    float sc = (float)n->f[0];
    cudaStream_t cs = zr_cuda_stream(dev);
    int rc = !(B * T > 0) ? 0
             : rope       ? attention_backward_rope_cuda(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7],
                                                         zr_tensor_data(lse), a[8], &L, B, Hq, Hkv, T, Dh, sc,
                                                         zr_tensor_data(n->saved[5]), zr_tensor_data(n->saved[6]),
                                                         dt, cs)
                          : attention_backward_cuda(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7],
                                                    zr_tensor_data(lse), a[8], &L, B, Hq, Hkv, T, Dh, sc, dt, cs);
    if (zr_dev_status(rc, rope ? "qkv_rope_sdpa backward" : "sdpa_packed backward", dev)) goto done;
    if (zr_give_grads(n, 1, &dqkv, gin)) goto done;
    st = ZR_OK;
done:
    release3(in);
    release3(d);
    zr_tensor_release(o);
    zr_tensor_release(dout);
    zr_tensor_release(gi);
    zr_tensor_release(ws);
    zr_tensor_release(dqkv);
    return st;
}

/* The attention over in[0..2] (strided views) into a new (B, T, Hq, Dh) output seen as
 * (B, T, Hq·Dh), recorded as one node over qkv (packed_backward) that saves keep[0..nkeep), the
 * output, lse, then tab[0..ntab) (the rope's tables: i[2] = 1), then seg when given (i[3] = 1). */
static zr_tensor *packed_node(const char *name, zr_tensor *qkv, zr_tensor *const *in, zr_tensor *const *keep,
                              int nkeep, zr_tensor *const *tab, int ntab, zr_tensor *seg, int64_t Hq, int64_t Hkv,
                              int64_t Dh, double scale) {
    zr_device dev = zr_tensor_device(qkv);
    int64_t B = qkv->shape[0], T = qkv->shape[1], oshape[3] = {B, T, Hq * Dh}, lshape[3] = {B, Hq, T};
    zr_tensor *out = NULL, *o = NULL, *lse = NULL;
    zr_status st = ZR_ERR;
    if (!(out = zr_tensor_new_cat(qkv->dtype, dev, 3, oshape, ZR_MEM_ACTIVATIONS, 0)) ||
        !(o = heads_view(out, 0, Hq, Dh)) || !(lse = zr_tensor_new_cat(ZR_F32, dev, 3, lshape, ZR_MEM_ACTIVATIONS, 0)) ||
        flash_run(name, o, lse, in[0], in[1], in[2], seg, 1, scale))
        goto done;
    zr_node *n;
    if (zr_autograd_record(out, name, packed_backward, 1, &qkv, &n)) goto done;
    if (n) {
        n->f[0] = scale;
        n->i[0] = Hq, n->i[1] = Hkv, n->i[2] = ntab > 0, n->i[3] = seg != NULL;
        for (int i = 0; i < nkeep; i++)
            if (zr_node_save(n, keep[i])) goto done;
        if (zr_node_save(n, out) || zr_node_save(n, lse)) goto done;
        for (int i = 0; i < ntab; i++)
            if (zr_node_save(n, tab[i])) goto done;
        if (seg && zr_node_save(n, seg)) goto done;
    }
    st = ZR_OK;
done:
    zr_tensor_release(o);
    zr_tensor_release(lse);
    if (st) {
        zr_tensor_release(out);
        out = NULL;
    }
    return out;
}

/* The Hopper kernels over the packed projection: q, k, v read in place (views of qkv), which the
 * node keeps; NULL with *taken = 0 when they cannot take it. */
static zr_tensor *packed_flash(zr_tensor *qkv, int64_t Hq, int64_t Hkv, int64_t Dh, zr_tensor *seg, double scale,
                               int *taken) {
    zr_tensor *in[3] = {NULL}, *out = NULL;
    *taken = qkv->stride[2] == 1 && !packed_views(qkv, Hq, Hkv, Dh, in) && strided_ok(in[0]) && strided_ok(in[1]) &&
             strided_ok(in[2]);
    if (*taken) out = packed_node("sdpa_packed", qkv, in, &qkv, 1, NULL, 0, seg, Hq, Hkv, Dh, scale);
    release3(in); /* else the composition takes it */
    return out;
}

/* zr_qkv_rope_sdpa on the Hopper kernels, its forward exactly zr_qkv_rope + sdpa's: the qkv_rope
 * kernel into its (B, T, H + 2 KV, Dh) buffer, the attention reading q, k, v there; the node keeps
 * what the sdpa node keeps (q, k, v, the output, lse) and the f32 tables qkv_rope's nodes keep.
 * NULL with *taken = 0 when the Hopper kernels cannot read the rotated views (the composition's
 * turn). */
static zr_tensor *rope_flash(zr_tensor *qkv, int64_t Hq, int64_t Hkv, int64_t Dh, zr_tensor *cos, zr_tensor *sin,
                             zr_tensor *seg, double scale, int *taken) {
    zr_tensor *p[3] = {NULL}, *tab[2] = {NULL}, *save[3] = {NULL}, *out = NULL;
    *taken = 1; /* from here on a failure is an error, not the composition's turn */
    if (zr_qkv_rope_forward(qkv, Hq, Hkv, cos, sin, p, tab)) goto done;
    if (!(strided_ok(p[0]) && strided_ok(p[1]) && strided_ok(p[2]))) { /* not the (B, T, heads, Dh) views */
        *taken = 0;
        goto done;
    }
    for (int i = 0; i < 2; i++)
        if (((uintptr_t)zr_tensor_data(tab[i]) & 15) != 0) { /* the backward reads 16-byte vectors */
            zr_tensor *c = zr_tensor_clone_raw(tab[i]);
            zr_tensor_release(tab[i]);
            if (!(tab[i] = c)) goto done;
        }
    if (!keep_for_backward(p, save))
        out = packed_node("qkv_rope_sdpa", qkv, p, save, 3, tab, 2, seg, Hq, Hkv, Dh, scale);
done:
    release3(p);
    release3(save);
    zr_tensor_release(tab[0]);
    zr_tensor_release(tab[1]);
    return out;
}
#endif

/* The f32 composition: softmax(mask(q kᵀ · scale)) v with differentiable ops (their backward
 * gives the gradients), k and v repeated over each query group; the result in q's dtype. seg (2, B, T)
 * on q's device, or NULL: the keys before each query's lo (seg's first half) are masked too (packed
 * sequences and windows; each query's keys end at itself, which the causal mask gives). */
static zr_tensor *sdpa_composed(zr_tensor *q, zr_tensor *k, zr_tensor *v, zr_tensor *seg, double scale) {
    zr_device dev = zr_tensor_device(q);
    int64_t B = q->shape[0], Hq = q->shape[1], T = q->shape[2], Dh = q->shape[3], Hkv = k->shape[1];
    enum { QF, KF, VF, KR, VR, KT, S, SS, R, C, M, SM, LO, LF, LR, LM, SW, P, O, NT };
    zr_tensor *t[NT] = {NULL}, *out = NULL;
    if (!(t[QF] = zr_to(q, ZR_F32, dev)) || !(t[KF] = zr_to(k, ZR_F32, dev)) || !(t[VF] = zr_to(v, ZR_F32, dev)))
        goto done;
    if (Hq != Hkv) { /* (B, Hkv, T, Dh) -> (B, Hkv, g, T, Dh) -> (B, Hq, T, Dh) */
        int64_t g = Hq / Hkv, s1[5] = {B, Hkv, 1, T, Dh}, s2[5] = {B, Hkv, g, T, Dh}, s3[4] = {B, Hq, T, Dh};
        for (int i = 0; i < 2; i++) {
            zr_tensor *a = zr_reshape(i ? t[VF] : t[KF], 5, s1);
            zr_tensor *e = a ? zr_expand(a, 5, s2) : NULL;
            t[KR + i] = e ? zr_reshape(e, 4, s3) : NULL;
            zr_tensor_release(a);
            zr_tensor_release(e);
            if (!t[KR + i]) goto done;
        }
    } else {
        t[KR] = zr_tensor_retain(t[KF]);
        t[VR] = zr_tensor_retain(t[VF]);
    }
    if (!(t[KT] = zr_transpose(t[KR], 2, 3)) || !(t[S] = zr_matmul(t[QF], t[KT])) ||
        !(t[SS] = zr_affine(t[S], scale, 0)))
        goto done;
    /* mask[i, j] = j > i (a future position) */
    int64_t rs[2] = {T, 1}, cs[2] = {1, T};
    zr_tensor *ar = zr_tensor_arange(0, (double)T, 1, ZR_F32, dev);
    zr_tensor *rv = ar ? zr_tensor_view_raw(ar, 2, rs) : NULL, *cv = ar ? zr_tensor_view_raw(ar, 2, cs) : NULL;
    t[M] = rv && cv ? zr_compare(ZR_CMP_GT, cv, rv) : NULL;
    int ok = t[M] && (t[SM] = zr_masked_fill(t[SS], t[M], -INFINITY));
    zr_tensor *sm = t[SM];
    if (ok && seg) { /* mask[b, i, j] = j < lo[b, i], (B, 1, T, T) */
        int64_t ls[4] = {B, 1, T, 1};
        ok = (t[LO] = zr_select(seg, 0, 0)) && (t[LF] = zr_to(t[LO], ZR_F32, dev)) &&
             (t[LR] = zr_reshape(t[LF], 4, ls)) && (t[LM] = zr_compare(ZR_CMP_LT, cv, t[LR])) &&
             (t[SW] = zr_masked_fill(t[SM], t[LM], -INFINITY));
        sm = t[SW];
    }
    zr_tensor_release(ar);
    zr_tensor_release(rv);
    zr_tensor_release(cv);
    if (!ok || !(t[P] = zr_softmax(sm, -1)) || !(t[O] = zr_matmul(t[P], t[VR]))) goto done;
    out = zr_to(t[O], q->dtype, dev);
done:
    for (int i = 0; i < NT; i++) zr_tensor_release(t[i]);
    return out;
}

zr_tensor *zr_sdpa_causal(zr_tensor *q, zr_tensor *k, zr_tensor *v, zr_tensor *seg, double scale) {
    if (check_args(q, k, v)) return NULL;
    int64_t B = q->shape[0], Hq = q->shape[1], T = q->shape[2], Dh = q->shape[3], Hkv = k->shape[1];
    if (seg && check_seg("sdpa", seg, q, B, T)) return NULL;
    if (scale <= 0) scale = Dh > 0 ? 1.0 / sqrt((double)Dh) : 1.0;
    if (!zr_is_cpu(q)) {
#ifdef ZR_HAVE_CUDA
        zr_dtype dt = q->dtype;
        int same = k->dtype == dt && v->dtype == dt;
        int low = (dt == ZR_BF16 || dt == ZR_F16) && same;
        /* (the composition below masks by the segments itself: the check is the flash kernels') */
        if (seg && low && (flash_width(Dh) || padded_dim(Dh)) && seg_cuda_check("sdpa", zr_tensor_device(q), dt, same, Dh))
            return NULL;
        if (low && (flash_width(Dh) || (padded_dim(Dh) && attention_strided_ok(Dh, dt))))
            return sdpa_flash(q, k, v, seg, scale);
        if (low && padded_dim(Dh) && flash_dim_ok(Dh, dt)) return sdpa_padded(q, k, v, seg, scale);
#endif
        return sdpa_composed(q, k, v, seg, scale);
    }
    int f64 = q->dtype == ZR_F64 || k->dtype == ZR_F64 || v->dtype == ZR_F64;
    zr_dtype ct = f64 ? ZR_F64 : ZR_F32;
    zr_device dev = zr_tensor_device(q);
    int64_t lshape[3] = {B, Hq, T};
    zr_tensor *out = zr_tensor_new_cat(q->dtype, dev, 4, q->shape, ZR_MEM_ACTIVATIONS, 0);
    zr_tensor *lse = out ? zr_tensor_new_cat(ct, dev, 3, lshape, ZR_MEM_ACTIVATIONS, 0) : NULL;
    zr_tensor *work = lse ? zr_tensor_new_cat(ct, dev, 3, lshape, ZR_MEM_WORKSPACE, 0) : NULL;
    zr_tensor *qi = work ? zr_cpu_in(q, ct) : NULL, *ki = qi ? zr_cpu_in(k, ct) : NULL;
    zr_tensor *vi = ki ? zr_cpu_in(v, ct) : NULL, *o = vi ? zr_cpu_out_begin(out, ct) : NULL;
    if (!o) goto fail;
    ZR_CPU_CALL(ct, sdpa_causal_forward_cpu, zr_tensor_data(o), zr_tensor_data(lse), zr_tensor_data(qi),
                zr_tensor_data(ki), zr_tensor_data(vi), seg ? zr_tensor_data(seg) : NULL, zr_tensor_data(work), B, Hq,
                Hkv, T, Dh, scale);
    zr_status st = zr_cpu_out_end(out, o);
    o = NULL;
    zr_tensor_release(work);
    work = NULL;
    if (st) goto fail;
    return record_sdpa(out, lse, sdpa_backward, q, k, v, (zr_tensor *[]){q, k, v}, (zr_tensor *[]){qi, ki, vi}, seg,
                       scale);
fail:
    zr_tensor_release(o);
    zr_tensor_release(work);
    zr_tensor_release(qi);
    zr_tensor_release(ki);
    zr_tensor_release(vi);
    zr_tensor_release(lse);
    zr_tensor_release(out);
    return NULL;
}

/* --- packed q/k/v (zr_sdpa_packed) --- */

/* packed_flash (rope_flash with cos, sin) where the Hopper kernels can run (CUDA, bf16/f16, their
 * head_dim); elsewhere NULL with *taken = 0: the composition's turn. seg (packed sequences) on a
 * GPU where they cannot run: NULL with *taken = 1 and the error. */
static zr_tensor *packed_hopper(const char *op, zr_tensor *qkv, int64_t Hq, int64_t Hkv, int64_t Dh, double scale,
                                zr_tensor *cos, zr_tensor *sin, zr_tensor *seg, int *taken) {
    *taken = 0;
#ifdef ZR_HAVE_CUDA
    zr_dtype dt = qkv->dtype;
    if (!zr_is_cpu(qkv) && seg && seg_cuda_check(op, zr_tensor_device(qkv), dt, 1, Dh)) {
        *taken = 1;
        return NULL;
    }
    if (!zr_is_cpu(qkv) && (dt == ZR_BF16 || dt == ZR_F16)) {
        zr_cuda_stream(zr_tensor_device(qkv)); /* qkv's GPU current: the kernels' check reads its arch */
        if (attention_strided_ok(Dh, dt))
            return cos ? rope_flash(qkv, Hq, Hkv, Dh, cos, sin, seg, scale, taken)
                       : packed_flash(qkv, Hq, Hkv, Dh, seg, scale, taken);
    }
#else
    (void)op, (void)qkv, (void)Hq, (void)Hkv, (void)Dh, (void)scale, (void)cos, (void)sin, (void)seg;
#endif
    return NULL;
}

/* split + view + transpose + zr_sdpa_causal, then o.transpose(1, 2).reshape(B, T, Hq·Dh): the
 * path wherever the Hopper kernels do not run; split's backward fills one gradient of qkv. */
/* zr_sdpa_causal over q, k, v = h[0..2] (B, heads, T, Dh), its output transposed back and reshaped to
 * (B, T, Hq·Dh): the last steps of the packed ops' compositions. */
static zr_tensor *sdpa_bthd(zr_tensor *const *h, zr_tensor *seg, double scale) {
    int64_t oshape[3] = {h[0]->shape[0], h[0]->shape[2], h[0]->shape[1] * h[0]->shape[3]};
    zr_tensor *o = NULL, *ot = NULL, *out = NULL;
    if ((o = zr_sdpa_causal(h[0], h[1], h[2], seg, scale)) && (ot = zr_transpose(o, 1, 2)))
        out = zr_reshape(ot, 3, oshape);
    zr_tensor_release(o);
    zr_tensor_release(ot);
    return out;
}

static zr_tensor *packed_composed(zr_tensor *qkv, int64_t Hq, int64_t Hkv, int64_t Dh, zr_tensor *seg, double scale) {
    int64_t B = qkv->shape[0], T = qkv->shape[1], heads[3] = {Hq, Hkv, Hkv};
    int64_t sizes[3] = {Hq * Dh, Hkv * Dh, Hkv * Dh};
    zr_tensor *p[3] = {NULL}, *h[3] = {NULL}, *out = NULL;
    if (zr_split_sizes(qkv, 3, sizes, 2, p)) goto done;
    for (int i = 0; i < 3; i++) {
        int64_t s[4] = {B, T, heads[i], Dh};
        zr_tensor *v = zr_view(p[i], 4, s);
        h[i] = v ? zr_transpose(v, 1, 2) : NULL;
        zr_tensor_release(v);
        if (!h[i]) goto done;
    }
    out = sdpa_bthd(h, seg, scale);
done:
    for (int i = 0; i < 3; i++) {
        zr_tensor_release(p[i]);
        zr_tensor_release(h[i]);
    }
    return out;
}

zr_tensor *zr_sdpa_packed(zr_tensor *qkv, int64_t Hq, int64_t Hkv, zr_tensor *seg, double scale) {
    char b1[128];
    if (zr_check_float("sdpa_packed", qkv)) return NULL;
    if (Hq < 1 || Hkv < 1 || Hq % Hkv)
        return zr_error_null("sdpa_packed: n_head %lld must be a multiple of n_kv_head %lld (both >= 1)",
                             (long long)Hq, (long long)Hkv);
    int64_t nh = Hq + 2 * Hkv;
    if (qkv->ndim != 3 || qkv->shape[2] % nh || qkv->shape[2] == 0)
        return zr_error_null("sdpa_packed: qkv must be (B, T, (n_head + 2 n_kv_head)·head_dim) = (B, T, "
                             "%lld·head_dim), got %s",
                             (long long)nh, zr_tensor_shape_str(qkv, b1));
    int64_t Dh = qkv->shape[2] / nh;
    if (seg && check_seg("sdpa_packed", seg, qkv, qkv->shape[0], qkv->shape[1])) return NULL;
    if (scale <= 0) scale = 1.0 / sqrt((double)Dh);
    int taken;
    zr_tensor *out = packed_hopper("sdpa_packed", qkv, Hq, Hkv, Dh, scale, NULL, NULL, seg, &taken);
    return taken ? out : packed_composed(qkv, Hq, Hkv, Dh, seg, scale);
}

/* --- packed q/k/v with the rope (zr_qkv_rope_sdpa) --- */

/* zr_qkv_rope + zr_sdpa_causal, then o.transpose(1, 2).reshape(B, T, Hq·Dh): the path wherever
 * the Hopper kernels do not run (the CPU one is the twin the CUDA tests compare with). */
static zr_tensor *rope_composed(zr_tensor *qkv, int64_t Hq, int64_t Hkv, zr_tensor *cos, zr_tensor *sin, zr_tensor *seg,
                                double scale) {
    zr_tensor *p[3] = {NULL, NULL, NULL}, *out = NULL;
    if (!zr_qkv_rope(qkv, Hq, Hkv, cos, sin, ZR_QKV_AUTO, p)) out = sdpa_bthd(p, seg, scale);
    for (int i = 0; i < 3; i++) zr_tensor_release(p[i]);
    return out;
}

zr_tensor *zr_qkv_rope_sdpa(zr_tensor *qkv, int64_t Hq, int64_t Hkv, zr_tensor *cos, zr_tensor *sin, zr_tensor *seg,
                            double scale) {
    if (zr_qkv_rope_check(qkv, Hq, Hkv, cos, sin)) return NULL;
    if (Hq % Hkv)
        return zr_error_null("qkv_rope_sdpa: n_head %lld must be a multiple of n_kv_head %lld", (long long)Hq,
                             (long long)Hkv);
    int64_t Dh = qkv->shape[2] / (Hq + 2 * Hkv);
    if (seg && check_seg("qkv_rope_sdpa", seg, qkv, qkv->shape[0], qkv->shape[1])) return NULL;
    if (scale <= 0) scale = 1.0 / sqrt((double)Dh);
    int taken;
    zr_tensor *out = packed_hopper("qkv_rope_sdpa", qkv, Hq, Hkv, Dh, scale, cos, sin, seg, &taken);
    return taken ? out : rope_composed(qkv, Hq, Hkv, cos, sin, seg, scale);
}

zr_tensor *zr_qkv_norm_rope_sdpa(zr_tensor *qkv, int64_t Hq, int64_t Hkv, zr_tensor *wq, zr_tensor *wk, double eps,
                                 zr_tensor *cos, zr_tensor *sin, zr_tensor *seg, double scale) {
    if (zr_qkv_rope_check(qkv, Hq, Hkv, cos, sin)) return NULL;
    if (Hq % Hkv)
        return zr_error_null("qkv_norm_rope_sdpa: n_head %lld must be a multiple of n_kv_head %lld", (long long)Hq,
                             (long long)Hkv);
    if (seg && check_seg("qkv_norm_rope_sdpa", seg, qkv, qkv->shape[0], qkv->shape[1])) return NULL;
    zr_tensor *p[3] = {NULL, NULL, NULL}, *out = NULL;
    if (!zr_qkv_norm_rope(qkv, Hq, Hkv, wq, wk, eps, cos, sin, ZR_QKV_AUTO, p)) out = sdpa_bthd(p, seg, scale);
    for (int i = 0; i < 3; i++) zr_tensor_release(p[i]);
    return out;
}

int zr_sdpa_segments_ok(zr_device dev, zr_dtype dt, int64_t Dh) {
    if (dev.type == ZR_CPU) return zr_dtype_is_float(dt);
#ifdef ZR_HAVE_CUDA
    if (dt != ZR_BF16 && dt != ZR_F16) return 0;
    zr_cuda_stream(dev); /* dev's GPU current: the check reads its arch */
    return flash_dim_ok(Dh, dt);
#else
    (void)Dh;
    return 0;
#endif
}
