// Strided copy with cast between all dtypes, and fill, on one CUDA device (see copy.h).
// Contiguous same-dtype copies are cudaMemcpyAsync; contiguous casts use 16-byte packs; anything
// else walks a collapsed strided index (32-bit index math when every offset fits).
#include "common.cuh"
#include "copy.h"

using namespace zrk;

namespace {

// Value conversions matching tensor_copy.c's load()/store(): through double, f32 rounding first
// for the half types. Pairs inside {f32, bf16, f16} stay in f32 (the same result, faster).
template <typename S> __device__ __forceinline__ double to_d(S x) { return (double)x; }
template <> __device__ __forceinline__ double to_d<__nv_bfloat16>(__nv_bfloat16 x) { return (double)__bfloat162float(x); }
template <> __device__ __forceinline__ double to_d<__half>(__half x) { return (double)__half2float(x); }
template <typename D> __device__ __forceinline__ D from_d(double x) { return (D)x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_d<__nv_bfloat16>(double x) { return __float2bfloat16_rn((float)x); }
template <> __device__ __forceinline__ __half from_d<__half>(double x) { return __float2half_rn((float)x); }

template <typename T> struct is_f32ish { enum { v = 0 }; };
template <> struct is_f32ish<float> { enum { v = 1 }; };
template <> struct is_f32ish<__nv_bfloat16> { enum { v = 1 }; };
template <> struct is_f32ish<__half> { enum { v = 1 }; };

template <typename D, typename S, bool F = is_f32ish<D>::v && is_f32ish<S>::v> struct cvt_t {
    static __device__ __forceinline__ D go(S x) { return from_d<D>(to_d<S>(x)); }
};
template <typename D, typename S> struct cvt_t<D, S, true> {
    static __device__ __forceinline__ D go(S x) { return from_acc<D>(to_acc<S>(x)); }
};
template <typename T> struct cvt_t<T, T, true> {
    static __device__ __forceinline__ T go(T x) { return x; }
};
template <typename T> struct cvt_t<T, T, false> {
    static __device__ __forceinline__ T go(T x) { return x; }
};
template <typename D, typename S> __device__ __forceinline__ D cvt(S x) { return cvt_t<D, S>::go(x); }

template <typename D, typename S, int V>
__global__ void cast_contig_kernel(D *__restrict__ dst, const S *__restrict__ src, int64_t n) {
    int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, step = (int64_t)gridDim.x * blockDim.x;
    int64_t nv = n / V;
    for (int64_t i = tid; i < nv; i += step) {
        pack<S, V> s = reinterpret_cast<const pack<S, V> *>(src)[i];
        pack<D, V> d;
#pragma unroll
        for (int k = 0; k < V; k++) d.v[k] = cvt<D, S>(s.v[k]);
        reinterpret_cast<pack<D, V> *>(dst)[i] = d;
    }
    for (int64_t i = nv * V + tid; i < n; i += step) dst[i] = cvt<D, S>(src[i]);
}

template <typename D, typename S, typename I>
__global__ void copy_strided_kernel(D *__restrict__ dst, const S *__restrict__ src, I n, strided<I, 2> g) {
    for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (I)gridDim.x * blockDim.x) {
        I off[2];
        offsets_of<I, 2>(g, i, off);
        dst[off[0]] = cvt<D, S>(src[off[1]]);
    }
}

// Permuting copies whose innermost dim is contiguous in both (e.g. (B,H,T,D) -> (B,T,H,D)): rows of
// L packs of V elements, the strided index math once per 16-byte pack instead of per element.
template <typename D, typename S, int V, typename I>
__global__ void copy_rows_kernel(D *__restrict__ dst, const S *__restrict__ src, I nrows, I L, strided<I, 2> g) {
    const I total = nrows * L;
    for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (I)gridDim.x * blockDim.x) {
        I r = i / L, c = i - r * L, off[2];
        offsets_of<I, 2>(g, r, off);
        pack<S, V> sp = *reinterpret_cast<const pack<S, V> *>(src + off[1] + c * V);
        pack<D, V> dp;
#pragma unroll
        for (int k = 0; k < V; k++) dp.v[k] = cvt<D, S>(sp.v[k]);
        *reinterpret_cast<pack<D, V> *>(dst + off[0] + c * V) = dp;
    }
}

