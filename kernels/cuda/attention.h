/* Causal flash attention on CUDA (sm_90, bf16/f16 tensor cores through mma.sync m16n8k16; on
 * compute capability 9.0 the Hopper kernels, wgmma and TMA, at head_dim 64 and 128:
 * attention_sm90.h) with grouped-query heads. No T×T tensor ever reaches device memory: scores live in registers, tiles
 * of q/k/v in shared memory, softmax is computed online; backward recomputes P from q, k and lse.
 *
 * Layouts: q, o, dq, do: (B, Hq, T, Dh); k, v, dk, dv: (B, Hkv, T, Dh), contiguous when the
 * layout argument is NULL, else strided as it says (the last dim contiguous; e.g. (B, T, H, Dh)
 * memory seen as (B, H, T, Dh), or heads sliced out of a fused projection);
 * lse: (B, Hq, T) f32 contiguous, natural-log logsumexp of the scaled scores of each query row.
 * Query head h reads kv head h / (Hq/Hkv). Dh must be 64, 128 or 256 (the mma.sync kernels alone, dense
 * operands), or on the Hopper kernels 80, 96 or 112 (attention_strided_ok: read in place by the 128-wide
 * tiles); dtype ZR_BF16 or ZR_F16.
 * scale <= 0 means 1/sqrt(Dh). Every call returns 0 or sets zr_error naming the kernel. */
#ifndef ZR_CUDA_ATTENTION_H
#define ZR_CUDA_ATTENTION_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "../base/dtype.h" /* C header: inside the extern "C" block */

/* Element (b, h, t, d) of an operand at b*sb + h*sh + t*st + d (elements). */
typedef struct {
    int64_t sb, sh, st;
} zr_attn_strides;
/* Every operand's strides (the forward reads q, k, v, o), and the batch's sequences: seg NULL is
 * causal attention over each batch row; else each row holds packed sequences (a padding-free batch),
 * seg pointing at 2·B·T int32 on the device, lo (B, T) then hi (B, T): token t of row b is in the
 * sequence of that row's tokens lo .. hi − 1 (row-relative, lo <= t < hi, the same lo and hi for
 * every token of a sequence); query t attends to keys lo .. t. Both kernel families take seg (the
 * Hopper ones with any layout they take, the mma.sync ones with dense operands; attention_varlen_ok). */
typedef struct {
    zr_attn_strides q, k, v, o, dout, dq, dk, dv;
    const int32_t *seg;
} zr_attn_layout;

/* 1 when strided layouts run on the current device for this head_dim/dtype (the Hopper kernels:
 * Dh 64, 128, 80, 96 or 112, bf16/f16, compute capability 9.0); then every stride and base must be a
 * multiple of 16 bytes. Elsewhere a non-NULL layout must describe contiguous operands. */
int attention_strided_ok(int64_t Dh, zr_dtype dtype);
/* 1 when the layout's seg (packed sequences) runs on the current device for this head_dim/dtype:
 * bf16/f16 at head_dim 64, 128 or 256 (the mma.sync kernels where the Hopper ones do not run), on a
 * device of compute capability 9.0 or above; at 80, 96, 112 where attention_strided_ok. */
int attention_varlen_ok(int64_t Dh, zr_dtype dtype);

/* o = softmax(q k^T * scale + causal mask) v; lse saved for backward. L: NULL or the layout. */
int attention_forward_cuda(void *o, float *lse, const void *q, const void *k, const void *v,
                           const zr_attn_layout *L, int64_t B, int64_t Hq, int64_t Hkv, int64_t T,
                           int64_t Dh, float scale, zr_dtype dtype, cudaStream_t stream);

/* Bytes of device scratch attention_backward_cuda needs (f32 dq accumulator, D = rowsum(dO∘O), the
 * scaled lse and, for small grids, per-split f32 partials of dk/dv). */
size_t attention_backward_workspace_size(int64_t B, int64_t Hq, int64_t Hkv, int64_t T,
                                         int64_t Dh);

/* Writes dq, dk, dv (overwritten, not accumulated). dk/dv are summed over each kv head's query
 * group inside the kernel in a fixed order; dq is accumulated with f32 atomics or reduce-adds (the order of
 * those adds may vary between runs at the last bit). workspace: at least
 * attention_backward_workspace_size(...) bytes, 16-byte aligned. */
int attention_backward_cuda(void *dq, void *dk, void *dv, const void *dout, const void *q,
                            const void *k, const void *v, const void *o, const float *lse,
                            void *workspace, const zr_attn_layout *L, int64_t B, int64_t Hq,
                            int64_t Hkv, int64_t T, int64_t Dh, float scale, zr_dtype dtype,
                            cudaStream_t stream);

/* attention_backward_cuda where q and k are a rope's output (zr_qkv_rope_sdpa): cos, sin (T, Dh)
 * f32 contiguous and 16-byte aligned, the tables q and k were rotated with (Hugging Face
 * rotate_half: pairs (i, i + Dh/2)). dq and dk come out as the gradients of the unrotated q and k
 * (the rotation's transpose applied in the pass that turns the f32 accumulators into dq, dk, dv;
 * dk in place where the kernel wrote it directly), so no rotated gradient is ever stored. */
int attention_backward_rope_cuda(void *dq, void *dk, void *dv, const void *dout, const void *q,
                                 const void *k, const void *v, const void *o, const float *lse,
                                 void *workspace, const zr_attn_layout *L, int64_t B, int64_t Hq,
                                 int64_t Hkv, int64_t T, int64_t Dh, float scale, const float *cos,
                                 const float *sin, zr_dtype dtype, cudaStream_t stream);

#ifdef __cplusplus
}
#endif


#endif
