// Elementwise kernels on CUDA (see elementwise.h); the math mirrors kernels/cpu/elementwise.c.
// Contiguous maps move 16 bytes per operand per thread step when every pointer is 16-byte
// aligned; the op switch is uniform across the grid, so it costs a branch, not divergence.
#include "common.cuh"
#include "elementwise.h"

extern "C" {
#include "../cpu/kernels.h" /* ZR_UN_* and ZR_BIN_* op codes */
}

using namespace zrk;

namespace {

__device__ __forceinline__ float m_exp(float x) { return expf(x); }
__device__ __forceinline__ double m_exp(double x) { return exp(x); }
__device__ __forceinline__ float m_log(float x) { return logf(x); }
__device__ __forceinline__ double m_log(double x) { return log(x); }
__device__ __forceinline__ float m_sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double m_sqrt(double x) { return sqrt(x); }
__device__ __forceinline__ float m_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double m_tanh(double x) { return tanh(x); }
__device__ __forceinline__ float m_erf(float x) { return erff(x); }
__device__ __forceinline__ double m_erf(double x) { return erf(x); }
__device__ __forceinline__ float m_pow(float x, float p) { return powf(x, p); }
__device__ __forceinline__ double m_pow(double x, double p) { return pow(x, p); }
__device__ __forceinline__ float m_abs(float x) { return fabsf(x); }
__device__ __forceinline__ double m_abs(double x) { return fabs(x); }

template <typename A> __device__ __forceinline__ A sigm(A x) { return (A)1 / ((A)1 + m_exp(-x)); }
// f32: the hardware exp2 and a correctly rounded reciprocal, a few ulp from expf and 1/x. The
// exact forms cost ~30 instructions an element, which made silu compute-bound (55% of bandwidth
// in bf16). __frcp_rn(inf) is 0, so large negative inputs still give 0.
template <> __device__ __forceinline__ float sigm<float>(float x) { return __frcp_rn(1.0f + __expf(-x)); }
// tanh-approximated GELU through 0.5 (1 + tanh u) = sigmoid(2u) and 1 - tanh^2 u = 4 s (1 - s):
// the same function, on the fast sigmoid above (precise tanhf made the bf16 kernels
// compute-bound: GPT-2's GELU at ~60% of bandwidth).
template <typename A> __device__ __forceinline__ A gelu_tanh(A x) {
    const A c2 = (A)1.5957691216057308; /* 2 sqrt(2/pi) */
    return x * sigm(c2 * (x + (A)0.044715 * x * x * x));
}
template <typename A> __device__ __forceinline__ A gelu_tanh_grad(A x) {
    const A c2 = (A)1.5957691216057308;
    const A s = sigm(c2 * (x + (A)0.044715 * x * x * x));
    const A du2 = c2 * ((A)1 + (A)0.134145 * x * x); /* d(2u)/dx */
    return s + x * s * ((A)1 - s) * du2;
}

template <typename A> __device__ __forceinline__ A un_f(int op, A x, A p) {
    switch (op) {
    case ZR_UN_NEG: return -x;
    case ZR_UN_EXP: return m_exp(x);
    case ZR_UN_LOG: return m_log(x);
    case ZR_UN_SQRT: return m_sqrt(x);
    case ZR_UN_RSQRT: return (A)1 / m_sqrt(x);
    case ZR_UN_RELU: return x > 0 ? x : (A)0;
    case ZR_UN_GELU_TANH: return gelu_tanh(x);
    case ZR_UN_GELU_ERF: return (A)0.5 * x * ((A)1 + m_erf(x * (A)0.7071067811865476));
    case ZR_UN_SILU: return x * sigm(x);
    case ZR_UN_SIGMOID: return sigm(x);
    case ZR_UN_TANH: return m_tanh(x);
    case ZR_UN_POW: return m_pow(x, p);
    case ZR_UN_ABS: return m_abs(x);
    case ZR_UN_SQUARE: return x * x;
    case ZR_UN_RECIPROCAL: return (A)1 / x;
    default: return x;
    }
}

// v is x, or y = f(x) for the ops that differentiate from the output (see ops/elementwise.c).
template <typename A> __device__ __forceinline__ A un_b(int op, A gy, A v, A p) {
    switch (op) {
    case ZR_UN_NEG: return -gy;
    case ZR_UN_EXP: return gy * v;
    case ZR_UN_LOG: return gy / v;
    case ZR_UN_SQRT: return gy * (A)0.5 / v;
    case ZR_UN_RSQRT: return gy * (A)-0.5 * v * v * v;
    case ZR_UN_RELU: return v > 0 ? gy : (A)0;
    case ZR_UN_GELU_TANH: return gy * gelu_tanh_grad(v);
    case ZR_UN_GELU_ERF: {
        A cdf = (A)0.5 * ((A)1 + m_erf(v * (A)0.7071067811865476));
        A pdf = m_exp((A)-0.5 * v * v) * (A)0.3989422804014327;
        return gy * (cdf + v * pdf);
    }
    case ZR_UN_SILU: {
        A s = sigm(v);
        return gy * s * ((A)1 + v * ((A)1 - s));
    }
    case ZR_UN_SIGMOID: return gy * v * ((A)1 - v);
    case ZR_UN_TANH: return gy * ((A)1 - v * v);
    case ZR_UN_POW: return gy * p * m_pow(v, p - (A)1);
    case ZR_UN_ABS: return v > 0 ? gy : v < 0 ? -gy : (A)0;
    case ZR_UN_SQUARE: return gy * (A)2 * v;
    case ZR_UN_RECIPROCAL: return -gy * v * v;
    default: return gy;
    }
}

template <typename A> __device__ __forceinline__ A bin(int op, A a, A b) {
    switch (op) {
    case ZR_BIN_ADD: return a + b;
    case ZR_BIN_SUB: return a - b;
    case ZR_BIN_MUL: return a * b;
    case ZR_BIN_DIV: return a / b;
    case ZR_BIN_MAX: return a > b ? a : b;
    default: return a < b ? a : b;
    }
}

// The functor families a contiguous map applies: NIN inputs, one output, in compute type A.
template <typename A> struct f_binary {
    int op;
    __device__ __forceinline__ A operator()(A a, A b) const { return bin(op, a, b); }
};
template <typename A> struct f_affine {
    A alpha, beta;
    __device__ __forceinline__ A operator()(A x, A) const { return alpha * x + beta; }
};
template <typename A> struct f_axpy { /* out = y + alpha * x; in0 = y, in1 = x */
    A alpha;
    __device__ __forceinline__ A operator()(A y, A x) const { return y + alpha * x; }
};

// out[i] = f(in0[i], in1[i]) (in1 ignored when NIN == 1). V elements per step.
template <typename T, int V, int NIN, typename F>
__global__ void map_kernel(T *out, const T *in0, const T *in1, int64_t n, F f) {
    typedef typename acc<T>::type A;
    int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, step = (int64_t)gridDim.x * blockDim.x;
    int64_t nv = n / V;
    for (int64_t i = tid; i < nv; i += step) {
        pack<T, V> a = reinterpret_cast<const pack<T, V> *>(in0)[i], b, o;
        if (NIN == 2) b = reinterpret_cast<const pack<T, V> *>(in1)[i];
#pragma unroll
        for (int k = 0; k < V; k++) o.v[k] = from_acc<T>(f(to_acc(a.v[k]), NIN == 2 ? to_acc(b.v[k]) : (A)0));
        reinterpret_cast<pack<T, V> *>(out)[i] = o;
    }
    for (int64_t i = nv * V + tid; i < n; i += step)
        out[i] = from_acc<T>(f(to_acc(in0[i]), NIN == 2 ? to_acc(in1[i]) : (A)0));
}

const int THREADS = 256;

template <typename T, int NIN, typename F>
int launch_map(T *out, const T *in0, const T *in1, int64_t n, F f, cudaStream_t s, const char *what) {
    if (n <= 0) return 0;
    const int V = vec_of<T>::n;
    if (aligned16(out) && aligned16(in0) && (NIN == 1 || aligned16(in1)))
        map_kernel<T, V, NIN, F><<<grid_for(n / V + 1, THREADS), THREADS, 0, s>>>(out, in0, in1, n, f);
    else
        map_kernel<T, 1, NIN, F><<<grid_for(n, THREADS), THREADS, 0, s>>>(out, in0, in1, n, f);
    return launch_check(what);
}

// out (R, C) = a (R, C) op b (C) broadcast down the rows (or b op a when swap), in V-packs; C % V
// == 0 so a pack never straddles two rows. The bias/scale pattern, kept at full bandwidth.
template <typename T, int V>
__global__ void binary_row_kernel(T *__restrict__ out, const T *__restrict__ a, const T *__restrict__ b, int64_t n,
                                  int64_t C, int op, int swap) {
    int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = tid; i < n / V; i += step) {
        pack<T, V> pa = reinterpret_cast<const pack<T, V> *>(a)[i];
        pack<T, V> pb = reinterpret_cast<const pack<T, V> *>(b)[(i * V % C) / V], po;
#pragma unroll
        for (int k = 0; k < V; k++) {
            auto x = to_acc(pa.v[k]), y = to_acc(pb.v[k]);
            po.v[k] = from_acc<T>(swap ? bin(op, y, x) : bin(op, x, y));
        }
        reinterpret_cast<pack<T, V> *>(out)[i] = po;
    }
}

