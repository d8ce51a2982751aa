/* Qwen3's q/k norms fused with the rope on CUDA (zr_qkv_norm_rope): one launch turns the packed
 * (B, T, (H + 2 KV)·Dh) q/k/v projection into q = rope(q_norm(q)), k = rope(k_norm(k)) and copied v
 * (in any layout of kernels/base/qkv_layout.h: where the attention kernels read them), and one
 * launch a part turns q's, k's or v's gradient back into its columns of the projection's gradient,
 * the norm weight's gradient in the same pass.
 * q_norm / k_norm: RMSNorm over each head (Hugging Face's: y = w · T(x · rstd), rstd =
 * (mean x² + eps)^-1/2), as zr_rmsnorm computes it, then the rotate_half rope in f32 rounded once,
 * as zr_rope. Dh 64 or 128; cos, sin (T, Dh) f32 contiguous; every operand of dtype (bf16, f16 or
 * f32) but the f32 tables. The CPU twin is the composition of those ops (ops/qkv_rope.c). */
#ifndef ZR_CUDA_QK_NORM_ROPE_H
#define ZR_CUDA_QK_NORM_ROPE_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "../base/dtype.h" /* C headers: inside the extern "C" block */
#include "../base/qkv_layout.h"

/* 1 where the kernels below take head_dim Dh (64 or 128). */
int qk_norm_rope_ok(int64_t Dh);

/* q, k = rope(norm(their heads of qkv)) with weights wq, wk (Dh each), v = its heads copied. */
int qk_norm_rope_forward_cuda(void *q, void *k, void *v, const void *qkv, const void *wq, const void *wk,
                              float eps, const float *cos, const float *sin, const zr_qkv_layout *L,
                              int64_t B, int64_t T, int64_t H, int64_t KV, int64_t Dh, zr_dtype dtype,
                              cudaStream_t stream);

/* Bytes of f32 workspace qk_norm_rope_backward_cuda needs for a part of `heads` heads (the blocks'
 * partial weight gradients). */
size_t qk_norm_rope_backward_workspace(int64_t B, int64_t T, int64_t heads, int64_t Dh);

/* One part's gradient into the packed gradient dqkv (B, T, (H + 2 KV)·Dh; strides L->sb, L->st):
 * part p (0 q, 1 k, 2 v) of g (B, heads, T, Dh; strides L->part[p]; NULL: zeros) goes back through
 * the rope's transpose and the norm (q, k; the norm's output gradient rounded to dtype first, as
 * the composition's rope backward stores it) or as it is (v) into that part's columns, written or,
 * with accumulate, added. x: the product qkv (strides xsb, xst), w: the part's norm weight, cos,
 * sin as the forward's. dw (Dh, wdtype: dtype or f32; NULL: not wanted) is written with the
 * weight's gradient, ws holding qk_norm_rope_backward_workspace bytes. */
int qk_norm_rope_backward_cuda(void *dqkv, const void *g, const zr_qkv_layout *L, int p, const void *x,
                               int64_t xsb, int64_t xst, const void *w, float eps, const float *cos,
                               const float *sin, void *dw, zr_dtype wdtype, float *ws, int accumulate,
                               int64_t B, int64_t T, int64_t H, int64_t KV, int64_t Dh, zr_dtype dtype,
                               cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
