/* Embedding forward (gather) and deterministic backward (radix sort of ids with cub, then one
 * block per distinct id summing its gradient rows in position order). See embedding.h. The sort
 * runs on 32-bit keys over only the bits V needs (ids outside [0, V) become the key V, skipped),
 * and the summing blocks use 16-byte accesses with several rows' chunks in flight. */
#include "embedding.h"

#include <cub/device/device_radix_sort.cuh>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

extern "C" {
#include "error.h"
}

#include "fused_common.cuh"

template <typename T, int V>
__global__ void emb_fwd_kernel(T *__restrict__ out, const T *__restrict__ w,
                               const int64_t *__restrict__ ids, int64_t N, int64_t Vn, int64_t D) {
    const int64_t nch = D / V, total = N * nch;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (int64_t)gridDim.x * blockDim.x) {
        const int64_t n = idx / nch, c = (idx % nch) * V, id = ids[n];
        float f[V];
        if (id >= 0 && id < Vn) ldv<T, V>(f, w + id * D + c);
        else
#pragma unroll
            for (int k = 0; k < V; ++k) f[k] = 0.f;
        stv<T, V>(out + n * D + c, f);
    }
}

__global__ void emb_iota_kernel(int32_t *v, int64_t N) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < N;
         i += (int64_t)gridDim.x * blockDim.x)
        v[i] = (int32_t)i;
}

/* Block p handles the run of equal sorted ids that starts at p (other blocks exit at once). */
template <typename T>
__global__ void emb_bwd_kernel(T *__restrict__ dW, const T *__restrict__ dout,
                               const int64_t *__restrict__ skeys, const int32_t *__restrict__ spos,
                               int64_t N, int64_t Vn, int64_t D, int accumulate) {
    const int64_t p = blockIdx.x, id = skeys[p];
    if ((p > 0 && skeys[p - 1] == id) || id < 0 || id >= Vn) return;
    int64_t e = p + 1;
    while (e < N && skeys[e] == id) ++e;
    for (int64_t c = threadIdx.x; c < D; c += blockDim.x) {
        float s = accumulate ? tof<T>(dW[id * D + c]) : 0.f;
        for (int64_t q = p; q < e; ++q) s += tof<T>(dout[(int64_t)spos[q] * D + c]);
        dW[id * D + c] = fromf<T>(s);
    }
}

/* keys[i] = ids[i] when in [0, V), else V (one key for every skipped id); pos[i] = i. */
__global__ void emb_keys_kernel(uint32_t *keys, int32_t *pos, const int64_t *__restrict__ ids,
                                int64_t N, int64_t Vn) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < N;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t id = ids[i];
        keys[i] = (uint32_t)(id >= 0 && id < Vn ? id : Vn);
        pos[i] = (int32_t)i;
    }
}

/* Block p handles the run of equal sorted keys that starts at p (other blocks exit at once):
 * each thread owns U chunks of VW elements, adds the run's rows in position order. */
template <typename T, int VW, int U>
__global__ void emb_bwd_vec_kernel(T *__restrict__ dW, const T *__restrict__ dout,
                                   const uint32_t *__restrict__ skeys,
                                   const int32_t *__restrict__ spos, int64_t N, int64_t Vn,
                                   int64_t D, int accumulate) {
    const int64_t p = blockIdx.x;
    const uint32_t key = skeys[p];
    if ((p > 0 && skeys[p - 1] == key) || (int64_t)key >= Vn) return;
    int64_t e = p + 1;
    while (e < N && skeys[e] == key) ++e;
    const int64_t nch = D / VW, id = key;
    for (int64_t c0 = threadIdx.x; c0 < nch; c0 += (int64_t)blockDim.x * U) {
        float acc[U][VW];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int64_t c = c0 + (int64_t)u * blockDim.x;
            if (accumulate && c < nch) ldv<T, VW>(acc[u], dW + id * D + c * VW);
            else
#pragma unroll
                for (int k = 0; k < VW; ++k) acc[u][k] = 0.f;
        }
        for (int64_t q = p; q < e; ++q) {
            const T *src = dout + (int64_t)spos[q] * D;
            float t[U][VW];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int64_t c = c0 + (int64_t)u * blockDim.x;
                if (c < nch) ldv<T, VW>(t[u], src + c * VW);
            }
#pragma unroll
            for (int u = 0; u < U; ++u)
#pragma unroll
                for (int k = 0; k < VW; ++k) acc[u][k] += t[u][k];
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int64_t c = c0 + (int64_t)u * blockDim.x;
            if (c < nch) stv<T, VW>(dW + id * D + c * VW, acc[u]);
        }
    }
}

