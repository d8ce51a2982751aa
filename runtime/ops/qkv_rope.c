/* The fused q/k/v rope (see ops/qkv_rope.h): forward, backward and the group its three outputs
 * share. Each output is a view with its own autograd node (as zr_split's parts); their backwards
 * park their gradients in the group, and the group writes the whole packed gradient in one kernel
 * when the engine ends its mark on the product's gradient buffer (zr_node_input_grad_buffer). */
#include "ops/qkv_rope.h"

#include <stdlib.h>

#include "ops/util.h"

#ifdef ZR_HAVE_CUDA
#include "cuda/device.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/qkv_rope.h"
#endif

static const char *const PART[3] = {"q", "k", "v"};

/* What the three outputs of one call share. */
typedef struct {
    int refcount;
    int64_t H, KV;
    zr_tensor *cos, *sin;  /* (T, Dh) contiguous: the CPU compute dtype, or f32 on CUDA */
    zr_tensor *pending[3]; /* gradients of q, k, v parked until the mark ends (qkv_finish) */
} qkv_group;

static void group_release(void *p) {
    qkv_group *G = p;
    if (!G || --G->refcount > 0) return;
    zr_tensor_release(G->cos);
    zr_tensor_release(G->sin);
    for (int i = 0; i < 3; i++) zr_tensor_release(G->pending[i]);
    free(G);
}

/* q, k, v as views of buf (contiguous, laid out as `layout` says). */
static zr_status part_views(zr_tensor *buf, int layout, int64_t B, int64_t T, int64_t H, int64_t KV,
                            int64_t Dh, zr_tensor **v) {
    int64_t heads[3] = {H, KV, KV}, off = 0;
    for (int p = 0; p < 3; p++) {
        if (layout == ZR_QKV_BTHD) {
            zr_tensor *s = zr_tensor_narrow_raw(buf, 2, off, heads[p]);
            v[p] = s ? zr_tensor_transpose_raw(s, 1, 2) : NULL;
            zr_tensor_release(s);
        } else {
            int64_t shape[4] = {B, heads[p], T, Dh};
            zr_tensor *s = zr_tensor_narrow_raw(buf, 0, off * B * T * Dh, B * heads[p] * T * Dh);
            v[p] = s ? zr_tensor_view_raw(s, 4, shape) : NULL;
            zr_tensor_release(s);
        }
        off += heads[p];
        if (!v[p]) {
            for (int i = 0; i < p; i++) zr_tensor_release(v[i]);
            return ZR_ERR;
        }
    }
    return ZR_OK;
}

/* The kernels' layout: packed (B, T, W) with its last dim contiguous; parts[p] may be NULL. */
static zr_qkv_layout layout_of(const zr_tensor *packed, zr_tensor *const *parts) {
    zr_qkv_layout L = {packed->stride[0], packed->stride[1], {{0}}};
    for (int p = 0; p < 3; p++)
        for (int d = 0; d < 3 && parts[p]; d++) L.part[p][d] = parts[p]->stride[d];
    return L;
}
static void *data_or_null(zr_tensor *t) { return t ? zr_tensor_data(t) : NULL; }

/* dst (B, T, W) contiguous, any float dtype: the packed gradient of g[0..2] (NULL: zeros),
 * overwriting dst or, with accumulate, added to it. */
