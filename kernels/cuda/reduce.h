/* Row reductions on CUDA: twins of kernels/cpu/reduce.h. x is (outer, r) contiguous; the ops layer
 * permutes reduced dims last. Sums accumulate in f64 whatever the dtype (deterministic: a fixed
 * reduction order, no atomics); max returns the first position of the maximum and lets a NaN win,
 * like the CPU. Every call returns 0, or -1 with zr_error set naming the kernel. */
#ifndef ZR_CUDA_REDUCE_H
#define ZR_CUDA_REDUCE_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#include "../base/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Device scratch bytes reduce_sum_rows_cuda needs for this shape (0 for most: only few long rows
 * are split across blocks). */
size_t reduce_sum_rows_cuda_workspace(int64_t outer, int64_t r);
/* out[o] = scale * sum of row o (scale 1 for sum, 1/r for mean); out has dtype dt. workspace: at
 * least reduce_sum_rows_cuda_workspace(outer, r) bytes, 8-byte aligned (NULL when that is 0). */
int reduce_sum_rows_cuda(void *out, const void *x, int64_t outer, int64_t r, double scale,
                         void *workspace, zr_dtype dt, cudaStream_t stream);
/* out[o] = max of row o; idx[o] (may be NULL) = its first position. */
int reduce_max_rows_cuda(void *out, int64_t *idx, const void *x, int64_t outer, int64_t r,
                         zr_dtype dt, cudaStream_t stream);
/* gx (outer, r) = 0 except gx[o, idx[o]] = g[o]; one pass, no separate memset. */
int reduce_max_rows_backward_cuda(void *gx, const void *g, const int64_t *idx, int64_t outer,
                                  int64_t r, zr_dtype dt, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