static size_t a256(size_t n) { return (n + 255) & ~(size_t)255; }
static size_t cub_bytes(int64_t N) {
    size_t t = 0;
    cub::DeviceRadixSort::SortPairs(NULL, t, (const int64_t *)NULL, (int64_t *)NULL,
                                    (const int32_t *)NULL, (int32_t *)NULL, (int)N);
    return t;
}

static size_t cub_bytes32(int64_t N) {
    size_t t = 0;
    cub::DeviceRadixSort::SortPairs(NULL, t, (const uint32_t *)NULL, (uint32_t *)NULL,
                                    (const int32_t *)NULL, (int32_t *)NULL, (int)N);
    return t;
}

extern "C" size_t embedding_backward_workspace_size(int64_t N, int64_t V) {
    if (N <= 0 || V <= 0) return 0;
    const size_t w64 = a256((size_t)N * 8) + 2 * a256((size_t)N * 4) + a256(cub_bytes(N));
    const size_t w32 = 4 * a256((size_t)N * 4) + a256(cub_bytes32(N));
    return w64 > w32 ? w64 : w32;
}

extern "C" int embedding_forward_cuda(void *out, const void *weight, const int64_t *ids,
                                      int64_t N, int64_t V, int64_t D, zr_dtype dtype,
                                      cudaStream_t stream) {
    const char *fn = "embedding_forward_cuda";
    if (N < 0 || V <= 0 || D <= 0)
        return zr_error("%s: bad shape N=%lld V=%lld D=%lld", fn, (long long)N, (long long)V,
                        (long long)D);
    if (N == 0) return 0;
    ZR_FUSED_DISPATCH(fn, dtype, {
        const int VW = 16 / sizeof(T);
        const bool vec = D % VW == 0 && al16(out) && al16(weight);
        const int64_t n = N * (vec ? D / VW : D);
        int64_t blocks = (n + 255) / 256;
        if (blocks > 132 * 32) blocks = 132 * 32;
        if (vec)
            emb_fwd_kernel<T, 16 / sizeof(T)><<<(unsigned)blocks, 256, 0, stream>>>(
                (T *)out, (const T *)weight, ids, N, V, D);
        else
            emb_fwd_kernel<T, 1><<<(unsigned)blocks, 256, 0, stream>>>((T *)out, (const T *)weight,
                                                                       ids, N, V, D);
    });
    return launch_check(fn);
}