template <typename T, typename I>
__global__ void binary_strided_kernel(T *__restrict__ out, const T *a, const T *b, I n, strided<I, 2> g, int op) {
    for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (I)gridDim.x * blockDim.x) {
        I off[2];
        offsets_of<I, 2>(g, i, off);
        out[i] = from_acc<T>(bin(op, to_acc(a[off[0]]), to_acc(b[off[1]])));
    }
}

template <typename T, typename I>
__global__ void where_strided_kernel(T *__restrict__ out, const uint8_t *c, const T *a, const T *b, I n,
                                     strided<I, 3> g) {
    for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (I)gridDim.x * blockDim.x) {
        I off[3];
        offsets_of<I, 3>(g, i, off);
        out[i] = c[off[0]] ? a[off[1]] : b[off[2]];
    }
}

// Applies unary op (or its backward) to V values. The switch is taken once per pack and each case
// is unrolled with a constant op, so no element pays an indirect branch (a per-element jump
// table held bf16 silu at 55-59% of bandwidth).
template <typename A, int V, bool BWD>
__device__ __forceinline__ void un_pack(int op, A p, A (&y)[V], const A (&v)[V], const A (&g)[V]) {
#define ZRK_UN_CASE(OP)                                                                           \
    case OP:                                                                                      \
        _Pragma("unroll") for (int k = 0; k < V; k++) y[k] = BWD ? un_b<A>(OP, g[k], v[k], p) : un_f<A>(OP, v[k], p); \
        break;
    switch (op) {
        ZRK_UN_CASE(ZR_UN_NEG) ZRK_UN_CASE(ZR_UN_EXP) ZRK_UN_CASE(ZR_UN_LOG) ZRK_UN_CASE(ZR_UN_SQRT)
        ZRK_UN_CASE(ZR_UN_RSQRT) ZRK_UN_CASE(ZR_UN_RELU) ZRK_UN_CASE(ZR_UN_GELU_TANH) ZRK_UN_CASE(ZR_UN_GELU_ERF)
        ZRK_UN_CASE(ZR_UN_SILU) ZRK_UN_CASE(ZR_UN_SIGMOID) ZRK_UN_CASE(ZR_UN_TANH) ZRK_UN_CASE(ZR_UN_POW)
        ZRK_UN_CASE(ZR_UN_ABS) ZRK_UN_CASE(ZR_UN_SQUARE) ZRK_UN_CASE(ZR_UN_RECIPROCAL)
    default:
        _Pragma("unroll") for (int k = 0; k < V; k++) y[k] = v[k];
    }
#undef ZRK_UN_CASE
}