static zr_status grad_into(qkv_group *G, zr_tensor *dst, zr_tensor *const *g, int accumulate) {
    int64_t B = dst->shape[0], T = dst->shape[1], H = G->H, KV = G->KV, Dh = dst->shape[2] / (H + 2 * KV);
    zr_device dev = zr_tensor_device(dst);
    zr_tensor *gi[3] = {NULL, NULL, NULL}, *o = NULL;
    zr_status st = ZR_ERR;
    if (zr_is_cpu(dst)) {
        zr_dtype ct = G->cos->dtype;
        for (int p = 0; p < 3; p++)
            if (g[p] && !(gi[p] = zr_cpu_in(g[p], ct))) goto done;
        o = dst->dtype == ct ? zr_tensor_retain(dst)
            : accumulate     ? zr_tensor_to_raw(dst, ct, dev)
                             : zr_tensor_new_cat(ct, dev, 3, dst->shape, ZR_MEM_WORKSPACE, 0);
        if (!o) goto done;
        zr_qkv_layout L = layout_of(o, gi);
        ZR_CPU_CALL(ct, qkv_rope_backward_cpu, zr_tensor_data(o), data_or_null(gi[0]), data_or_null(gi[1]),
                    data_or_null(gi[2]), zr_tensor_data(G->cos), zr_tensor_data(G->sin), &L, B, T, H, KV, Dh,
                    accumulate);
        st = o == dst ? ZR_OK : zr_tensor_copy_(dst, o);
        goto done;
    }
#ifdef ZR_HAVE_CUDA
    zr_dtype dt = dst->dtype;
    if (dt == ZR_F64) {
        st = zr_error("qkv_rope backward: an f64 gradient buffer on cuda is not supported");
        goto done;
    }
    for (int p = 0; p < 3; p++)
        if (g[p] && !(gi[p] = g[p]->dtype == dt && g[p]->stride[3] == 1 ? zr_tensor_retain(g[p])
                                                                           : zr_tensor_to_raw(g[p], dt, dev)))
            goto done;
    zr_qkv_layout L = layout_of(dst, gi);
    st = zr_dev_status(qkv_rope_backward_cuda(zr_tensor_data(dst), data_or_null(gi[0]), data_or_null(gi[1]),
                                              data_or_null(gi[2]), zr_tensor_data(G->cos), zr_tensor_data(G->sin),
                                              &L, B, T, H, KV, Dh, accumulate, dt, zr_cuda_stream(dev)),
                       "qkv_rope backward", dev);
#else
    st = zr_no_cuda("qkv_rope");
#endif
done:
    for (int p = 0; p < 3; p++) zr_tensor_release(gi[p]);
    zr_tensor_release(o);
    return st;
}

/* End of the group's mark on the product's gradient buffer: the parked gradients become the
 * whole buffer in one pass (parts that got none are zeros); then the mark's reference goes. */
static zr_status qkv_finish(const void *owner, zr_tensor *buf) {
    qkv_group *G = (qkv_group *)owner;
    zr_status st = buf ? grad_into(G, buf, G->pending, 0) : ZR_OK;
    for (int p = 0; p < 3; p++) {
        zr_tensor_release(G->pending[p]);
        G->pending[p] = NULL;
    }
    group_release(G);
    return st;
}

/* i[0] = which output (0 q, 1 k, 2 v); ctx = the group. */
static zr_status qkv_rope_backward(zr_node *n, zr_tensor *g, zr_tensor **gin) {
    qkv_group *G = n->ctx;
    int k = (int)n->i[0];
    zr_edge *e = &n->edges[0];
    zr_tensor *one[3] = {NULL, NULL, NULL};
    one[k] = g;
    if (e->fn) { /* park g until the product's buffer is read (one kernel for all three) */
        zr_tensor *buf;
        int state;
        if (zr_node_input_grad_buffer(n, 0, G, qkv_finish, &buf, &state)) return ZR_ERR;
        if (state == ZR_GRADBUF_SHARED) return grad_into(G, buf, one, 1); /* others wrote there too */
        if (state == ZR_GRADBUF_NEW) G->refcount++; /* the mark's reference, dropped by qkv_finish */
        if (G->pending[k])
            return zr_error("qkv_rope: a second gradient for %s arrived before the product's was read", PART[k]);
        G->pending[k] = zr_tensor_retain(g);
        return ZR_OK;
    }
    zr_tensor *lg = zr_node_leaf_grad(n, 0);
    if (lg && !e->leaf->grad_stale) return grad_into(G, lg, one, 1);
    zr_tensor *z = zr_tensor_new_cat(e->dtype, zr_tensor_device(g), e->ndim, e->shape, ZR_MEM_ACTIVATIONS, 1);
    if (!z) return ZR_ERR;
    return zr_give_grad(gin, z, grad_into(G, z, one, 1));
}

