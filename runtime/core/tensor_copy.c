/* Copies, casts, fills and element access for tensors. CPU work is done here (strided, any
 * dtype pair); GPU work goes through hooks the CUDA backend installs. */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "core/tensor.h"

static zr_copy_fn device_copy;
static zr_device_copy_fn device_strided_copy;
static zr_device_fill_fn device_fill;

void zr_tensor_set_device_copy(zr_copy_fn fn) { device_copy = fn; }
void zr_tensor_set_device_ops(zr_device_copy_fn copy, zr_device_fill_fn fill) {
    device_strided_copy = copy;
    device_fill = fill;
}

static inline double load(const void *p, zr_dtype t) {
    switch (t) {
    case ZR_F32: return *(const float *)p;
    case ZR_BF16: return zr_bf16_to_f32(*(const uint16_t *)p);
    case ZR_F16: return zr_f16_to_f32(*(const uint16_t *)p);
    case ZR_F64: return *(const double *)p;
    case ZR_I32: return *(const int32_t *)p;
    case ZR_I64: return (double)*(const int64_t *)p;
    case ZR_U8: return *(const uint8_t *)p;
    default: return 0;
    }
}

static inline void store(void *p, zr_dtype t, double v) {
    switch (t) {
    case ZR_F32: *(float *)p = (float)v; break;
    case ZR_BF16: *(uint16_t *)p = zr_f32_to_bf16((float)v); break;
    case ZR_F16: *(uint16_t *)p = zr_f32_to_f16((float)v); break;
    case ZR_F64: *(double *)p = v; break;
    case ZR_I32: *(int32_t *)p = (int32_t)v; break;
    case ZR_I64: *(int64_t *)p = (int64_t)v; break;
    case ZR_U8: *(uint8_t *)p = (uint8_t)v; break;
    default: break;
    }
}

/* Storage offset (elements) of the i-th element in row-major logical order. */
static inline int64_t elem_offset(const zr_tensor *t, int64_t i) {
    int64_t off = t->offset;
    for (int d = t->ndim - 1; d >= 0; d--) {
        int64_t sz = t->shape[d];
        off += (i % sz) * t->stride[d];
        i /= sz;
    }
    return off;
}

/* n contiguous elements cast, on this thread: the common pairs as typed loops the compiler vectorises,
 * the rest through double. */
static void cast_run(void *dst, zr_dtype dt, const void *src, zr_dtype st, int64_t n) {
    if (dt == ZR_F32 && st == ZR_BF16) {
        float *d = dst;
        const uint16_t *s = src;
        for (int64_t i = 0; i < n; i++) d[i] = zr_bf16_to_f32(s[i]);
    } else if (dt == ZR_BF16 && st == ZR_F32) {
        uint16_t *d = dst;
        const float *s = src;
        for (int64_t i = 0; i < n; i++) d[i] = zr_f32_to_bf16(s[i]);
    } else if (dt == ZR_F64 && st == ZR_F32) {
        double *d = dst;
        const float *s = src;
        for (int64_t i = 0; i < n; i++) d[i] = s[i];
    } else if (dt == ZR_F32 && st == ZR_F64) {
        float *d = dst;
        const double *s = src;
        for (int64_t i = 0; i < n; i++) d[i] = (float)s[i];
    } else {
        size_t ds = zr_dtype_size(dt), ss = zr_dtype_size(st);
        for (int64_t i = 0; i < n; i++)
            store((char *)dst + i * (int64_t)ds, dt, load((const char *)src + i * (int64_t)ss, st));
    }
}

#define CAST_CHUNK 16384 /* elements a task */

void zr_cast_contiguous(void *dst, zr_dtype dt, const void *src, zr_dtype st, int64_t n) {
    size_t ds = zr_dtype_size(dt), ss = zr_dtype_size(st);
    if (dt == st) {
        if (dst != src) memmove(dst, src, (size_t)n * ds);
        return;
    }
    int64_t chunks = (n + CAST_CHUNK - 1) / CAST_CHUNK;
#pragma omp parallel for if (n > 65536)
    for (int64_t c = 0; c < chunks; c++) {
        int64_t i = c * CAST_CHUNK, m = n - i < CAST_CHUNK ? n - i : CAST_CHUNK;
        cast_run((char *)dst + i * (int64_t)ds, dt, (const char *)src + i * (int64_t)ss, st, m);
    }
}

