/* RoPE forward/backward and the cos/sin tables (see ops/rope.h). */
#include "ops/rope.h"

#include "ops/util.h"

/* saved: cos, sin (compute dtype, contiguous) */
static zr_status rope_backward(zr_node *n, zr_tensor *g, zr_tensor **gin) {
    zr_tensor *c = n->saved[0], *s = n->saved[1];
    zr_dtype ct = c->dtype;
    zr_edge *e = &n->edges[0];
    zr_tensor *gi = zr_cpu_in(g, ct);
    zr_tensor *dx = gi ? zr_tensor_new_cat(ct, zr_tensor_device(g), e->ndim, e->shape, ZR_MEM_ACTIVATIONS, 0) : NULL;
    if (!dx) {
        zr_tensor_release(gi);
        return ZR_ERR;
    }
    int64_t T = e->shape[2], Dh = e->shape[3];
    ZR_CPU_CALL(ct, rope_backward_cpu, zr_tensor_data(dx), zr_tensor_data(gi), zr_tensor_data(c),
                zr_tensor_data(s), e->shape[0] * e->shape[1], T, Dh, c->shape[1]);
    zr_tensor_release(gi);
    if (e->dtype != ct) {
        zr_tensor *r = zr_tensor_to_raw(dx, e->dtype, zr_tensor_device(dx));
        zr_tensor_release(dx);
        if (!(dx = r)) return ZR_ERR;
    }
    gin[0] = dx;
    return ZR_OK;
}

/* --- CUDA path (kernels/cuda/rope.h). The kernel takes (T, Dh/2) f32 tables: the first halves
 * of cos and sin, narrowed and converted per call (tiny; nothing is cached). That is exact for
 * tables in the rotate_half layout built by zr.rope_tables (and Hugging Face), whose two halves
 * are equal; tables whose halves differ are not supported on CUDA. x read as the transpose of a
 * contiguous (B, T, H, Dh) projection (the attention layout) is used in place (the kernel's BTHD
 * layout fuses the transpose), and its gradient is returned in that same layout, so the
 * projection's backward needs no transposing copy either. --- */
#ifdef ZR_HAVE_CUDA
#include "cuda/device.h"
#include "kernels/cuda/rope.h"

/* Contiguous f32 (T, Dh/2) first half of a (T, Dh) table. */
static zr_tensor *half_table(zr_tensor *t) {
    zr_tensor *v = zr_tensor_narrow_raw(t, 1, 0, t->shape[1] / 2);
    zr_tensor *r = v ? zr_tensor_to_raw(v, ZR_F32, zr_tensor_device(t)) : NULL;
    zr_tensor_release(v);
    return r;
}

/* True when x (B, H, T, Dh) is the (1,2)-transpose of a contiguous (B, T, H, Dh) tensor. */
static int is_bthd(const zr_tensor *x) {
    const int64_t *s = x->shape, *st = x->stride;
    return (st[3] == 1 || s[3] == 1) && (st[1] == s[3] || s[1] == 1) && (st[2] == s[1] * s[3] || s[2] == 1) &&
           (st[0] == s[2] * s[1] * s[3] || s[0] == 1);
}

/* saved: cos, sin halves (T, Dh/2) f32; i[0] = layout of the input. The kernel rotates q and k
 * together; with Hkv = 0 the k side is empty (its pointers repeat q's only to pass the checks). */
static zr_status rope_backward_dev(zr_node *n, zr_tensor *g, zr_tensor **gin) {
    zr_tensor *c = n->saved[0], *sn = n->saved[1];
    zr_edge *e = &n->edges[0];
    zr_device dev = zr_tensor_device(g);
    int layout = (int)n->i[0];
    int64_t B = e->shape[0], H = e->shape[1], T = e->shape[2], Dh = e->shape[3];
    int64_t bthd[4] = {B, T, H, Dh};
    zr_tensor *gi = zr_tensor_to_raw(g, e->dtype, dev);
    zr_tensor *dx = gi ? zr_tensor_new_cat(e->dtype, dev, 4, layout == ZR_ROPE_BTHD ? bthd : e->shape,
                                           ZR_MEM_ACTIVATIONS, 0)
                       : NULL;
    zr_status st = ZR_ERR;
    if (dx)
        st = zr_dev_status(rope_backward_cuda(zr_tensor_data(dx), zr_tensor_data(dx), zr_tensor_data(gi), zr_tensor_data(gi),
                                              zr_tensor_data(c),
                                              zr_tensor_data(sn), B, H, 0, T, Dh, layout, e->dtype,
                                              zr_cuda_stream(dev)),
                           "rope backward", dev);
    zr_tensor_release(gi);
    if (!st && layout == ZR_ROPE_BTHD) {
        zr_tensor *v = zr_tensor_transpose_raw(dx, 1, 2);
        zr_tensor_release(dx);
        if (!(dx = v)) st = ZR_ERR;
    }
    return zr_give_grad(gin, dx, st);
}
#endif