static zr_status check_args(zr_tensor *qkv, int64_t H, int64_t KV, zr_tensor *cos, zr_tensor *sin, int layout) {
    char b1[128], b2[128], b3[128];
    if (zr_check_float("qkv_rope", qkv) || zr_check_float("qkv_rope", cos) || zr_check_float("qkv_rope", sin))
        return ZR_ERR;
    if (zr_check_same_device("qkv_rope", 3, (zr_tensor *[]){qkv, cos, sin})) return ZR_ERR;
    if (qkv->ndim != 3)
        return zr_error("qkv_rope: qkv must be (B, T, (H + 2 KV)·head_dim), got %s", zr_tensor_shape_str(qkv, b1));
    if (H < 1 || KV < 1) return zr_error("qkv_rope: H and KV must be >= 1, got H=%lld KV=%lld", (long long)H, (long long)KV);
    int64_t T = qkv->shape[1], W = qkv->shape[2], nh = H + 2 * KV;
    if (W % nh || (W / nh) % 2 || W == 0)
        return zr_error("qkv_rope: the last dim of qkv %s must be (H + 2 KV)·head_dim = %lld·head_dim with head_dim "
                        "even and > 0", zr_tensor_shape_str(qkv, b1), (long long)nh);
    int64_t Dh = W / nh;
    if (cos->ndim != 2 || cos->shape[0] != T || cos->shape[1] != Dh || !zr_tensor_same_shape(cos, sin))
        return zr_error("qkv_rope: cos %s and sin %s must both be (T, head_dim) = (%lld,%lld) for qkv %s",
                        zr_tensor_shape_str(cos, b1), zr_tensor_shape_str(sin, b2), (long long)T, (long long)Dh,
                        zr_tensor_shape_str(qkv, b3));
    if (layout < ZR_QKV_AUTO || layout > ZR_QKV_BTHD)
        return zr_error("qkv_rope: layout %d unknown (ZR_QKV_AUTO, ZR_QKV_BHTD or ZR_QKV_BTHD)", layout);
    if (!zr_is_cpu(qkv) && qkv->dtype == ZR_F64) {
        char dn[16];
        return zr_error("qkv_rope on %s: f64 is not supported (use f32, bf16 or f16)",
                        zr_device_name(zr_tensor_device(qkv), dn));
    }
    return ZR_OK;
}

zr_status zr_qkv_rope_check(zr_tensor *qkv, int64_t H, int64_t KV, zr_tensor *cos, zr_tensor *sin) {
    return check_args(qkv, H, KV, cos, sin, ZR_QKV_AUTO);
}

