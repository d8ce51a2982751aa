/* Embedding forward (gather) and deterministic backward (radix sort of ids with cub, then one
 * block per distinct id summing its gradient rows in position order). See embedding.h. */
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

static size_t a256(size_t n) { return (n + 255) & ~(size_t)255; }
static size_t cub_bytes(int64_t N) {
    size_t t = 0;
    cub::DeviceRadixSort::SortPairs(NULL, t, (const int64_t *)NULL, (int64_t *)NULL,
                                    (const int32_t *)NULL, (int32_t *)NULL, (int)N);
    return t;
}

extern "C" size_t embedding_backward_workspace_size(int64_t N, int64_t V) {
    if (N <= 0 || V <= 0) return 0;
    return a256((size_t)N * 8) + 2 * a256((size_t)N * 4) + a256(cub_bytes(N));
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