#ifdef ZR_HAVE_CUDA
/* Partial rotary (tables narrower than the head): a contiguous copy of the input rotated in place
 * (the channels past the tables' width stay copied), and so the gradient. saved: cos, sin halves
 * (T, R/2) f32. */
static zr_status rope_partial_backward_dev(zr_node *n, zr_tensor *g, zr_tensor **gin) {
    zr_tensor *c = n->saved[0], *sn = n->saved[1];
    zr_edge *e = &n->edges[0];
    zr_device dev = zr_tensor_device(g);
    zr_tensor *dx = zr_tensor_clone_raw(g);
    zr_tensor *dc = dx && dx->dtype != e->dtype ? zr_tensor_to_raw(dx, e->dtype, dev) : NULL;
    if (dc) {
        zr_tensor_release(dx);
        dx = dc;
    }
    zr_status st = dx ? ZR_OK : ZR_ERR;
    if (!st)
        st = zr_dev_status(rope_partial_cuda(zr_tensor_data(dx), zr_tensor_data(c), zr_tensor_data(sn),
                                             e->shape[0] * e->shape[1], e->shape[2], e->shape[3],
                                             2 * c->shape[1], 1, e->dtype, zr_cuda_stream(dev)),
                           "rope backward", dev);
    return zr_give_grad(gin, dx, st);
}

static zr_tensor *rope_partial_dev(zr_tensor *x, zr_tensor *cos, zr_tensor *sin) {
    zr_device dev = zr_tensor_device(x);
    zr_tensor *out = zr_tensor_clone_raw(x);
    zr_tensor *c = out ? half_table(cos) : NULL, *sn = c ? half_table(sin) : NULL;
    zr_node *n;
    if (!sn) goto fail;
    if (zr_dev_status(rope_partial_cuda(zr_tensor_data(out), zr_tensor_data(c), zr_tensor_data(sn),
                                        x->shape[0] * x->shape[1], x->shape[2], x->shape[3], cos->shape[1], 0,
                                        x->dtype, zr_cuda_stream(dev)),
                      "rope", dev))
        goto fail;
    if (zr_autograd_record(out, "rope", rope_partial_backward_dev, 1, &x, &n)) goto fail;
    if (n && (zr_node_save(n, c) || zr_node_save(n, sn))) goto fail;
    zr_tensor_release(c);
    zr_tensor_release(sn);
    return out;
fail:
    zr_tensor_release(c);
    zr_tensor_release(sn);
    zr_tensor_release(out);
    return NULL;
}
#endif