/* Runs the forward kernel from qkv into buf's views; sets G's tables. */
static zr_status forward_into(qkv_group *G, zr_tensor *qkv, zr_tensor *cos, zr_tensor *sin, zr_tensor *buf,
                              int layout, int64_t B, int64_t T, int64_t Dh) {
    int64_t H = G->H, KV = G->KV;
    zr_device dev = zr_tensor_device(qkv);
    zr_tensor *xi = NULL, *o = NULL, *v[3] = {NULL, NULL, NULL};
    zr_status st = ZR_ERR;
    if (zr_is_cpu(qkv)) {
        zr_dtype ct = zr_cpu_compute_dtype(qkv->dtype);
        if (!(xi = zr_cpu_in(qkv, ct)) || !(G->cos = zr_cpu_in(cos, ct)) || !(G->sin = zr_cpu_in(sin, ct)) ||
            !(o = zr_cpu_out_begin(buf, ct)) || part_views(o, layout, B, T, H, KV, Dh, v))
            goto done;
        zr_qkv_layout L = layout_of(xi, v);
        ZR_CPU_CALL(ct, qkv_rope_forward_cpu, zr_tensor_data(v[0]), zr_tensor_data(v[1]), zr_tensor_data(v[2]),
                    zr_tensor_data(xi), zr_tensor_data(G->cos), zr_tensor_data(G->sin), &L, B, T, H, KV, Dh);
        st = zr_cpu_out_end(buf, o);
        o = NULL;
        goto done;
    }
#ifdef ZR_HAVE_CUDA
    if (!(xi = qkv->stride[2] == 1 ? zr_tensor_retain(qkv) : zr_tensor_contiguous_raw(qkv)) ||
        !(G->cos = zr_tensor_to_raw(cos, ZR_F32, dev)) || !(G->sin = zr_tensor_to_raw(sin, ZR_F32, dev)) ||
        part_views(buf, layout, B, T, H, KV, Dh, v))
        goto done;
    zr_qkv_layout L = layout_of(xi, v);
    st = zr_dev_status(qkv_rope_forward_cuda(zr_tensor_data(v[0]), zr_tensor_data(v[1]), zr_tensor_data(v[2]),
                                             zr_tensor_data(xi), zr_tensor_data(G->cos), zr_tensor_data(G->sin), &L,
                                             B, T, H, KV, Dh, qkv->dtype, zr_cuda_stream(dev)),
                       "qkv_rope", dev);
#else
    (void)cos, (void)sin, (void)buf, (void)layout, (void)B, (void)T, (void)Dh, (void)dev;
    st = zr_no_cuda("qkv_rope");
#endif
done:
    zr_tensor_release(xi);
    zr_tensor_release(o);
    for (int p = 0; p < 3; p++) zr_tensor_release(v[p]);
    return st;
}

/* zr_qkv_rope's forward into a new buffer (layout resolved), no autograd; G gets the tables. */
static zr_status forward_new(qkv_group *G, zr_tensor *qkv, zr_tensor *cos, zr_tensor *sin, int layout,
                             zr_tensor **out) {
    int64_t B = qkv->shape[0], T = qkv->shape[1], nh = G->H + 2 * G->KV, Dh = qkv->shape[2] / nh;
    zr_device dev = zr_tensor_device(qkv);
    if (layout == ZR_QKV_AUTO) {
        layout = ZR_QKV_BHTD;
#ifdef ZR_HAVE_CUDA
        /* strided q/k/v are read in place by the Hopper attention kernels only */
        if (!zr_is_cpu(qkv) && (zr_cuda_stream(dev), attention_strided_ok(Dh, qkv->dtype))) layout = ZR_QKV_BTHD;
#endif
    }
    int64_t bthd[4] = {B, T, nh, Dh}, flat = B * T * nh * Dh;
    zr_tensor *buf = layout == ZR_QKV_BTHD ? zr_tensor_new_cat(qkv->dtype, dev, 4, bthd, ZR_MEM_ACTIVATIONS, 0)
                                           : zr_tensor_new_cat(qkv->dtype, dev, 1, &flat, ZR_MEM_ACTIVATIONS, 0);
    zr_status st = buf && !forward_into(G, qkv, cos, sin, buf, layout, B, T, Dh) &&
                           !part_views(buf, layout, B, T, G->H, G->KV, Dh, out)
                       ? ZR_OK
                       : ZR_ERR;
    zr_tensor_release(buf);
    return st;
}

zr_status zr_qkv_rope_forward(zr_tensor *qkv, int64_t H, int64_t KV, zr_tensor *cos, zr_tensor *sin,
                              zr_tensor **out, zr_tensor **tab) {
    for (int p = 0; p < 3; p++) out[p] = NULL;
    tab[0] = tab[1] = NULL;
    if (check_args(qkv, H, KV, cos, sin, ZR_QKV_AUTO)) return ZR_ERR;
    qkv_group G = {.refcount = 1, .H = H, .KV = KV};
    zr_status st = forward_new(&G, qkv, cos, sin, ZR_QKV_AUTO, out);
    tab[0] = G.cos, tab[1] = G.sin; /* the caller's now */
    if (st) {
        for (int p = 0; p < 3; p++) {
            zr_tensor_release(out[p]);
            out[p] = NULL;
        }
        for (int i = 0; i < 2; i++) {
            zr_tensor_release(tab[i]);
            tab[i] = NULL;
        }
    }
    return st;
}