// out = f(v) (forward) or f'(v) * g (backward, v = x or y), V elements per step.
template <typename T, int V, bool BWD>
__global__ void unary_kernel(T *out, const T *v, const T *g, int64_t n, int op, typename acc<T>::type p) {
    typedef typename acc<T>::type A;
    int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, step = (int64_t)gridDim.x * blockDim.x;
    int64_t nv = n / V;
    for (int64_t i = tid; i < nv; i += step) {
        pack<T, V> pv = reinterpret_cast<const pack<T, V> *>(v)[i], pg, po;
        if (BWD) pg = reinterpret_cast<const pack<T, V> *>(g)[i];
        A av[V], ag[V], ay[V];
#pragma unroll
        for (int k = 0; k < V; k++) av[k] = to_acc(pv.v[k]), ag[k] = BWD ? to_acc(pg.v[k]) : (A)0;
        un_pack<A, V, BWD>(op, p, ay, av, ag);
#pragma unroll
        for (int k = 0; k < V; k++) po.v[k] = from_acc<T>(ay[k]);
        reinterpret_cast<pack<T, V> *>(out)[i] = po;
    }
    for (int64_t i = nv * V + tid; i < n; i += step) {
        A av[1] = {to_acc(v[i])}, ag[1] = {BWD ? to_acc(g[i]) : (A)0}, ay[1];
        un_pack<A, 1, BWD>(op, p, ay, av, ag);
        out[i] = from_acc<T>(ay[0]);
    }
}

