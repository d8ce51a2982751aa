/* Comparisons, log_softmax, dropout and SGD on CUDA (see misc.h): simple grid-stride or
 * block-per-row kernels; these ops are not on the hot path of training, so clarity wins. */
#include <math.h>

#include "common.cuh" /* first: it includes the C headers inside extern "C" */
#include "misc.h"

using namespace zrk;

namespace {

template <typename T> __device__ __forceinline__ double to_d(T x) { return (double)x; }
template <> __device__ __forceinline__ double to_d<__nv_bfloat16>(__nv_bfloat16 x) { return (double)__bfloat162float(x); }
template <> __device__ __forceinline__ double to_d<__half>(__half x) { return (double)__half2float(x); }

template <typename T>
__global__ void compare_kernel(uint8_t *out, const T *a, const T *b, strided<int64_t, 2> s, int64_t n, int op) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t off[2];
        offsets_of<int64_t, 2>(s, i, off);
        double x = to_d<T>(a[off[0]]), y = to_d<T>(b[off[1]]);
        bool r;
        switch (op) {
        case 0: r = x == y; break;
        case 1: r = x != y; break;
        case 2: r = x < y; break;
        case 3: r = x <= y; break;
        case 4: r = x > y; break;
        default: r = x >= y; break;
        }
        out[i] = r ? 1 : 0;
    }
}

template <typename T>
int compare_launch(uint8_t *out, const void *a, const void *b, int ndim, int64_t *sh, int64_t (*st)[ZRK_MAXD],
                   int64_t n, int op, cudaStream_t stream) {
    strided<int64_t, 2> s = make_strided<int64_t, 2>(ndim, sh, st);
    compare_kernel<T><<<grid_for(n, 256), 256, 0, stream>>>(out, (const T *)a, (const T *)b, s, n, op);
    return launch_check("compare (cuda)");
}

/* Block-wide reduction (sum or max) of a value of type A; every thread gets the result. */
template <typename A, bool MAX> __device__ A block_reduce(A v, A *red) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        A u = __shfl_xor_sync(0xffffffffu, v, o);
        v = MAX ? (u > v || u != u ? u : v) : v + u;
    }
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31, nw = (blockDim.x + 31) >> 5;
    __syncthreads();
    if (l == 0) red[w] = v;
    __syncthreads();
    v = l < nw ? red[l] : (MAX ? (A)-INFINITY : (A)0);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        A u = __shfl_xor_sync(0xffffffffu, v, o);
        v = MAX ? (u > v || u != u ? u : v) : v + u;
    }
    return v;
}

template <typename T> __global__ void log_softmax_fwd_kernel(T *y, const T *x, int64_t D) {
    typedef typename acc<T>::type A;
    __shared__ A red[32];
    const T *xr = x + blockIdx.x * D;
    T *yr = y + blockIdx.x * D;
    A m = (A)-INFINITY;
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
        A v = to_acc<T>(xr[i]);
        m = (v > m || v != v) ? v : m;
    }
    m = block_reduce<A, true>(m, red);
    A s = 0;
    if (m != (A)-INFINITY)
        for (int64_t i = threadIdx.x; i < D; i += blockDim.x) s += exp(to_acc<T>(xr[i]) - m);
    s = block_reduce<A, false>(s, red);
    const A lse = m == (A)-INFINITY ? m : m + log(s);
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x) yr[i] = from_acc<T>(to_acc<T>(xr[i]) - lse);
}

template <typename T> __global__ void log_softmax_bwd_kernel(T *dx, const T *dy, const T *y, int64_t D) {
    typedef typename acc<T>::type A;
    __shared__ A red[32];
    const int64_t o = blockIdx.x * D;
    A s = 0;
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x) s += to_acc<T>(dy[o + i]);
    s = block_reduce<A, false>(s, red);
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x)
        dx[o + i] = from_acc<T>(to_acc<T>(dy[o + i]) - exp(to_acc<T>(y[o + i])) * s);
}

static unsigned row_threads(int64_t D) {
    unsigned t = 32;
    while (t < 1024 && t < D) t <<= 1;
    return t;
}

template <typename T> int lsm_fwd(void *y, const void *x, int64_t N, int64_t D, cudaStream_t s) {
    log_softmax_fwd_kernel<T><<<(unsigned)N, row_threads(D), 0, s>>>((T *)y, (const T *)x, D);
    return launch_check("log_softmax_forward_cuda");
}
template <typename T> int lsm_bwd(void *dx, const void *dy, const void *y, int64_t N, int64_t D, cudaStream_t s) {
    log_softmax_bwd_kernel<T><<<(unsigned)N, row_threads(D), 0, s>>>((T *)dx, (const T *)dy, (const T *)y, D);
    return launch_check("log_softmax_backward_cuda");
}