zr_status zr_qkv_rope(zr_tensor *qkv, int64_t H, int64_t KV, zr_tensor *cos, zr_tensor *sin, int layout,
                      zr_tensor **out) {
    for (int p = 0; p < 3; p++) out[p] = NULL;
    if (check_args(qkv, H, KV, cos, sin, layout)) return ZR_ERR;
    qkv_group *G = calloc(1, sizeof *G);
    if (!G) return zr_error("qkv_rope: out of host memory");
    G->refcount = 1; /* this function's, dropped at the end */
    G->H = H, G->KV = KV;
    zr_status st = forward_new(G, qkv, cos, sin, layout, out);
    for (int p = 0; p < 3 && !st; p++) {
        zr_node *nd;
        if (zr_autograd_record(out[p], "qkv_rope", qkv_rope_backward, 1, &qkv, &nd)) st = ZR_ERR;
        else if (nd) {
            nd->i[0] = p;
            nd->ctx = G;
            nd->ctx_free = group_release;
            G->refcount++;
        }
    }
    group_release(G);
    if (st)
        for (int p = 0; p < 3; p++) {
            zr_tensor_release(out[p]);
            out[p] = NULL;
        }
    return st;
}

/* --- with Qwen3's q/k norms (zr_qkv_norm_rope) ------------------------------------------------ */

#ifdef ZR_HAVE_CUDA
#include "kernels/cuda/qk_norm_rope.h"
#endif
#include "ops/norm.h"
#include "ops/rope.h"
#include "ops/view.h"

int zr_qkv_norm_rope_fused(zr_device dev, zr_dtype dt, int64_t Dh) {
#ifdef ZR_HAVE_CUDA
    return dev.type != ZR_CPU && (dt == ZR_F32 || dt == ZR_BF16 || dt == ZR_F16) && qk_norm_rope_ok(Dh);
#else
    (void)dev, (void)dt, (void)Dh;
    return 0;
#endif
}

/* split + view (B, T, heads, Dh) + zr_rmsnorm (q, k) + transpose + zr_rope (q, k): Qwen3's layer op
 * by op (zrun.models.llama's unfused path), where the fused kernels do not run. */
static zr_status norm_rope_composed(zr_tensor *qkv, int64_t H, int64_t KV, zr_tensor *wq, zr_tensor *wk, double eps,
                                    zr_tensor *cos, zr_tensor *sin, zr_tensor **out) {
    int64_t B = qkv->shape[0], T = qkv->shape[1], Dh = qkv->shape[2] / (H + 2 * KV), heads[3] = {H, KV, KV};
    int64_t sizes[3] = {H * Dh, KV * Dh, KV * Dh};
    zr_tensor *p[3] = {NULL, NULL, NULL};
    zr_status st = zr_split_sizes(qkv, 3, sizes, 2, p);
    for (int i = 0; i < 3 && !st; i++) {
        int64_t s4[4] = {B, T, heads[i], Dh};
        zr_tensor *v = zr_view(p[i], 4, s4), *nv = v && i < 2 ? zr_rmsnorm(v, i ? wk : wq, eps) : NULL;
        zr_tensor *t = i < 2 ? (nv ? zr_transpose(nv, 1, 2) : NULL) : (v ? zr_transpose(v, 1, 2) : NULL);
        out[i] = t && i < 2 ? zr_rope(t, cos, sin) : t;
        if (i < 2) zr_tensor_release(t);
        zr_tensor_release(v);
        zr_tensor_release(nv);
        if (!out[i]) st = ZR_ERR;
    }
    for (int i = 0; i < 3; i++) zr_tensor_release(p[i]);
    return st;
}