// Transpose-like copies: dst (B, R, C) with unit stride along C, src with unit stride along R.
// A 32x32 tile goes through shared memory so both the reads and the writes are coalesced.
template <typename D, typename S>
__global__ void copy_transpose_kernel(D *__restrict__ dst, const S *__restrict__ src, int64_t R, int64_t C,
                                      int64_t dr, int64_t db, int64_t sc, int64_t sb) {
    __shared__ S tile[32][33];
    int64_t r0 = (int64_t)blockIdx.y * 32, c0 = (int64_t)blockIdx.x * 32, b = blockIdx.z;
    const S *sp = src + b * sb;
    D *dp = dst + b * db;
    for (int j = threadIdx.y; j < 32; j += 8) {
        int64_t r = r0 + threadIdx.x, c = c0 + j;
        if (r < R && c < C) tile[j][threadIdx.x] = sp[r + c * sc];
    }
    __syncthreads();
    for (int j = threadIdx.y; j < 32; j += 8) {
        int64_t r = r0 + j, c = c0 + threadIdx.x;
        if (r < R && c < C) dp[r * dr + c] = cvt<D, S>(tile[threadIdx.x][j]);
    }
}

template <typename W, typename I>
__global__ void fill_strided_kernel(W *__restrict__ dst, I n, strided<I, 1> g, W v) {
    for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (I)gridDim.x * blockDim.x) {
        I off[1];
        offsets_of<I, 1>(g, i, off);
        dst[off[0]] = v;
    }
}

template <typename W, int V> __global__ void fill_contig_kernel(W *__restrict__ dst, int64_t n, W v) {
    int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, step = (int64_t)gridDim.x * blockDim.x;
    int64_t nv = n / V;
    pack<W, V> p;
#pragma unroll
    for (int k = 0; k < V; k++) p.v[k] = v;
    for (int64_t i = tid; i < nv; i += step) reinterpret_cast<pack<W, V> *>(dst)[i] = p;
    for (int64_t i = nv * V + tid; i < n; i += step) dst[i] = v;
}

const int THREADS = 256;

// Rows of whole 16-byte packs: the innermost dim contiguous in both, its length and every outer
// stride a multiple of the pack, both pointers aligned to it.
template <typename D, typename S>
static bool rows_ok(const void *dst, const void *src, int ndim, const int64_t *shape, int64_t (*st)[ZRK_MAXD]) {
    const int64_t V = 16 / (sizeof(D) > sizeof(S) ? sizeof(D) : sizeof(S));
    if (st[0][ndim - 1] != 1 || st[1][ndim - 1] != 1 || shape[ndim - 1] % V || shape[ndim - 1] < 2 * V) return false;
    if ((uintptr_t)dst % (sizeof(D) * V) || (uintptr_t)src % (sizeof(S) * V)) return false;
    for (int d = 0; d < ndim - 1; d++)
        if (st[0][d] % V || st[1][d] % V) return false;
    return true;
}

