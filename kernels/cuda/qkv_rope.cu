/* Fused q/k/v rope (see qkv_rope.h). One thread per (b, t, head of the packed row, chunk of V
 * rotation pairs): it reads V elements at i and at i + Dh/2 of one head, rotates them (q, k) or
 * not (v), and writes them to the other side. Consecutive threads take consecutive chunks of one
 * packed row, so the packed side (the GEMM's output, or its gradient) is read or written in
 * full 16-byte vectors, coalesced; the part side goes through its (b, h, t) strides. */
#include "qkv_rope.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

extern "C" {
#include "../base/error.h"
}

#include "fused_common.cuh"

struct qkv_args {
    void *packed;      /* forward: read (const); backward: written */
    const void *g[3];  /* backward: dq, dk, dv (NULL: zeros) */
    void *part[3];     /* forward: q, k, v written */
    zr_qkv_layout L;
    const float *cos, *sin; /* (T, Dh) */
    uint32_t T, H, KV, nh, nch, half, n;
    int accumulate;
};

template <typename T, int V, bool FWD>
__global__ void __launch_bounds__(256) qkv_rope_kernel(const qkv_args a) {
    const uint32_t idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= a.n) return;
    const uint32_t c = (idx % a.nch) * V, r = idx / a.nch, j = r % a.nh, bt = r / a.nh,
                   t = bt % a.T, b = bt / a.T;
    const int p = j < a.H ? 0 : j < a.H + a.KV ? 1 : 2;
    const uint32_t h = j - (p == 0 ? 0 : p == 1 ? a.H : a.H + a.KV);
    const int64_t dh = 2 * (int64_t)a.half;
    /* fields picked one by one: indexing the struct's arrays with p would copy it to the stack */
    const int64_t psb = p == 0 ? a.L.part[0][0] : p == 1 ? a.L.part[1][0] : a.L.part[2][0];
    const int64_t psh = p == 0 ? a.L.part[0][1] : p == 1 ? a.L.part[1][1] : a.L.part[2][1];
    const int64_t pst = p == 0 ? a.L.part[0][2] : p == 1 ? a.L.part[1][2] : a.L.part[2][2];
    const int64_t poff = b * psb + h * psh + t * pst + c;
    T *pk = (T *)a.packed + b * a.L.sb + t * a.L.st + j * dh + c;
    float x1[V], x2[V], o1[V], o2[V];
    if (FWD) {
        ldv<T, V>(x1, pk);
        ldv<T, V>(x2, pk + a.half);
    } else {
        const void *g = p == 0 ? a.g[0] : p == 1 ? a.g[1] : a.g[2];
        if (g) {
            ldv<T, V>(x1, (const T *)g + poff);
            ldv<T, V>(x2, (const T *)g + poff + a.half);
        } else {
#pragma unroll
            for (int i = 0; i < V; ++i) x1[i] = x2[i] = 0.f;
        }
    }
    if (p == 2) {
#pragma unroll
        for (int i = 0; i < V; ++i) o1[i] = x1[i], o2[i] = x2[i];
    } else {
        const float *cs = a.cos + (int64_t)t * dh + c, *sn = a.sin + (int64_t)t * dh + c;
#pragma unroll
        for (int i = 0; i < V; ++i) {
            const float c1 = __ldg(cs + i), c2 = __ldg(cs + a.half + i);
            const float s1 = __ldg(sn + i), s2 = __ldg(sn + a.half + i);
            if (FWD) { /* y = x cos + rotate_half(x) sin */
                o1[i] = x1[i] * c1 - x2[i] * s1;
                o2[i] = x2[i] * c2 + x1[i] * s2;
            } else { /* its transpose */
                o1[i] = x1[i] * c1 + x2[i] * s2;
                o2[i] = x2[i] * c2 - x1[i] * s1;
            }
        }
    }
    if (FWD) {
        T *y = (T *)(p == 0 ? a.part[0] : p == 1 ? a.part[1] : a.part[2]) + poff;
        stv<T, V>(y, o1);
        stv<T, V>(y + a.half, o2);
        return;
    }
    if (a.accumulate) {
        ldv<T, V>(x1, pk);
        ldv<T, V>(x2, pk + a.half);
#pragma unroll
        for (int i = 0; i < V; ++i) o1[i] += x1[i], o2[i] += x2[i];
    }
    stv<T, V>(pk, o1);
    stv<T, V>(pk + a.half, o2);
}

