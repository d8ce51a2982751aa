/* Embedding lookup on CUDA: forward gathers rows of the (V, D) table by int64 ids; backward
 * scatters the (N, D) gradient into dW deterministically (ids sorted with their positions, then
 * each distinct id sums its rows in position order: no atomics, the same bits every run).
 * dtype of weight/out/dout/dW: ZR_F32, ZR_BF16 or ZR_F16. Ids outside [0, V) give zero rows in
 * forward and are skipped in backward. */
#ifndef ZR_CUDA_EMBEDDING_H
#define ZR_CUDA_EMBEDDING_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "../base/dtype.h" /* C header: inside the extern "C" block */

/* out (N, D) = weight[ids] */
int embedding_forward_cuda(void *out, const void *weight, const int64_t *ids, int64_t N,
                           int64_t V, int64_t D, zr_dtype dtype, cudaStream_t stream);
/* Bytes of device scratch embedding_backward_cuda needs for N ids over a vocabulary of V. */
size_t embedding_backward_workspace_size(int64_t N, int64_t V);
/* dW (V, D): accumulate = 0 overwrites (rows no id names become 0), 1 adds to dW. */
int embedding_backward_cuda(void *dW, const void *dout, const int64_t *ids, void *workspace,
                            int64_t N, int64_t V, int64_t D, int accumulate, zr_dtype dtype,
                            cudaStream_t stream);
/* dW (V, D) fp32 += the scatter of a 16-bit dout (the same workspace): only the named rows are
 * touched, each summed in f32 in position order. -2 (nothing launched) when the shape does not
 * suit the grouping path or dout is not bf16/f16: use embedding_backward_cuda and add. */
int embedding_backward_add_f32_cuda(float *dW, const void *dout, const int64_t *ids,
                                    void *workspace, int64_t N, int64_t V, int64_t D,
                                    zr_dtype dtype, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