#ifdef ZR_HAVE_CUDA
/* What the three outputs of one fused call share: qkv as the kernel read it, the weights in its
 * dtype, the f32 tables, and which parts this group has written into the product's gradient
 * buffer under its current mark (the others are zeroed when the mark ends). */
typedef struct {
    int refcount;
    int64_t H, KV;
    double eps;
    zr_tensor *x, *w[2], *cos, *sin;
    int written[3];
} norm_group;

static void norm_group_release(void *p) {
    norm_group *G = p;
    if (!G || --G->refcount > 0) return;
    zr_tensor *t[6] = {G->x, G->w[0], G->w[1], G->cos, G->sin, NULL};
    for (int i = 0; i < 5; i++) zr_tensor_release(t[i]);
    free(G);
}

/* Part p's gradient g (NULL: zeros) into dst (qkv's shape, contiguous): written, or added with
 * accumulate; for q and k with dw given, *dw = a new gradient of the part's weight (dtype wdt). */
static zr_status norm_part_into(norm_group *G, zr_tensor *dst, zr_tensor *g, int p, int accumulate, zr_tensor **dw,
                                zr_dtype wdt) {
    int64_t B = dst->shape[0], T = dst->shape[1], H = G->H, KV = G->KV, Dh = dst->shape[2] / (H + 2 * KV);
    zr_device dev = zr_tensor_device(dst);
    zr_dtype dt = dst->dtype;
    zr_tensor *gi = NULL, *ws = NULL;
    zr_status st = ZR_ERR;
    if (g && !(gi = g->dtype == dt && g->stride[3] == 1 ? zr_tensor_retain(g) : zr_tensor_to_raw(g, dt, dev))) goto done;
    if (dw) {
        int64_t nb = (int64_t)qk_norm_rope_backward_workspace(B, T, p ? KV : H, Dh);
        if (!(*dw = zr_tensor_new_cat(wdt, dev, 1, &Dh, ZR_MEM_ACTIVATIONS, 0)) ||
            !(ws = zr_tensor_new_cat(ZR_U8, dev, 1, &nb, ZR_MEM_WORKSPACE, 0)))
            goto done;
    }
    zr_qkv_layout L = {dst->stride[0], dst->stride[1], {{0}}};
    if (gi)
        for (int d = 0; d < 3; d++) L.part[p][d] = gi->stride[d];
    st = zr_dev_status(qk_norm_rope_backward_cuda(zr_tensor_data(dst), gi ? zr_tensor_data(gi) : NULL, &L, p,
                                                  zr_tensor_data(G->x), G->x->stride[0], G->x->stride[1],
                                                  p < 2 ? zr_tensor_data(G->w[p]) : NULL, (float)G->eps,
                                                  zr_tensor_data(G->cos), zr_tensor_data(G->sin),
                                                  dw ? zr_tensor_data(*dw) : NULL, wdt,
                                                  ws ? (float *)zr_tensor_data(ws) : NULL, accumulate, B, T, H, KV,
                                                  Dh, dt, zr_cuda_stream(dev)),
                       "qkv_norm_rope backward", dev);
done:
    zr_tensor_release(gi);
    zr_tensor_release(ws);
    return st;
}

/* End of the group's mark on the product's gradient buffer: the parts no gradient reached are
 * zeros; then the mark's reference goes. */
static zr_status norm_finish(const void *owner, zr_tensor *buf) {
    norm_group *G = (norm_group *)owner;
    zr_status st = ZR_OK;
    for (int p = 0; p < 3; p++) {
        if (buf && !G->written[p] && !st) st = norm_part_into(G, buf, NULL, p, 0, NULL, ZR_F32);
        G->written[p] = 0;
    }
    norm_group_release(G);
    return st;
}

