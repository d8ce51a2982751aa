/* Embedding: forward (row gather) and backward (dense scatter-add) side by side (see
 * ops/embedding.h). Saved for backward: the ids as contiguous i64. */
#include "ops/embedding.h"

#include <string.h>

#include "ops/util.h"

/* --- CUDA path (kernels/cuda/embedding.h): a gather forward and a deterministic (sorted, no
 * atomics) scatter backward in the table's dtype. Ids are not range-checked on the host (that
 * would wait for the GPU): an out-of-range id gives a zero row and no gradient. --- */
#ifdef ZR_HAVE_CUDA
#include "cuda/device.h"
#include "kernels/cuda/embedding.h"
#endif

/* The table's gradient lg (its leaf's .grad), made ready for the rows to be added into it: a stale one
 * (the engine's zero_grad left it unfilled) zeroed first. */
static zr_status leaf_grad_ready(zr_tensor *leaf, zr_tensor *lg) {
    if (leaf->grad_stale && zr_tensor_fill_(lg, 0)) return ZR_ERR;
    leaf->grad_stale = 0;
    return ZR_OK;
}

static zr_status embedding_backward_dev(zr_node *n, zr_tensor *g, zr_tensor **gin) {
#ifdef ZR_HAVE_CUDA
    zr_tensor *ids = n->saved[0];
    zr_edge *e = &n->edges[0];
    zr_device dev = zr_tensor_device(g);
    zr_dtype dt = e->dtype == ZR_F64 ? ZR_F32 : e->dtype;
    int64_t N = zr_tensor_numel(ids), V = e->shape[0], D = e->shape[1];
    size_t wsz = embedding_backward_workspace_size(N, V);
    zr_tensor *gi = zr_tensor_to_raw(g, dt, dev);
    zr_tensor *ws = gi && wsz ? zr_tensor_new_cat(ZR_U8, dev, 1, (int64_t[]){(int64_t)wsz}, ZR_MEM_WORKSPACE, 0) : NULL;
    zr_tensor *gw = NULL;
    zr_status st = ZR_ERR;
    if (!gi || (wsz && !ws)) goto done;
    void *wsp = ws ? zr_tensor_data(ws) : NULL;
    /* A 16-bit table whose gradient is a tensor already, fp32 or its own dtype (the ZeRO engine's
     * partition, which for tied weights already holds the head's dW): add the rows the ids name
     * straight into it, instead of a dense (V, D) gradient and a pass over the whole table. */
    zr_tensor *lg = (dt == ZR_BF16 || dt == ZR_F16) && V * D > 0 ? zr_node_leaf_grad(n, 0) : NULL;
    if (lg && (lg->dtype == ZR_F32 || lg->dtype == dt)) {
        if (leaf_grad_ready(e->leaf, lg)) goto done;
        int rc = lg->dtype == ZR_F32
                     ? embedding_backward_add_f32_cuda(zr_tensor_data(lg), zr_tensor_data(gi), zr_tensor_data(ids), wsp,
                                                       N, V, D, dt, zr_cuda_stream(dev))
                     : embedding_backward_cuda(zr_tensor_data(lg), zr_tensor_data(gi), zr_tensor_data(ids), wsp, N, V,
                                               D, 1, dt, zr_cuda_stream(dev));
        if (rc != -2) { /* nothing to hand back: the leaf's gradient holds it */
            st = zr_dev_status(rc, "embedding backward", dev);
            goto done;
        }
    }
    if (!(gw = zr_tensor_new_cat(dt, dev, 2, e->shape, ZR_MEM_ACTIVATIONS, 0))) goto done;
    st = V * D == 0 ? ZR_OK
                    : zr_dev_status(embedding_backward_cuda(zr_tensor_data(gw), zr_tensor_data(gi), zr_tensor_data(ids),
                                                            wsp, N, V, D, 0, dt, zr_cuda_stream(dev)),
                                    "embedding backward", dev);
done:
    zr_tensor_release(gi);
    zr_tensor_release(ws);
    if (!st && gw && gw->dtype != e->dtype) {
        zr_tensor *c = zr_tensor_to_raw(gw, e->dtype, dev);
        zr_tensor_release(gw);
        gw = c;
        if (!gw) st = ZR_ERR;
    }
    return zr_give_grad(gin, gw, st);
#else
    (void)n, (void)g, (void)gin;
    return zr_no_cuda("embedding");
#endif
}

