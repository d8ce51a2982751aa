/* Embedding: forward (row gather) and backward (dense scatter-add) side by side (see
 * ops_embedding.h). Saved for backward: the ids as contiguous i64. */
#include "ops_embedding.h"

#include <string.h>

#include "ops_util.h"

/* saved[0] = ids (i64, contiguous); edge 0 = weight (V, D). */
static zr_status embedding_backward(zr_node *n, zr_tensor *g, zr_tensor **gin) {
    zr_tensor *ids = n->saved[0];
    zr_edge *e = &n->edges[0];
    zr_dtype ct = zr_cpu_compute_dtype(e->dtype);
    zr_tensor *gw = zr_tensor_new_cat(ct, zr_tensor_device(g), 2, e->shape, ZR_MEM_ACTIVATIONS, 1);
    zr_tensor *gi = gw ? zr_cpu_in(g, ct) : NULL;
    if (!gi) {
        zr_tensor_release(gw);
        return ZR_ERR;
    }
    ZR_CPU_CALL(ct, embedding_backward_cpu, zr_tensor_data(gw), zr_tensor_data(gi),
                (const int64_t *)zr_tensor_data(ids), zr_tensor_numel(ids), e->shape[1]);
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
    if (!zr_is_cpu(weight)) return zr_no_cuda("embedding"), NULL;
    int64_t v = weight->shape[0], d = weight->shape[1], nid = zr_tensor_numel(ids);
    zr_device dev = zr_tensor_device(weight);
    zr_tensor *idx = zr_tensor_to_raw(ids, ZR_I64, dev), *wi = NULL, *out = NULL;
    if (!idx) return NULL;
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
