/* CUDA twins of kernels/cpu/zenflow.h (ZenFlow's selective column update): the same arguments
 * plus a stream; parameters f32 or bf16, everything else f32, idx int32 on the device. */
#ifndef ZR_CUDA_ZENFLOW_H
#define ZR_CUDA_ZENFLOW_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "../base/dtype.h"

int zenflow_colsum_cuda(float *out, const float *g, int64_t rows, int64_t cols, cudaStream_t stream);
/* *out (f32, device) = the CPU twin's sum, in a fixed order (per-block partials in double into part,
 * zenflow_absdiff_parts() of them, then summed in block order). */
int zenflow_absdiff_parts(void);
int zenflow_absdiff_sum_cuda(float *out, double *part, const float *a, float *prev, int64_t n, int have_prev, int keep,
                             cudaStream_t stream);
int zenflow_gather_cuda(void *out, const void *src, int esz, int64_t rows, int64_t cols, const int32_t *idx, int64_t k,
                        cudaStream_t stream);
int zenflow_scatter_cuda(void *dst, const void *src, int esz, int64_t rows, int64_t cols, const int32_t *idx,
                         int64_t k, cudaStream_t stream);
int zenflow_adamw_cuda(void *p, zr_dtype pdt, const float *g, int g_sel, float *m, float *v, int64_t rows,
                       int64_t cols, const int32_t *idx, int64_t k, double lr, double b1, double b2, double eps,
                       double wd, int64_t step, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