static zr_status embedding_forward_dev(zr_tensor *out, zr_tensor *weight, zr_tensor *idx) {
#ifdef ZR_HAVE_CUDA
    zr_device dev = zr_tensor_device(weight);
    int64_t V = weight->shape[0], D = weight->shape[1], N = zr_tensor_numel(idx);
    if (N * D == 0) return ZR_OK;
    if (V == 0) return zr_tensor_fill_(out, 0);
    zr_dtype dt = weight->dtype == ZR_F64 ? ZR_F32 : weight->dtype;
    zr_tensor *wi = zr_tensor_to_raw(weight, dt, dev);
    zr_tensor *o = wi ? (dt == out->dtype ? zr_tensor_retain(out)
                                          : zr_tensor_new_cat(dt, dev, out->ndim, out->shape, ZR_MEM_WORKSPACE, 0))
                      : NULL;
    zr_status st = ZR_ERR;
    if (o) {
        st = zr_dev_status(embedding_forward_cuda(zr_tensor_data(o), zr_tensor_data(wi), zr_tensor_data(idx), N, V, D,
                                                  dt, zr_cuda_stream(dev)),
                           "embedding", dev);
        if (!st && o != out) st = zr_tensor_copy_(out, o);
    }
    zr_tensor_release(wi);
    zr_tensor_release(o);
    return st;
#else
    (void)out, (void)weight, (void)idx;
    return zr_no_cuda("embedding");
#endif
}

/* saved[0] = ids (i64, contiguous); edge 0 = weight (V, D). */
static zr_status embedding_backward(zr_node *n, zr_tensor *g, zr_tensor **gin) {
    zr_tensor *ids = n->saved[0];
    zr_edge *e = &n->edges[0];
    if (!zr_is_cpu(g)) return embedding_backward_dev(n, g, gin);
    zr_dtype ct = zr_cpu_compute_dtype(e->dtype);
    const int64_t *idp = (const int64_t *)zr_tensor_data(ids);
    int64_t N = zr_tensor_numel(ids), D = e->shape[1];
    /* A gradient the table has already, in the compute dtype: the rows the ids name added straight
     * into it (a stale one zeroed first), as the GPU path does. A dense (V, D) gradient would be
     * a table-sized allocation, its zeroing and the engine's add into .grad at every backward. */
    zr_tensor *lg = zr_node_leaf_grad(n, 0);
    if (lg && lg->dtype == ct) {
        zr_tensor *gi = zr_cpu_in(g, ct);
        if (!gi || leaf_grad_ready(e->leaf, lg)) {
            zr_tensor_release(gi);
            return ZR_ERR;
        }
        ZR_CPU_CALL(ct, embedding_backward_cpu, zr_tensor_data(lg), zr_tensor_data(gi), idp, N, D);
        zr_tensor_release(gi);
        return ZR_OK;
    }
    zr_tensor *gw = zr_tensor_new_cat(ct, zr_tensor_device(g), 2, e->shape, ZR_MEM_ACTIVATIONS, 1);
    zr_tensor *gi = gw ? zr_cpu_in(g, ct) : NULL;
    if (!gi) {
        zr_tensor_release(gw);
        return ZR_ERR;
    }
    ZR_CPU_CALL(ct, embedding_backward_cpu, zr_tensor_data(gw), zr_tensor_data(gi), idp, N, D);
    zr_tensor_release(gi);
    if (gw->dtype != e->dtype) {
        zr_tensor *c = zr_tensor_to_raw(gw, e->dtype, zr_tensor_device(gw));
        zr_tensor_release(gw);
        if (!(gw = c)) return ZR_ERR;
    }
    gin[0] = gw;
    return ZR_OK;
}