template <typename T, bool BWD>
int launch_unary(void *out, const void *v, const void *g, int64_t n, int op, double p, cudaStream_t s, const char *what) {
    if (n <= 0) return 0;
    typedef typename acc<T>::type A;
    const int V = vec_of<T>::n;
    if (aligned16(out) && aligned16(v) && (!BWD || aligned16(g)))
        unary_kernel<T, V, BWD><<<grid_for(n / V + 1, THREADS), THREADS, 0, s>>>((T *)out, (const T *)v, (const T *)g, n, op, (A)p);
    else
        unary_kernel<T, 1, BWD><<<grid_for(n, THREADS), THREADS, 0, s>>>((T *)out, (const T *)v, (const T *)g, n, op, (A)p);
    return launch_check(what);
}

template <typename T> int unary_fwd(void *y, const void *x, int64_t n, int op, double p, cudaStream_t s) {
    return launch_unary<T, false>(y, x, nullptr, n, op, p, s, "unary forward (cuda)");
}
template <typename T>
int unary_bwd(void *gx, const void *gy, const void *v, int64_t n, int op, double p, cudaStream_t s) {
    return launch_unary<T, true>(gx, v, gy, n, op, p, s, "unary backward (cuda)");
}
template <typename T> int affine(void *y, const void *x, int64_t n, double alpha, double beta, cudaStream_t s) {
    typedef typename acc<T>::type A;
    f_affine<A> f = {(A)alpha, (A)beta};
    return launch_map<T, 1>((T *)y, (const T *)x, (const T *)nullptr, n, f, s, "affine (cuda)");
}
template <typename T> int axpy(void *y, const void *x, int64_t n, double alpha, cudaStream_t s) {
    typedef typename acc<T>::type A;
    f_axpy<A> f = {(A)alpha};
    return launch_map<T, 2>((T *)y, (const T *)y, (const T *)x, n, f, s, "axpy (cuda)");
}