static zr_status copy_cpu(zr_tensor *dst, const zr_tensor *src, int bcast) {
    int64_t n = zr_tensor_numel(dst);
    size_t ds = zr_dtype_size(dst->dtype), ss = zr_dtype_size(src->dtype);
    char *dp = dst->storage->data;
    const char *sp = src->storage->data;
    if (!bcast && zr_tensor_is_contiguous(dst) && zr_tensor_is_contiguous(src)) {
        zr_cast_contiguous(dp + dst->offset * (int64_t)ds, dst->dtype, sp + src->offset * (int64_t)ss,
                           src->dtype, n);
        return ZR_OK;
    }
    /* Row by row over the last dim (src has dst's shape here: the same, or expanded to it): the offsets
     * once a row, a row of contiguous elements of one dtype in one memcpy */
    int nd = dst->ndim;
    int64_t inner = nd > 0 ? dst->shape[nd - 1] : 1, rows = inner > 0 ? n / inner : 0;
    int64_t dst_s = nd > 0 ? dst->stride[nd - 1] : 1, src_s = nd > 0 ? src->stride[nd - 1] : 1;
    int same = dst->dtype == src->dtype;
#pragma omp parallel for if (n > 65536)
    for (int64_t r = 0; r < rows; r++) {
        int64_t so = elem_offset(src, r * inner), dof = elem_offset(dst, r * inner);
        if (dst_s == 1 && src_s == 1) { /* a row of each: one memcpy, or one cast run */
            if (same) memcpy(dp + dof * (int64_t)ds, sp + so * (int64_t)ss, (size_t)inner * ds);
            else cast_run(dp + dof * (int64_t)ds, dst->dtype, sp + so * (int64_t)ss, src->dtype, inner);
            continue;
        }
        for (int64_t j = 0; j < inner; j++, so += src_s, dof += dst_s) {
            if (same) memcpy(dp + dof * (int64_t)ds, sp + so * (int64_t)ss, ds);
            else store(dp + dof * (int64_t)ds, dst->dtype, load(sp + so * (int64_t)ss, src->dtype));
        }
    }
    return ZR_OK;
}

zr_status zr_tensor_copy_(zr_tensor *dst, const zr_tensor *src) {
    int64_t n = zr_tensor_numel(dst);
    zr_tensor *s = (zr_tensor *)src, *tmp = NULL;
    int bcast = 0;
    if (!zr_tensor_same_shape(dst, src)) {
        if (zr_tensor_numel(src) == n && zr_tensor_is_contiguous(src) && zr_tensor_is_contiguous(dst)) {
        } else {
            tmp = zr_tensor_expand_raw(s, dst->ndim, dst->shape);
            if (!tmp) {
                char b1[128], b2[128];
                return zr_error("copy: source of shape %s does not match destination %s",
                                zr_tensor_shape_str(src, b1), zr_tensor_shape_str(dst, b2));
            }
            s = tmp;
            bcast = 1;
        }
    }
    zr_device dd = dst->storage->device, sd = s->storage->device;
    zr_status st = ZR_OK;
    if (dd.type == ZR_CPU && sd.type == ZR_CPU) st = copy_cpu(dst, s, bcast);
    else if (dd.type != ZR_CPU && zr_device_eq(dd, sd)) {
        st = device_strided_copy ? device_strided_copy(dst, s) : zr_error("no CUDA backend");
    } else if (!bcast && dst->dtype == s->dtype && zr_tensor_is_contiguous(dst) && zr_tensor_is_contiguous(s)) {
        /* Cross-device, nothing to cast or compact: one transfer, no staging copy */
        size_t nb = (size_t)n * zr_dtype_size(dst->dtype);
        st = device_copy ? device_copy(zr_tensor_data(dst), dd, zr_tensor_data(s), sd, nb) : zr_error("no CUDA backend");
    } else {
        /* Cross-device: stage through a contiguous buffer of the destination's dtype. */
        zr_tensor *c = NULL;
        if (sd.type == ZR_CPU) { /* host -> device: cast/compact on the host, then upload */
            c = zr_tensor_new_cat(dst->dtype, sd, dst->ndim, dst->shape, ZR_MEM_WORKSPACE, 0);
            if (!c || copy_cpu(c, s, bcast)) st = ZR_ERR;
            else if (zr_tensor_is_contiguous(dst))
                st = device_copy(zr_tensor_data(dst), dd, zr_tensor_data(c), sd,
                                 (size_t)n * zr_dtype_size(dst->dtype));
            else {
                zr_tensor *g = zr_tensor_new_cat(dst->dtype, dd, dst->ndim, dst->shape, ZR_MEM_WORKSPACE, 0);
                st = !g ? ZR_ERR
                        : device_copy(zr_tensor_data(g), dd, zr_tensor_data(c), sd,
                                      (size_t)n * zr_dtype_size(dst->dtype));
                if (!st) st = device_strided_copy(dst, g);
                zr_tensor_release(g);
            }
        } else { /* device -> host or device -> other device: compact on the source device */
            c = zr_tensor_new_cat(s->dtype, sd, dst->ndim, dst->shape, ZR_MEM_WORKSPACE, 0);
            if (!c || device_strided_copy(c, s)) st = ZR_ERR;
            else if (dd.type == ZR_CPU) {
                zr_tensor *h = zr_tensor_new_cat(s->dtype, dd, dst->ndim, dst->shape, ZR_MEM_WORKSPACE, 0);
                st = !h ? ZR_ERR
                        : device_copy(zr_tensor_data(h), dd, zr_tensor_data(c), sd,
                                      (size_t)n * zr_dtype_size(s->dtype));
                if (!st) st = copy_cpu(dst, h, 0);
                zr_tensor_release(h);
            } else {
                zr_tensor *g = zr_tensor_new_cat(s->dtype, dd, dst->ndim, dst->shape, ZR_MEM_WORKSPACE, 0);
                st = !g ? ZR_ERR
                        : device_copy(zr_tensor_data(g), dd, zr_tensor_data(c), sd,
                                      (size_t)n * zr_dtype_size(s->dtype));
                if (!st) st = device_strided_copy(dst, g);
                zr_tensor_release(g);
            }
        }
        zr_tensor_release(c);
    }
    zr_tensor_release(tmp);
    return st;
}