template <typename D, typename S>
int launch_copy(void *dst, const void *src, int ndim, int64_t *shape, int64_t (*st)[ZRK_MAXD], int64_t n,
                cudaStream_t stream) {
    if (ndim <= 1 && (ndim == 0 || (st[0][0] == 1 && st[1][0] == 1))) {
        enum { V = 16 / (sizeof(D) > sizeof(S) ? sizeof(D) : sizeof(S)) };
        if (((uintptr_t)dst % (sizeof(D) * V)) == 0 && ((uintptr_t)src % (sizeof(S) * V)) == 0)
            cast_contig_kernel<D, S, V><<<grid_for(n / V + 1, THREADS), THREADS, 0, stream>>>((D *)dst, (const S *)src, n);
        else
            cast_contig_kernel<D, S, 1><<<grid_for(n, THREADS), THREADS, 0, stream>>>((D *)dst, (const S *)src, n);
    } else if ((ndim == 2 || ndim == 3) && st[0][ndim - 1] == 1 && st[1][ndim - 2] == 1 && shape[ndim - 1] >= 16 &&
               shape[ndim - 2] >= 16 && (shape[ndim - 2] + 31) / 32 <= 65535 && (ndim == 2 || shape[0] <= 65535)) {
        int64_t R = shape[ndim - 2], C = shape[ndim - 1], B = ndim == 3 ? shape[0] : 1;
        dim3 grid((unsigned)((C + 31) / 32), (unsigned)((R + 31) / 32), (unsigned)B);
        copy_transpose_kernel<D, S><<<grid, dim3(32, 8), 0, stream>>>((D *)dst, (const S *)src, R, C, st[0][ndim - 2],
                                                                       ndim == 3 ? st[0][0] : 0, st[1][ndim - 1],
                                                                       ndim == 3 ? st[1][0] : 0);
    } else if (ndim >= 2 && rows_ok<D, S>(dst, src, ndim, shape, st)) {
        enum { V = 16 / (sizeof(D) > sizeof(S) ? sizeof(D) : sizeof(S)) };
        int64_t L = shape[ndim - 1] / V, rows = n / shape[ndim - 1];
        if (fits_i32(ndim - 1, shape, 2, st) && n / V < INT32_MAX)
            copy_rows_kernel<D, S, V, int32_t><<<grid_for(n / V, THREADS), THREADS, 0, stream>>>(
                (D *)dst, (const S *)src, (int32_t)rows, (int32_t)L, make_strided<int32_t, 2>(ndim - 1, shape, st));
        else
            copy_rows_kernel<D, S, V, int64_t><<<grid_for(n / V, THREADS), THREADS, 0, stream>>>(
                (D *)dst, (const S *)src, rows, L, make_strided<int64_t, 2>(ndim - 1, shape, st));
    } else if (fits_i32(ndim, shape, 2, st)) {
        copy_strided_kernel<D, S, int32_t><<<grid_for(n, THREADS), THREADS, 0, stream>>>(
            (D *)dst, (const S *)src, (int32_t)n, make_strided<int32_t, 2>(ndim, shape, st));
    } else {
        copy_strided_kernel<D, S, int64_t><<<grid_for(n, THREADS), THREADS, 0, stream>>>(
            (D *)dst, (const S *)src, n, make_strided<int64_t, 2>(ndim, shape, st));
    }
    return launch_check("copy (cuda)");
}

template <typename D>
int dispatch_src(zr_dtype sdt, void *dst, const void *src, int ndim, int64_t *shape, int64_t (*st)[ZRK_MAXD],
                 int64_t n, cudaStream_t s) {
    switch (sdt) {
    case ZR_F32: return launch_copy<D, float>(dst, src, ndim, shape, st, n, s);
    case ZR_BF16: return launch_copy<D, __nv_bfloat16>(dst, src, ndim, shape, st, n, s);
    case ZR_F16: return launch_copy<D, __half>(dst, src, ndim, shape, st, n, s);
    case ZR_F64: return launch_copy<D, double>(dst, src, ndim, shape, st, n, s);
    case ZR_I32: return launch_copy<D, int32_t>(dst, src, ndim, shape, st, n, s);
    case ZR_I64: return launch_copy<D, int64_t>(dst, src, ndim, shape, st, n, s);
    case ZR_U8: return launch_copy<D, uint8_t>(dst, src, ndim, shape, st, n, s);
    default: return zr_error("copy (cuda): unknown source dtype %d", (int)sdt);
    }
}

// Host-side bit pattern of v in dtype dt, as tensor_copy.c's store() writes it.
uint64_t host_pattern(zr_dtype dt, double v) {
    uint64_t bits = 0;
    switch (dt) {
    case ZR_F32: { float f = (float)v; memcpy(&bits, &f, 4); break; }
    case ZR_BF16: bits = zr_f32_to_bf16((float)v); break;
    case ZR_F16: bits = zr_f32_to_f16((float)v); break;
    case ZR_F64: memcpy(&bits, &v, 8); break;
    case ZR_I32: { int32_t x = (int32_t)v; memcpy(&bits, &x, 4); break; }
    case ZR_I64: { int64_t x = (int64_t)v; memcpy(&bits, &x, 8); break; }
    case ZR_U8: bits = (uint8_t)v; break;
    default: break;
    }
    return bits;
}

