/* Small CUDA kernels for the ZeRO engine's optimizer step. */
#ifndef ZR_CUDA_ZERO_OPS_H
#define ZR_CUDA_ZERO_OPS_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "../base/dtype.h" /* C header: inside the extern "C" block */

/* Scratch doubles zero_sumsq_cuda needs (one per block, plus the result). */
size_t zero_sumsq_workspace(int64_t n);
/* *out (device) = sum of x[i]^2 over n values of dtype dt (f32, bf16 or f16), accumulated in f64
 * in a fixed order (two passes: per-block partials, then one block), so repeated runs give the
 * same bits. ws: zero_sumsq_workspace(n) doubles; out may point into it. */
int zero_sumsq_cuda(double *out, const void *x, zr_dtype dt, int64_t n, double *ws, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