/* i[0] = which output (0 q, 1 k, 2 v); inputs qkv and (q, k) the part's norm weight; ctx = the
 * group. The part's columns of qkv's gradient are computed now, straight into the product's
 * gradient buffer (its other parts by their own nodes, or zeroed when the mark ends). */
static zr_status norm_part_backward(zr_node *n, zr_tensor *g, zr_tensor **gin) {
    norm_group *G = n->ctx;
    int p = (int)n->i[0];
    zr_edge *e = &n->edges[0];
    zr_dtype dt = G->x->dtype;
    zr_tensor *dw = NULL, **pdw = p < 2 && zr_node_needs_grad(n, 1) ? &dw : NULL, *z = NULL;
    zr_dtype wdt = pdw && n->edges[1].dtype != dt ? ZR_F32 : dt;
    zr_status st = ZR_ERR;
    if (zr_node_needs_grad(n, 0) && e->fn) {
        zr_tensor *buf;
        int state;
        if (zr_node_input_grad_buffer(n, 0, G, norm_finish, &buf, &state)) goto done;
        if (state == ZR_GRADBUF_NEW) G->refcount++; /* the mark's reference, dropped by norm_finish */
        if (norm_part_into(G, buf, g, p, state == ZR_GRADBUF_SHARED || G->written[p], pdw, wdt)) goto done;
        if (state != ZR_GRADBUF_SHARED) G->written[p] = 1;
    } else {
        /* a leaf qkv (or none wanting a gradient, the weight's only): into its .grad or a zeroed tensor */
        zr_tensor *lg = zr_node_needs_grad(n, 0) ? zr_node_leaf_grad(n, 0) : NULL;
        if (!(lg && !e->leaf->grad_stale && lg->dtype == dt && zr_tensor_is_contiguous(lg))) {
            lg = z = zr_tensor_new_cat(dt, zr_tensor_device(g), e->ndim, e->shape,
                                       zr_node_needs_grad(n, 0) ? ZR_MEM_ACTIVATIONS : ZR_MEM_WORKSPACE, 1);
            if (!z) goto done;
        }
        if (norm_part_into(G, lg, g, p, 1, pdw, wdt)) goto done;
        if (z && zr_node_needs_grad(n, 0)) {
            gin[0] = z;
            z = NULL;
        }
    }
    zr_tensor *d[2] = {NULL, dw};
    dw = NULL;
    st = zr_give_grads(n, p < 2 ? 2 : 1, d, gin);
    zr_tensor_release(d[1]);
done:
    zr_tensor_release(dw);
    zr_tensor_release(z);
    return st;
}