template <typename W>
int launch_fill(void *dst, int ndim, int64_t *shape, int64_t (*st)[ZRK_MAXD], int64_t n, W v, cudaStream_t stream) {
    enum { V = 16 / sizeof(W) };
    if (ndim <= 1 && (ndim == 0 || st[0][0] == 1) && aligned16(dst))
        fill_contig_kernel<W, V><<<grid_for(n / V + 1, THREADS), THREADS, 0, stream>>>((W *)dst, n, v);
    else if (ndim <= 1 && (ndim == 0 || st[0][0] == 1))
        fill_contig_kernel<W, 1><<<grid_for(n, THREADS), THREADS, 0, stream>>>((W *)dst, n, v);
    else if (fits_i32(ndim, shape, 1, st))
        fill_strided_kernel<W, int32_t><<<grid_for(n, THREADS), THREADS, 0, stream>>>(
            (W *)dst, (int32_t)n, make_strided<int32_t, 1>(ndim, shape, st), v);
    else
        fill_strided_kernel<W, int64_t><<<grid_for(n, THREADS), THREADS, 0, stream>>>(
            (W *)dst, n, make_strided<int64_t, 1>(ndim, shape, st), v);
    return launch_check("fill (cuda)");
}

}  // namespace

extern "C" int copy_strided_cuda(void *dst, zr_dtype dt, const int64_t *dstride, const void *src, zr_dtype sdt,
                                 const int64_t *sstride, int ndim, const int64_t *shape, cudaStream_t stream) {
    if (ndim > ZRK_MAXD) return zr_error("copy (cuda): at most %d dims", ZRK_MAXD);
    int64_t sh[ZRK_MAXD], st[2][ZRK_MAXD];
    const int64_t *ss[2] = {dstride, sstride};
    int64_t n = load_operands(ndim, shape, 2, ss, sh, st);
    if (n == 0) return 0;
    int nd = collapse_dims(ndim, sh, 2, st);
    if (dt == sdt && (nd == 0 || (nd == 1 && st[0][0] == 1 && st[1][0] == 1))) {
        if (dst == src) return 0;
        cudaError_t e = cudaMemcpyAsync(dst, src, (size_t)n * zr_dtype_size(dt), cudaMemcpyDeviceToDevice, stream);
        return e == cudaSuccess ? 0 : launch_check("copy (cuda memcpy)");
    }
    switch (dt) {
    case ZR_F32: return dispatch_src<float>(sdt, dst, src, nd, sh, st, n, stream);
    case ZR_BF16: return dispatch_src<__nv_bfloat16>(sdt, dst, src, nd, sh, st, n, stream);
    case ZR_F16: return dispatch_src<__half>(sdt, dst, src, nd, sh, st, n, stream);
    case ZR_F64: return dispatch_src<double>(sdt, dst, src, nd, sh, st, n, stream);
    case ZR_I32: return dispatch_src<int32_t>(sdt, dst, src, nd, sh, st, n, stream);
    case ZR_I64: return dispatch_src<int64_t>(sdt, dst, src, nd, sh, st, n, stream);
    case ZR_U8: return dispatch_src<uint8_t>(sdt, dst, src, nd, sh, st, n, stream);
    default: return zr_error("copy (cuda): unknown destination dtype %d", (int)dt);
    }
}

extern "C" int fill_strided_cuda(void *dst, zr_dtype dt, const int64_t *stride, int ndim, const int64_t *shape,
                                 double v, cudaStream_t stream) {
    if (ndim > ZRK_MAXD) return zr_error("fill (cuda): at most %d dims", ZRK_MAXD);
    int64_t sh[ZRK_MAXD], st[1][ZRK_MAXD];
    const int64_t *ss[1] = {stride};
    int64_t n = load_operands(ndim, shape, 1, ss, sh, st);
    if (n == 0) return 0;
    int nd = collapse_dims(ndim, sh, 1, st);
    uint64_t bits = host_pattern(dt, v);
    size_t es = zr_dtype_size(dt);
    if (bits == 0 && (nd == 0 || (nd == 1 && st[0][0] == 1))) {
        cudaError_t e = cudaMemsetAsync(dst, 0, (size_t)n * es, stream);
        return e == cudaSuccess ? 0 : launch_check("fill (cuda memset)");
    }
    switch (es) {
    case 1: return launch_fill<uint8_t>(dst, nd, sh, st, n, (uint8_t)bits, stream);
    case 2: return launch_fill<uint16_t>(dst, nd, sh, st, n, (uint16_t)bits, stream);
    case 4: return launch_fill<uint32_t>(dst, nd, sh, st, n, (uint32_t)bits, stream);
    default: return launch_fill<uint64_t>(dst, nd, sh, st, n, bits, stream);
    }
}