zr_tensor *zr_tensor_to_raw(zr_tensor *t, zr_dtype dt, zr_device dev) {
    if (t->dtype == dt && zr_device_eq(t->storage->device, dev) && zr_tensor_is_contiguous(t))
        return zr_tensor_retain(t);
    zr_tensor *r = zr_tensor_new_cat(dt, dev, t->ndim, t->shape, t->storage->category, 0);
    if (r && zr_tensor_copy_(r, t)) {
        zr_tensor_release(r);
        return NULL;
    }
    return r;
}

zr_tensor *zr_tensor_contiguous_raw(zr_tensor *t) {
    return zr_tensor_to_raw(t, t->dtype, t->storage->device);
}

zr_tensor *zr_tensor_clone_raw(zr_tensor *t) {
    zr_tensor *r = zr_tensor_new_cat(t->dtype, t->storage->device, t->ndim, t->shape,
                                     ZR_MEM_ACTIVATIONS, 0);
    if (r && zr_tensor_copy_(r, t)) {
        zr_tensor_release(r);
        return NULL;
    }
    return r;
}

zr_status zr_tensor_fill_(zr_tensor *t, double v) {
    if (t->storage->device.type != ZR_CPU)
        return device_fill ? device_fill(t, v) : zr_error("no CUDA backend");
    int64_t n = zr_tensor_numel(t);
    size_t es = zr_dtype_size(t->dtype);
    char *p = t->storage->data;
    if (zr_tensor_is_contiguous(t)) {
        char *d = p + t->offset * (int64_t)es;
        if (t->dtype == ZR_F32) {
            float f = (float)v, *fd = (float *)d;
            for (int64_t i = 0; i < n; i++) fd[i] = f;
        } else if (v == 0) memset(d, 0, (size_t)n * es);
        else {
            char one[8];
            store(one, t->dtype, v);
            for (int64_t i = 0; i < n; i++) memcpy(d + i * (int64_t)es, one, es);
        }
        return ZR_OK;
    }
    for (int64_t i = 0; i < n; i++) store(p + elem_offset(t, i) * (int64_t)es, t->dtype, v);
    return ZR_OK;
}

static zr_status check_index(const zr_tensor *t, int64_t i) {
    int64_t n = zr_tensor_numel(t);
    if (i < 0 || i >= n)
        return zr_error("index %lld is out of range for a tensor of %lld elements", (long long)i, (long long)n);
    return ZR_OK;
}

zr_status zr_tensor_get(const zr_tensor *t, int64_t i, double *out) {
    ZR_CHECK(check_index(t, i));
    size_t es = zr_dtype_size(t->dtype);
    int64_t off = elem_offset(t, i);
    if (t->storage->device.type == ZR_CPU) {
        *out = load((char *)t->storage->data + off * (int64_t)es, t->dtype);
        return ZR_OK;
    }
    char buf[8];
    ZR_CHECK(device_copy(buf, zr_cpu(), (char *)t->storage->data + off * (int64_t)es,
                         t->storage->device, es));
    *out = load(buf, t->dtype);
    return ZR_OK;
}

zr_status zr_tensor_set(zr_tensor *t, int64_t i, double v) {
    ZR_CHECK(check_index(t, i));
    size_t es = zr_dtype_size(t->dtype);
    int64_t off = elem_offset(t, i);
    if (t->storage->device.type == ZR_CPU) {
        store((char *)t->storage->data + off * (int64_t)es, t->dtype, v);
        return ZR_OK;
    }
    char buf[8];
    store(buf, t->dtype, v);
    return device_copy((char *)t->storage->data + off * (int64_t)es, t->storage->device, buf,
                       zr_cpu(), es);
}

double *zr_tensor_to_doubles(const zr_tensor *t) {
    zr_tensor *h = zr_tensor_to_raw((zr_tensor *)t, ZR_F64, zr_cpu());
    if (!h) return NULL;
    int64_t n = zr_tensor_numel(h);
    double *out = malloc((size_t)(n ? n : 1) * sizeof(double));
    if (out) memcpy(out, zr_tensor_data(h), (size_t)n * sizeof(double));
    else zr_error("out of host memory");
    zr_tensor_release(h);
    return out;
}