/* 16-byte vectors when every pointer and stride allows them. */
static bool vec_ok(const qkv_args &a, const void *const ptrs[4], int V) {
    for (int i = 0; i < 4; ++i)
        if (ptrs[i] && !al16(ptrs[i])) return false;
    bool ok = a.half % V == 0 && a.L.sb % V == 0 && a.L.st % V == 0;
    for (int p = 0; p < 3; ++p)
        for (int d = 0; d < 3; ++d) ok = ok && a.L.part[p][d] % V == 0;
    return ok;
}

static int qkv_run(const char *fn, qkv_args a, const void *const ptrs[4], int64_t B, int64_t Tn,
                   int64_t H, int64_t KV, int64_t Dh, zr_dtype dtype, cudaStream_t st, bool fwd) {
    if (B < 0 || Tn < 0 || H < 0 || KV < 0 || Dh <= 0 || Dh % 2)
        return zr_error("%s: bad shape B=%lld T=%lld H=%lld KV=%lld Dh=%lld (Dh must be even)", fn,
                        (long long)B, (long long)Tn, (long long)H, (long long)KV, (long long)Dh);
    const int64_t nh = H + 2 * KV;
    if (B * Tn * nh == 0) return 0;
    ZR_FUSED_DISPATCH(fn, dtype, {
        const int V = 16 / sizeof(T);
        a.half = (uint32_t)(Dh / 2); /* vec_ok needs it: a head's half must hold whole vectors */
        const bool vec = vec_ok(a, ptrs, V);
        const int64_t nch = vec ? Dh / 2 / V : Dh / 2, n = B * Tn * nh * nch;
        if (n >= ((int64_t)1 << 31))
            return zr_error("%s: %lld rows x %lld pairs too large for one launch", fn,
                            (long long)(B * Tn * nh), (long long)(Dh / 2));
        a.T = (uint32_t)Tn, a.H = (uint32_t)H, a.KV = (uint32_t)KV, a.nh = (uint32_t)nh;
        a.nch = (uint32_t)nch, a.n = (uint32_t)n;
        const unsigned grid = (unsigned)((n + 255) / 256);
        if (fwd && vec) qkv_rope_kernel<T, 16 / sizeof(T), true><<<grid, 256, 0, st>>>(a);
        else if (fwd) qkv_rope_kernel<T, 1, true><<<grid, 256, 0, st>>>(a);
        else if (vec) qkv_rope_kernel<T, 16 / sizeof(T), false><<<grid, 256, 0, st>>>(a);
        else qkv_rope_kernel<T, 1, false><<<grid, 256, 0, st>>>(a);
    });
    return launch_check(fn);
}

extern "C" int qkv_rope_forward_cuda(void *q, void *k, void *v, const void *qkv, const float *cos,
                                     const float *sin, const zr_qkv_layout *L, int64_t B,
                                     int64_t T, int64_t H, int64_t KV, int64_t Dh, zr_dtype dtype,
                                     cudaStream_t stream) {
    qkv_args a = {};
    a.packed = (void *)qkv, a.part[0] = q, a.part[1] = k, a.part[2] = v;
    a.L = *L, a.cos = cos, a.sin = sin;
    const void *ptrs[4] = {qkv, q, k, v};
    return qkv_run("qkv_rope_forward_cuda", a, ptrs, B, T, H, KV, Dh, dtype, stream, true);
}

extern "C" int qkv_rope_backward_cuda(void *dqkv, const void *dq, const void *dk, const void *dv,
                                      const float *cos, const float *sin, const zr_qkv_layout *L,
                                      int64_t B, int64_t T, int64_t H, int64_t KV, int64_t Dh,
                                      int accumulate, zr_dtype dtype, cudaStream_t stream) {
    qkv_args a = {};
    a.packed = dqkv, a.g[0] = dq, a.g[1] = dk, a.g[2] = dv;
    a.L = *L, a.cos = cos, a.sin = sin, a.accumulate = accumulate;
    const void *ptrs[4] = {dqkv, dq, dk, dv};
    return qkv_run("qkv_rope_backward_cuda", a, ptrs, B, T, H, KV, Dh, dtype, stream, false);
}