zr_tensor *zr_embedding(zr_tensor *weight, zr_tensor *ids) {
    char b1[128];
    if (!weight || !ids) return zr_error_null("embedding: missing weight or ids");
    if (zr_check_float("embedding", weight)) return NULL;
    if (weight->ndim != 2)
        return zr_error_null("embedding: weight must be 2-D (num_embeddings, dim), got %s",
                             zr_tensor_shape_str(weight, b1));
    if (ids->dtype != ZR_I64 && ids->dtype != ZR_I32)
        return zr_error_null("embedding: ids must be i64 or i32, got %s", zr_dtype_name(ids->dtype));
    if (ids->ndim + 1 > ZR_MAX_DIMS)
        return zr_error_null("embedding: ids have %d dims; at most %d are supported", ids->ndim,
                             ZR_MAX_DIMS - 1);
    if (zr_check_same_device("embedding", 2, (zr_tensor *[]){weight, ids})) return NULL;
    int64_t v = weight->shape[0], d = weight->shape[1], nid = zr_tensor_numel(ids);
    zr_device dev = zr_tensor_device(weight);
    zr_tensor *idx = zr_tensor_to_raw(ids, ZR_I64, dev), *wi = NULL, *out = NULL;
    if (!idx) return NULL;
    if (!zr_is_cpu(weight)) {
        int64_t shape[ZR_MAX_DIMS];
        for (int i = 0; i < ids->ndim; i++) shape[i] = ids->shape[i];
        shape[ids->ndim] = d;
        out = zr_tensor_new_cat(weight->dtype, dev, ids->ndim + 1, shape, ZR_MEM_ACTIVATIONS, 0);
        if (!out || embedding_forward_dev(out, weight, idx)) goto fail;
        goto record;
    }
    const int64_t *p = zr_tensor_data(idx);
    for (int64_t i = 0; i < nid; i++)
        if (p[i] < 0 || p[i] >= v) {
            zr_error("embedding: id %lld (at flat position %lld) is out of range for a table of "
                     "V = %lld rows (ids are 0-based: 0..%lld)", (long long)p[i], (long long)i + 1,
                     (long long)v, (long long)v - 1);
            goto fail;
        }
    int64_t shape[ZR_MAX_DIMS];
    for (int i = 0; i < ids->ndim; i++) shape[i] = ids->shape[i];
    shape[ids->ndim] = d;
    out = zr_tensor_new_cat(weight->dtype, dev, ids->ndim + 1, shape, ZR_MEM_ACTIVATIONS, 0);
    /* A gather needs no arithmetic: every dtype is copied as stored (a bf16 table is not widened). */
    if (!out || !(wi = zr_tensor_contiguous_raw(weight))) goto fail;
    if (weight->dtype == ZR_F32 || weight->dtype == ZR_F64) {
        ZR_CPU_CALL(weight->dtype, embedding_forward_cpu, zr_tensor_data(out), zr_tensor_data(wi),
                    p, nid, d);
    } else {
        size_t row = (size_t)d * zr_dtype_size(weight->dtype);
        char *dst = zr_tensor_data(out);
        const char *src = zr_tensor_data(wi);
        for (int64_t i = 0; i < nid; i++) memcpy(dst + (size_t)i * row, src + (size_t)p[i] * row, row);
    }
record:;
    zr_node *n;
    if (zr_autograd_record(out, "embedding", embedding_backward, 1, &weight, &n)) goto fail;
    if (n && zr_node_save(n, idx)) goto fail;
    zr_tensor_release(idx);
    zr_tensor_release(wi);
    return out;
fail:
    zr_tensor_release(idx);
    zr_tensor_release(wi);
    zr_tensor_release(out);
    return NULL;
}
