/* Comparisons on CUDA (see compare.h): a grid-stride kernel over broadcast strides; not on the
 * hot path of training, so clarity wins. */
#include <math.h>

#include "common.cuh" /* first: it includes the C headers inside extern "C" */
#include "compare.h"

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
