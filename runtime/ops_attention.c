/* Causal grouped-query attention: forward and backward side by side (see ops_attention.h).
 * CPU only for now; bf16/f16 are widened to f32 and narrowed back. */
#include "ops_attention.h"

#include <math.h>

#include "ops_util.h"

static zr_tensor *cast_to(zr_tensor *r, zr_dtype dt) {
    if (!r || r->dtype == dt) return r;
    zr_tensor *c = zr_tensor_to_raw(r, dt, zr_tensor_device(r));
    zr_tensor_release(r);
    return c;
}

/* saved: q, k, v, out (input dtypes), lse (B, Hq, T) in the compute dtype; f[0] = scale */
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
                zr_tensor_data(in[2]), zr_tensor_data(in[3]), zr_tensor_data(lse), B, Hq, Hkv, T, Dh,
                n->f[0]);
    for (int i = 0; i < 3; i++) {
        if (!zr_node_needs_grad(n, i)) continue;
        zr_tensor *c = cast_to(d[i], n->edges[i].dtype);
        d[i] = NULL;
        if (!c) goto done;
        gin[i] = c;
    }
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
    if (!zr_is_cpu(q)) return zr_no_cuda("sdpa");
    return ZR_OK;
}

zr_tensor *zr_sdpa_causal(zr_tensor *q, zr_tensor *k, zr_tensor *v, double scale) {
    if (check_args(q, k, v)) return NULL;
    int64_t B = q->shape[0], Hq = q->shape[1], T = q->shape[2], Dh = q->shape[3], Hkv = k->shape[1];
    if (scale <= 0) scale = Dh > 0 ? 1.0 / sqrt((double)Dh) : 1.0;
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
                zr_tensor_data(ki), zr_tensor_data(vi), zr_tensor_data(work), B, Hq, Hkv, T, Dh, scale);
    zr_status st = zr_cpu_out_end(out, o);
    o = NULL;
    zr_tensor_release(work);
    work = NULL;
    if (st) goto fail;
    zr_node *n;
    if (zr_autograd_record(out, "sdpa", sdpa_backward, 3, (zr_tensor *[]){q, k, v}, &n)) goto fail;
    if (n) {
        n->f[0] = scale;
        if (zr_node_save(n, q) || zr_node_save(n, k) || zr_node_save(n, v) || zr_node_save(n, out) ||
            zr_node_save(n, lse))
            goto fail;
    }
    zr_tensor_release(qi);
    zr_tensor_release(ki);
    zr_tensor_release(vi);
    zr_tensor_release(lse);
    return out;
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
