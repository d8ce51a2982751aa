/* Causal flash attention on CUDA (sm_90, bf16/f16 tensor cores through mma.sync m16n8k16) with
 * grouped-query heads. No T×T tensor ever reaches device memory: scores live in registers, tiles
 * of q/k/v in shared memory, softmax is computed online; backward recomputes P from q, k and lse.
 *
 * Layouts (all contiguous): q, o, dq, do: (B, Hq, T, Dh); k, v, dk, dv: (B, Hkv, T, Dh);
 * lse: (B, Hq, T) f32, natural-log logsumexp of the scaled scores of each query row.
 * Query head h reads kv head h / (Hq/Hkv). Dh must be 64 or 128; dtype ZR_BF16 or ZR_F16.
 * scale <= 0 means 1/sqrt(Dh). Every call returns 0 or sets zr_error naming the kernel. */
#ifndef ZR_CUDA_ATTENTION_H
#define ZR_CUDA_ATTENTION_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "dtype.h" /* C header: inside the extern "C" block */

/* o = softmax(q k^T * scale + causal mask) v; lse saved for backward. */
int attention_forward_cuda(void *o, float *lse, const void *q, const void *k, const void *v,
                           int64_t B, int64_t Hq, int64_t Hkv, int64_t T, int64_t Dh, float scale,
                           zr_dtype dtype, cudaStream_t stream);

/* Bytes of device scratch attention_backward_cuda needs (f32 dq accumulator, D = rowsum(dO∘O),
 * and, for small grids, per-split f32 partials of dk/dv). */
size_t attention_backward_workspace_size(int64_t B, int64_t Hq, int64_t Hkv, int64_t T,
                                         int64_t Dh);

/* Writes dq, dk, dv (overwritten, not accumulated). dk/dv are summed over each kv head's query
 * group inside the kernel in a fixed order; dq is accumulated with f32 atomics (the order of
 * those adds may vary between runs at the last bit). workspace: at least
 * attention_backward_workspace_size(...) bytes, 16-byte aligned. */
int attention_backward_cuda(void *dq, void *dk, void *dv, const void *dout, const void *q,
                            const void *k, const void *v, const void *o, const float *lse,
                            void *workspace, int64_t B, int64_t Hq, int64_t Hkv, int64_t T,
                            int64_t Dh, float scale, zr_dtype dtype, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