template <typename T>
int binary(void *out, const void *a, const void *b, int ndim, int64_t *sh, int64_t (*st)[ZRK_MAXD], int64_t n,
           int op, cudaStream_t s) {
    if (ndim == 0 || (ndim == 1 && st[0][0] == 1 && st[1][0] == 1)) {
        typedef typename acc<T>::type A;
        f_binary<A> f = {op};
        if (ndim == 0) n = 1;
        return launch_map<T, 2>((T *)out, (const T *)a, (const T *)b, n, f, s, "binary (cuda)");
    }
    const int V = vec_of<T>::n;
    if (ndim == 2 && sh[1] % V == 0 && aligned16(out) && aligned16(a) && aligned16(b)) {
        int full = -1; /* which operand is the full (R, C) one; the other is a (C) row */
        if (st[0][0] == sh[1] && st[0][1] == 1 && st[1][0] == 0 && st[1][1] == 1) full = 0;
        if (st[1][0] == sh[1] && st[1][1] == 1 && st[0][0] == 0 && st[0][1] == 1) full = 1;
        if (full >= 0) {
            binary_row_kernel<T, V><<<grid_for(n / V, THREADS), THREADS, 0, s>>>(
                (T *)out, (const T *)(full ? b : a), (const T *)(full ? a : b), n, sh[1], op, full);
            return launch_check("binary (cuda)");
        }
    }
    if (fits_i32(ndim, sh, 2, st))
        binary_strided_kernel<T, int32_t><<<grid_for(n, THREADS), THREADS, 0, s>>>(
            (T *)out, (const T *)a, (const T *)b, (int32_t)n, make_strided<int32_t, 2>(ndim, sh, st), op);
    else
        binary_strided_kernel<T, int64_t><<<grid_for(n, THREADS), THREADS, 0, s>>>(
            (T *)out, (const T *)a, (const T *)b, n, make_strided<int64_t, 2>(ndim, sh, st), op);
    return launch_check("binary (cuda)");
}

template <typename T>
int where_(void *out, const uint8_t *c, const void *a, const void *b, int ndim, int64_t *sh, int64_t (*st)[ZRK_MAXD],
           int64_t n, cudaStream_t s) {
    if (fits_i32(ndim, sh, 3, st))
        where_strided_kernel<T, int32_t><<<grid_for(n, THREADS), THREADS, 0, s>>>(
            (T *)out, c, (const T *)a, (const T *)b, (int32_t)n, make_strided<int32_t, 3>(ndim, sh, st));
    else
        where_strided_kernel<T, int64_t><<<grid_for(n, THREADS), THREADS, 0, s>>>(
            (T *)out, c, (const T *)a, (const T *)b, n, make_strided<int64_t, 3>(ndim, sh, st));
    return launch_check("where (cuda)");
}

int uses_y(int op) {
    return op == ZR_UN_EXP || op == ZR_UN_SQRT || op == ZR_UN_RSQRT || op == ZR_UN_SIGMOID ||
           op == ZR_UN_TANH || op == ZR_UN_RECIPROCAL;
}

}  // namespace

extern "C" int unary_forward_cuda(void *y, const void *x, int64_t n, int op, double p, zr_dtype dt,
                                  cudaStream_t stream) {
    ZRK_DISPATCH_FLOAT(dt, "unary forward (cuda)", unary_fwd, y, x, n, op, p, stream)
}

extern "C" int unary_backward_cuda(void *gx, const void *gy, const void *x, const void *y, int64_t n, int op,
                                   double p, zr_dtype dt, cudaStream_t stream) {
    const void *v = uses_y(op) ? y : x;
    if (!v && op != ZR_UN_NEG) return zr_error("unary backward (cuda): op %d needs %s", op, uses_y(op) ? "y" : "x");
    if (!v) v = gy;
    ZRK_DISPATCH_FLOAT(dt, "unary backward (cuda)", unary_bwd, gx, gy, v, n, op, p, stream)
}