static zr_tensor *rope_dev(zr_tensor *x, zr_tensor *cos, zr_tensor *sin) {
#ifdef ZR_HAVE_CUDA
    zr_device dev = zr_tensor_device(x);
    char dn[16];
    if (x->dtype == ZR_F64)
        return zr_error_null("rope on %s: f64 is not supported (use f32, bf16 or f16)", zr_device_name(dev, dn));
    if (cos->shape[1] < x->shape[3]) return rope_partial_dev(x, cos, sin);
    int64_t B = x->shape[0], H = x->shape[1], T = x->shape[2], Dh = x->shape[3];
    int layout = zr_tensor_is_contiguous(x) ? ZR_ROPE_BHTD : is_bthd(x) ? ZR_ROPE_BTHD : -1;
    zr_tensor *xi = layout >= 0 ? zr_tensor_retain(x) : zr_tensor_contiguous_raw(x);
    if (layout < 0) layout = ZR_ROPE_BHTD;
    zr_tensor *c = xi ? half_table(cos) : NULL, *sn = c ? half_table(sin) : NULL;
    zr_tensor *out = sn ? zr_tensor_new_cat(x->dtype, dev, 4, x->shape, ZR_MEM_ACTIVATIONS, 0) : NULL;
    zr_node *n;
    if (!out) goto fail;
    if (zr_dev_status(rope_forward_cuda(zr_tensor_data(out), zr_tensor_data(out), zr_tensor_data(xi), zr_tensor_data(xi),
                                        zr_tensor_data(c),
                                        zr_tensor_data(sn), B, H, 0, T, Dh, layout, x->dtype, zr_cuda_stream(dev)),
                      "rope", dev))
        goto fail;
    if (zr_autograd_record(out, "rope", rope_backward_dev, 1, &x, &n)) goto fail;
    if (n) {
        n->i[0] = layout;
        if (zr_node_save(n, c) || zr_node_save(n, sn)) goto fail;
    }
    zr_tensor_release(xi);
    zr_tensor_release(c);
    zr_tensor_release(sn);
    return out;
fail:
    zr_tensor_release(xi);
    zr_tensor_release(c);
    zr_tensor_release(sn);
    zr_tensor_release(out);
    return NULL;
#else
    (void)x, (void)cos, (void)sin;
    return zr_no_cuda("rope"), NULL;
#endif
}

zr_tensor *zr_rope(zr_tensor *x, zr_tensor *cos, zr_tensor *sin) {
    char b1[128], b2[128], b3[128];
    if (zr_check_float("rope", x) || zr_check_float("rope", cos) || zr_check_float("rope", sin)) return NULL;
    if (zr_check_same_device("rope", 3, (zr_tensor *[]){x, cos, sin})) return NULL;
    if (x->ndim != 4)
        return zr_error_null("rope: x must be (B, H, T, head_dim), got %s", zr_tensor_shape_str(x, b1));
    int64_t T = x->shape[2], Dh = x->shape[3];
    if (cos->ndim != 2 || sin->ndim != 2 || cos->shape[0] != T || cos->shape[1] > Dh || cos->shape[1] < 1 ||
        !zr_tensor_same_shape(cos, sin))
        return zr_error_null("rope: cos %s and sin %s must both be (T, rotary_dim) = (%lld, <= %lld) for x %s",
                             zr_tensor_shape_str(cos, b1), zr_tensor_shape_str(sin, b2), (long long)T,
                             (long long)Dh, zr_tensor_shape_str(x, b3));
    int64_t R = cos->shape[1];
    if (R % 2)
        return zr_error_null("rope: the rotary dim (the tables' width) must be even (rotate_half pairs i with "
                             "i + rotary_dim/2), cos is %s", zr_tensor_shape_str(cos, b1));
    if (!zr_is_cpu(x)) return rope_dev(x, cos, sin);
    zr_dtype ct = zr_cpu_compute_dtype(x->dtype);
    zr_tensor *out = zr_tensor_new_cat(x->dtype, zr_tensor_device(x), 4, x->shape, ZR_MEM_ACTIVATIONS, 0);
    zr_tensor *xi = out ? zr_cpu_in(x, ct) : NULL;
    zr_tensor *ci = xi ? zr_cpu_in(cos, ct) : NULL, *si = ci ? zr_cpu_in(sin, ct) : NULL;
    zr_tensor *o = si ? zr_cpu_out_begin(out, ct) : NULL;
    if (!o) goto fail;
    ZR_CPU_CALL(ct, rope_forward_cpu, zr_tensor_data(o), zr_tensor_data(xi), zr_tensor_data(ci),
                zr_tensor_data(si), x->shape[0] * x->shape[1], T, Dh, R);
    zr_status st = zr_cpu_out_end(out, o);
    o = NULL;
    if (st) goto fail;
    zr_node *n;
    if (zr_autograd_record(out, "rope", rope_backward, 1, &x, &n)) goto fail;
    if (n && (zr_node_save(n, ci) || zr_node_save(n, si))) goto fail;
    zr_tensor_release(xi);
    zr_tensor_release(ci);
    zr_tensor_release(si);
    return out;
fail:
    zr_tensor_release(o);
    zr_tensor_release(xi);
    zr_tensor_release(ci);
    zr_tensor_release(si);
    zr_tensor_release(out);
    return NULL;
}