extern "C" int embedding_backward_cuda(void *dW, const void *dout, const int64_t *ids,
                                       void *workspace, int64_t N, int64_t V, int64_t D,
                                       int accumulate, zr_dtype dtype, cudaStream_t stream) {
    const char *fn = "embedding_backward_cuda";
    if (N < 0 || V <= 0 || D <= 0 || N > 0x7fffffffLL)
        return zr_error("%s: bad shape N=%lld V=%lld D=%lld", fn, (long long)N, (long long)V,
                        (long long)D);
    if (dtype != ZR_F32 && dtype != ZR_BF16 && dtype != ZR_F16)
        return zr_error("%s: dtype %s not supported (f32, bf16 or f16 expected)", fn,
                        zr_dtype_name(dtype));
    if (!accumulate &&
        cudaMemsetAsync(dW, 0, (size_t)V * D * zr_dtype_size(dtype), stream) != cudaSuccess)
        return zr_error("%s: cudaMemsetAsync of dW (%lld x %lld) failed", fn, (long long)V,
                        (long long)D);
    if (N == 0) return launch_check(fn);
    if (!workspace) return zr_error("%s: workspace is NULL", fn);
    char *ws = (char *)workspace;
    if (V < 0x7fffffffLL) { /* 32-bit keys over the bits that V needs */
        uint32_t *keys = (uint32_t *)ws;
        uint32_t *skeys32 = (uint32_t *)(ws + a256((size_t)N * 4));
        int32_t *pos = (int32_t *)(ws + 2 * a256((size_t)N * 4));
        int32_t *spos = (int32_t *)(ws + 3 * a256((size_t)N * 4));
        void *tmp = ws + 4 * a256((size_t)N * 4);
        int nbits = 1;
        while (nbits < 32 && ((int64_t)1 << nbits) <= V) ++nbits; /* the key V fits too */
        emb_keys_kernel<<<(unsigned)((N + 255) / 256 < 4096 ? (N + 255) / 256 : 4096), 256, 0,
                          stream>>>(keys, pos, ids, N, V);
        size_t tmpb = cub_bytes32(N); /* host work after the first launch: the GPU is busy */
        if (cub::DeviceRadixSort::SortPairs(tmp, tmpb, keys, skeys32, pos, spos, (int)N, 0, nbits,
                                            stream) != cudaSuccess)
            return zr_error("%s: radix sort of %lld ids failed: %s", fn, (long long)N,
                            cudaGetErrorString(cudaGetLastError()));
        ZR_FUSED_DISPATCH(fn, dtype, {
            const int VW = 16 / sizeof(T);
            if (D % VW == 0 && al16(dW) && al16(dout)) {
                const int64_t nch = D / VW, per = (nch + 3) / 4;
                const int th = per >= 128 ? 128 : per <= 32 ? 32 : (int)((per + 31) / 32 * 32);
                emb_bwd_vec_kernel<T, 16 / sizeof(T), 4><<<(unsigned)N, th, 0, stream>>>(
                    (T *)dW, (const T *)dout, skeys32, spos, N, V, D, accumulate);
            } else {
                const int th = D >= 256 ? 256 : (int)((D + 31) / 32 * 32);
                emb_bwd_vec_kernel<T, 1, 1><<<(unsigned)N, th, 0, stream>>>(
                    (T *)dW, (const T *)dout, skeys32, spos, N, V, D, accumulate);
            }
        });
        return launch_check(fn);
    }
    int64_t *skeys = (int64_t *)ws;
    int32_t *pos = (int32_t *)(ws + a256((size_t)N * 8));
    int32_t *spos = (int32_t *)((char *)pos + a256((size_t)N * 4));
    void *tmp = (char *)spos + a256((size_t)N * 4);
    size_t tmpb = cub_bytes(N);
    emb_iota_kernel<<<(unsigned)((N + 255) / 256 < 4096 ? (N + 255) / 256 : 4096), 256, 0,
                      stream>>>(pos, N);
    if (cub::DeviceRadixSort::SortPairs(tmp, tmpb, ids, skeys, pos, spos, (int)N, 0, 64, stream) != cudaSuccess)
        return zr_error("%s: radix sort of %lld ids failed: %s", fn, (long long)N,
                        cudaGetErrorString(cudaGetLastError()));
    const int th = D >= 256 ? 256 : (int)((D + 31) / 32 * 32);
    ZR_FUSED_DISPATCH(fn, dtype,
                      emb_bwd_kernel<T><<<(unsigned)N, th, 0, stream>>>(
                          (T *)dW, (const T *)dout, skeys, spos, N, V, D, accumulate));
    return launch_check(fn);
}