template <typename T> __global__ void dropout_kernel(T *y, const T *x, const uint8_t *mask, int64_t n, float scale) {
    typedef typename acc<T>::type A;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = mask[i] ? from_acc<T>(to_acc<T>(x[i]) * (A)scale) : from_acc<T>((A)0);
}
template <typename T> int dropout_launch(void *y, const void *x, const uint8_t *mask, int64_t n, double scale, cudaStream_t s) {
    dropout_kernel<T><<<grid_for(n, 256), 256, 0, s>>>((T *)y, (const T *)x, mask, n, (float)scale);
    return launch_check("dropout_apply_cuda");
}

template <typename R>
__global__ void sgd_kernel(R *p, const R *g, R *buf, int64_t n, R lr, R mo, R damp, R wd, int nesterov, int first) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        if (!buf) {
            p[i] -= lr * (g[i] + wd * p[i]);
            continue;
        }
        R d = g[i] + wd * p[i];
        R b = first ? d : mo * buf[i] + damp * d;
        buf[i] = b;
        p[i] -= lr * (nesterov ? d + mo * b : b);
    }
}

}  // namespace

extern "C" int compare_cuda(uint8_t *out, const void *a, const int64_t *astride, const void *b,
                            const int64_t *bstride, int ndim, const int64_t *shape, int op, zr_dtype dt,
                            cudaStream_t stream) {
    if (ndim < 1 || ndim > ZRK_MAXD) return zr_error("compare (cuda): %d dims (1..%d supported)", ndim, ZRK_MAXD);
    int64_t sh[ZRK_MAXD], st[2][ZRK_MAXD];
    const int64_t *ss[2] = {astride, bstride};
    int64_t n = load_operands(ndim, shape, 2, ss, sh, st);
    if (n == 0) return 0;
    int nd = collapse_dims(ndim, sh, 2, st);
    if (nd == 0) {
        nd = 1;
        sh[0] = 1;
        st[0][0] = st[1][0] = 0;
    }
    switch (dt) {
    case ZR_F32: return compare_launch<float>(out, a, b, nd, sh, st, n, op, stream);
    case ZR_BF16: return compare_launch<__nv_bfloat16>(out, a, b, nd, sh, st, n, op, stream);
    case ZR_F16: return compare_launch<__half>(out, a, b, nd, sh, st, n, op, stream);
    case ZR_F64: return compare_launch<double>(out, a, b, nd, sh, st, n, op, stream);
    case ZR_I32: return compare_launch<int32_t>(out, a, b, nd, sh, st, n, op, stream);
    case ZR_I64: return compare_launch<int64_t>(out, a, b, nd, sh, st, n, op, stream);
    case ZR_U8: return compare_launch<uint8_t>(out, a, b, nd, sh, st, n, op, stream);
    default: return zr_error("compare (cuda): dtype %s is not supported", zr_dtype_name(dt));
    }
}

extern "C" int log_softmax_forward_cuda(void *y, const void *x, int64_t N, int64_t D, zr_dtype dt,
                                        cudaStream_t stream) {
    if (N == 0 || D == 0) return 0;
    if (N > 0x7fffffffLL) return zr_error("log_softmax_forward_cuda: %lld rows is too many", (long long)N);
    ZRK_DISPATCH_FLOAT(dt, "log_softmax_forward_cuda", lsm_fwd, y, x, N, D, stream)
}

extern "C" int log_softmax_backward_cuda(void *dx, const void *dy, const void *y, int64_t N, int64_t D,
                                         zr_dtype dt, cudaStream_t stream) {
    if (N == 0 || D == 0) return 0;
    if (N > 0x7fffffffLL) return zr_error("log_softmax_backward_cuda: %lld rows is too many", (long long)N);
    ZRK_DISPATCH_FLOAT(dt, "log_softmax_backward_cuda", lsm_bwd, dx, dy, y, N, D, stream)
}

extern "C" int dropout_apply_cuda(void *y, const void *x, const uint8_t *mask, int64_t n, double scale,
                                  zr_dtype dt, cudaStream_t stream) {
    if (n <= 0) return 0;
    ZRK_DISPATCH_FLOAT(dt, "dropout_apply_cuda", dropout_launch, y, x, mask, n, scale, stream)
}

extern "C" int sgd_step_cuda(void *p, const void *g, void *buf, int64_t n, double lr, double momentum,
                             double dampening, double weight_decay, int nesterov, int first, zr_dtype dt,
                             cudaStream_t stream) {
    if (n <= 0) return 0;
    unsigned grid = grid_for(n, 256);
    if (dt == ZR_F32)
        sgd_kernel<float><<<grid, 256, 0, stream>>>((float *)p, (const float *)g, (float *)buf, n, (float)lr,
                                                    (float)momentum, (float)(1 - dampening), (float)weight_decay,
                                                    nesterov, first);
    else if (dt == ZR_F64)
        sgd_kernel<double><<<grid, 256, 0, stream>>>((double *)p, (const double *)g, (double *)buf, n, lr, momentum,
                                                     1 - dampening, weight_decay, nesterov, first);
    else
        return zr_error("sgd_step_cuda: parameters must be f32 or f64, got %s", zr_dtype_name(dt));
    return launch_check("sgd_step_cuda");
}