extern "C" int binary_forward_cuda(void *out, const void *a, const int64_t *astride, const void *b,
                                   const int64_t *bstride, int ndim, const int64_t *shape, int op, zr_dtype dt,
                                   cudaStream_t stream) {
    if (ndim > ZRK_MAXD) return zr_error("binary (cuda): at most %d dims", ZRK_MAXD);
    int64_t sh[ZRK_MAXD], st[2][ZRK_MAXD];
    const int64_t *ss[2] = {astride, bstride};
    int64_t n = load_operands(ndim, shape, 2, ss, sh, st);
    if (n == 0) return 0;
    int nd = collapse_dims(ndim, sh, 2, st);
    ZRK_DISPATCH_FLOAT(dt, "binary (cuda)", binary, out, a, b, nd, sh, st, n, op, stream)
}

extern "C" int affine_forward_cuda(void *y, const void *x, int64_t n, double alpha, double beta, zr_dtype dt,
                                   cudaStream_t stream) {
    ZRK_DISPATCH_FLOAT(dt, "affine (cuda)", affine, y, x, n, alpha, beta, stream)
}

// y (f32) += alpha * x (16-bit): a 16-bit gradient added into an fp32 one without a widened copy.
template <typename T>
__global__ void axpy_widen_kernel(float *__restrict__ y, const T *__restrict__ x, int64_t n, float alpha) {
    int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = tid; i < n / 8; i += step) {
        pack<T, 8> a = reinterpret_cast<const pack<T, 8> *>(x)[i];
        float4 *yp = reinterpret_cast<float4 *>(y) + 2 * i;
        float4 lo = yp[0], hi = yp[1];
        lo.x += alpha * to_acc(a.v[0]); lo.y += alpha * to_acc(a.v[1]);
        lo.z += alpha * to_acc(a.v[2]); lo.w += alpha * to_acc(a.v[3]);
        hi.x += alpha * to_acc(a.v[4]); hi.y += alpha * to_acc(a.v[5]);
        hi.z += alpha * to_acc(a.v[6]); hi.w += alpha * to_acc(a.v[7]);
        yp[0] = lo;
        yp[1] = hi;
    }
    for (int64_t i = n / 8 * 8 + tid; i < n; i += step) y[i] += alpha * to_acc(x[i]);
}
template <typename T> int axpy_widen(float *y, const void *x, int64_t n, float alpha, cudaStream_t s) {
    axpy_widen_kernel<T><<<grid_for(n / 8 + 1, THREADS), THREADS, 0, s>>>(y, (const T *)x, n, alpha);
    return launch_check("axpy (cuda, widening)");
}

extern "C" int axpy_widen_cuda(float *y, const void *x, zr_dtype xdt, int64_t n, double alpha, cudaStream_t stream) {
    if (n <= 0) return 0;
    if (((uintptr_t)y & 31) || ((uintptr_t)x & 15)) return -2; /* unaligned: the caller widens a copy */
    if (xdt == ZR_BF16) return axpy_widen<__nv_bfloat16>(y, x, n, (float)alpha, stream);
    if (xdt == ZR_F16) return axpy_widen<__half>(y, x, n, (float)alpha, stream);
    return -2;
}

extern "C" int axpy_cuda(void *y, const void *x, int64_t n, double alpha, zr_dtype dt, cudaStream_t stream) {
    ZRK_DISPATCH_FLOAT(dt, "axpy (cuda)", axpy, y, x, n, alpha, stream)
}

extern "C" int where_forward_cuda(void *out, const uint8_t *cond, const int64_t *cstride, const void *a,
                                  const int64_t *astride, const void *b, const int64_t *bstride, int ndim,
                                  const int64_t *shape, zr_dtype dt, cudaStream_t stream) {
    if (ndim > ZRK_MAXD) return zr_error("where (cuda): at most %d dims", ZRK_MAXD);
    int64_t sh[ZRK_MAXD], st[3][ZRK_MAXD];
    const int64_t *ss[3] = {cstride, astride, bstride};
    int64_t n = load_operands(ndim, shape, 3, ss, sh, st);
    if (n == 0) return 0;
    int nd = collapse_dims(ndim, sh, 3, st);
    ZRK_DISPATCH_FLOAT(dt, "where (cuda)", where_, out, cond, a, b, nd, sh, st, n, stream)
}