/* The fused forward into a new buffer (zr_qkv_rope's layouts), one node an output. */
static zr_status norm_rope_fused(zr_tensor *qkv, int64_t H, int64_t KV, zr_tensor *wq, zr_tensor *wk, double eps,
                                 zr_tensor *cos, zr_tensor *sin, int layout, zr_tensor **out) {
    int64_t B = qkv->shape[0], T = qkv->shape[1], nh = H + 2 * KV, Dh = qkv->shape[2] / nh;
    zr_device dev = zr_tensor_device(qkv);
    zr_dtype dt = qkv->dtype;
    zr_tensor *buf = NULL;
    zr_status st = ZR_ERR;
    norm_group *G = calloc(1, sizeof *G);
    if (!G) return zr_error("qkv_norm_rope: out of host memory");
    G->refcount = 1; /* this function's, dropped at the end */
    G->H = H, G->KV = KV, G->eps = eps;
    if (layout == ZR_QKV_AUTO) /* strided q/k/v are read in place by the Hopper attention kernels only */
        layout = (zr_cuda_stream(dev), attention_strided_ok(Dh, dt)) ? ZR_QKV_BTHD : ZR_QKV_BHTD;
    int64_t bthd[4] = {B, T, nh, Dh}, flat = B * T * nh * Dh;
    if (!(G->x = qkv->stride[2] == 1 ? zr_tensor_retain(qkv) : zr_tensor_contiguous_raw(qkv)) ||
        !(G->w[0] = zr_tensor_to_raw(wq, dt, dev)) || !(G->w[1] = zr_tensor_to_raw(wk, dt, dev)) ||
        !(G->cos = zr_tensor_to_raw(cos, ZR_F32, dev)) || !(G->sin = zr_tensor_to_raw(sin, ZR_F32, dev)) ||
        !(buf = layout == ZR_QKV_BTHD ? zr_tensor_new_cat(dt, dev, 4, bthd, ZR_MEM_ACTIVATIONS, 0)
                                      : zr_tensor_new_cat(dt, dev, 1, &flat, ZR_MEM_ACTIVATIONS, 0)) ||
        part_views(buf, layout, B, T, H, KV, Dh, out))
        goto done;
    zr_qkv_layout L = layout_of(G->x, out);
    if (zr_dev_status(qk_norm_rope_forward_cuda(zr_tensor_data(out[0]), zr_tensor_data(out[1]), zr_tensor_data(out[2]),
                                                zr_tensor_data(G->x), zr_tensor_data(G->w[0]), zr_tensor_data(G->w[1]),
                                                (float)eps, zr_tensor_data(G->cos), zr_tensor_data(G->sin), &L, B, T,
                                                H, KV, Dh, dt, zr_cuda_stream(dev)),
                      "qkv_norm_rope", dev))
        goto done;
    st = ZR_OK;
    for (int p = 0; p < 3 && !st; p++) {
        zr_node *nd;
        zr_tensor *in[2] = {qkv, p == 0 ? wq : wk};
        if (zr_autograd_record(out[p], "qkv_norm_rope", norm_part_backward, p < 2 ? 2 : 1, in, &nd)) st = ZR_ERR;
        else if (nd) {
            nd->i[0] = p;
            nd->ctx = G;
            nd->ctx_free = norm_group_release;
            G->refcount++;
        }
    }
done:
    zr_tensor_release(buf);
    norm_group_release(G);
    return st;
}
#endif

zr_status zr_qkv_norm_rope(zr_tensor *qkv, int64_t H, int64_t KV, zr_tensor *wq, zr_tensor *wk, double eps,
                           zr_tensor *cos, zr_tensor *sin, int layout, zr_tensor **out) {
    char b1[64], b2[64];
    for (int p = 0; p < 3; p++) out[p] = NULL;
    if (check_args(qkv, H, KV, cos, sin, layout)) return ZR_ERR;
    int64_t Dh = qkv->shape[2] / (H + 2 * KV);
    if (!wq || !wk || wq->ndim != 1 || wk->ndim != 1 || wq->shape[0] != Dh || wk->shape[0] != Dh)
        return zr_error("qkv_norm_rope: the q and k norms' weights must both be (head_dim,) = (%lld,), got %s and %s",
                        (long long)Dh, wq ? zr_tensor_shape_str(wq, b1) : "none", wk ? zr_tensor_shape_str(wk, b2) : "none");
    if (zr_check_float("qkv_norm_rope", wq) || zr_check_float("qkv_norm_rope", wk) ||
        zr_check_same_device("qkv_norm_rope", 3, (zr_tensor *[]){qkv, wq, wk}))
        return ZR_ERR;
    zr_status st;
#ifdef ZR_HAVE_CUDA
    if (zr_qkv_norm_rope_fused(zr_tensor_device(qkv), qkv->dtype, Dh))
        st = norm_rope_fused(qkv, H, KV, wq, wk, eps, cos, sin, layout, out);
    else
#endif
        st = norm_rope_composed(qkv, H, KV, wq, wk, eps, cos, sin, out);
    if (st)
        for (int p = 0; p < 3; p++) {
            zr_tensor_release(out[p]);
            out[p] = NULL;
        }
    return st;
}