zr_rope_config zr_rope_config_default(void) {
    zr_rope_config c = {0};
    c.theta = 10000.0;
    c.attention_scale = 1.0;
    return c;
}

static zr_status check_config(int64_t head_dim, const zr_rope_config *c) {
    if (head_dim <= 0 || head_dim % 2)
        return zr_error("rope_tables: head_dim must be a positive even number, got %lld", (long long)head_dim);
    if (!(c->theta > 0)) return zr_error("rope_tables: theta must be > 0, got %g", c->theta);
    for (int64_t i = 0; c->ext_factors && i < head_dim / 2; i++)
        if (!(c->ext_factors[i] > 0))
            return zr_error("rope_tables: longrope factor %lld must be > 0, got %g", (long long)(i + 1),
                            c->ext_factors[i]);
    if (c->yarn && (!(c->factor > 0) || !(c->yarn_high > c->yarn_low)))
        return zr_error("rope_tables: yarn needs factor > 0 and a correction range low < high, got factor %g, "
                        "range %g .. %g", c->factor, c->yarn_low, c->yarn_high);
    if (c->llama3) {
        if (!(c->factor > 0)) return zr_error("rope_tables: llama3 rope_scaling.factor must be > 0, got %g", c->factor);
        if (!(c->original_max_position_embeddings > 0))
            return zr_error("rope_tables: llama3 rope_scaling.original_max_position_embeddings must be > 0, got %g",
                            c->original_max_position_embeddings);
        if (!(c->low_freq_factor > 0) || !(c->high_freq_factor > c->low_freq_factor))
            return zr_error("rope_tables: llama3 rope_scaling needs 0 < low_freq_factor < high_freq_factor, "
                            "got %g and %g", c->low_freq_factor, c->high_freq_factor);
    }
    return ZR_OK;
}

zr_tensor *zr_rope_inv_freq(int64_t head_dim, const zr_rope_config *c, zr_dtype dt) {
    if (check_config(head_dim, c)) return NULL;
    zr_dtype ct = zr_cpu_compute_dtype(dt);
    int64_t h = head_dim / 2;
    zr_tensor *inv = zr_tensor_new(ct, zr_cpu(), 1, &h);
    if (!inv) return NULL;
    ZR_CPU_CALL(ct, rope_inv_freq_cpu, zr_tensor_data(inv), head_dim, c->theta, c->llama3, c->factor,
                c->low_freq_factor, c->high_freq_factor, c->original_max_position_embeddings, c->ext_factors,
                c->yarn, c->yarn_low, c->yarn_high);
    return inv;
}

zr_status zr_rope_tables(int64_t T, int64_t head_dim, const zr_rope_config *c, zr_dtype dt,
                         zr_tensor **cos, zr_tensor **sin) {
    *cos = *sin = NULL;
    if (T < 0) return zr_error("rope_tables: T must be >= 0, got %lld", (long long)T);
    if (!zr_dtype_is_float(dt)) return zr_error("rope_tables: dtype must be a float type, got %s", zr_dtype_name(dt));
    zr_dtype ct = zr_cpu_compute_dtype(dt);
    zr_tensor *inv = zr_rope_inv_freq(head_dim, c, ct);
    if (!inv) return ZR_ERR;
    int64_t shape[2] = {T, head_dim};
    zr_tensor *cc = zr_tensor_new(ct, zr_cpu(), 2, shape), *ss = cc ? zr_tensor_new(ct, zr_cpu(), 2, shape) : NULL;
    if (!ss) goto fail;
    ZR_CPU_CALL(ct, rope_tables_cpu, zr_tensor_data(cc), zr_tensor_data(ss), zr_tensor_data(inv), T,
                head_dim, c->offset, c->attention_scale);
    zr_tensor_release(inv);
    inv = NULL;
    if (dt != ct) {
        zr_tensor *c2 = zr_tensor_to_raw(cc, dt, zr_cpu()), *s2 = c2 ? zr_tensor_to_raw(ss, dt, zr_cpu()) : NULL;
        zr_tensor_release(cc);
        zr_tensor_release(ss);
        cc = c2;
        ss = s2;
        if (!s2) goto fail;
    }
    *cos = cc;
    *sin = ss;
    return ZR_OK;
fail:
    zr_tensor_release(inv);
    zr_tensor_release(cc);
    zr_tensor_release(ss);
    return ZR_ERR;
}
