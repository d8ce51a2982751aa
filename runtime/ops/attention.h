/* Causal scaled dot-product attention with grouped-query heads, with autograd. Saves q, k, v, the
 * output and one logsumexp per query row (B, Hq, T), never the T x T probabilities: backward
 * recomputes them (flash-attention style), so saved activations are O(T) per head. */
#ifndef ZR_OPS_ATTENTION_H
#define ZR_OPS_ATTENTION_H

#include "core/tensor.h"

/* out = softmax(q k^T * scale + causal mask) v, per head. q (B, Hq, T, Dh), k and v
 * (B, Hkv, T, Dh) with Hq a multiple of Hkv: query head h uses kv head h / (Hq / Hkv).
 * scale <= 0 means 1/sqrt(Dh). Output (B, Hq, T, Dh) in q's dtype.
 * seg: NULL (each row one causal sequence) or the rows' packed sequences (a padding-free batch):
 * an i32 (2, B, T) contiguous tensor on q's device, lo (B, T) then hi (B, T): query t attends to
 * keys lo[t] .. t, key j is seen by queries j .. hi[j] - 1 (for packed sequences the bounds of each
 * token's sequence, row-relative; a sliding window narrows them: zr_sdpa_window_segments). The node
 * keeps it for backward. On the CPU its values are checked; on CUDA the flash kernels take it
 * (bf16/f16, head_dim 64 or 128, or a multiple of 8 between: on Hopper a multiple of 16 read in
 * place by the 128-wide kernels, else zero-padded to 128; zr_sdpa_segments_ok), and the f32
 * composition that runs every other case masks by it ((B, Hq, T, T) scores: memory quadratic in T). */
zr_tensor *zr_sdpa_causal(zr_tensor *q, zr_tensor *k, zr_tensor *v, zr_tensor *seg, double scale);

/* Segments (2, B, T) i32 on the CPU for a sliding window of `window` keys over seg's packed
 * sequences (seg NULL: each row one sequence; else a CPU (2, B, T) as zr_sdpa_causal takes): query t
 * sees keys t - window + 1 .. t of its sequence, as transformers' sliding_window masks (a key window
 * or more positions back is masked): lo[t] = max(lo, t - window + 1), hi[t] = min(hi, t + window).
 * The attention ops take it as their seg, wherever they take packed sequences. */
zr_tensor *zr_sdpa_window_segments(const zr_tensor *seg, int64_t B, int64_t T, int64_t window);

/* 1 where seg (packed sequences) runs for attention over dtype dt, head_dim Dh on dev: the CPU (any
 * float dtype), and CUDA in bf16/f16 at Dh 64 (the Hopper kernels, q, k, v read in place through
 * 16-byte aligned strides, as the models' projections give them) or 128 (the mma.sync kernels, over
 * contiguous copies). */
int zr_sdpa_segments_ok(zr_device dev, zr_dtype dt, int64_t Dh);

/* The same attention over one packed projection, as transformers' GPT-2 splits c_attn's output:
 * qkv (B, T, (Hq + 2 Hkv)·Dh) holds q (its first Hq·Dh columns), k (the next Hkv·Dh), v (the
 * last Hkv·Dh), each (B, T, heads, Dh) seen as (B, heads, T, Dh). Returns (B, T, Hq·Dh) =
 * o.transpose(1, 2).reshape(B, T, Hq·Dh), contiguous, in qkv's dtype; scale <= 0: 1/sqrt(Dh).
 * Where the Hopper kernels take it (CUDA, bf16/f16, Dh 64) q, k, v are read in place, the node
 * saves qkv itself and backward writes dq, dk, dv into ONE (B, T, W) gradient; elsewhere it is
 * split + view + transpose + zr_sdpa_causal (split's backward also fills one buffer). seg: as
 * zr_sdpa_causal's, (2, B, T) for qkv's B and T. */
zr_tensor *zr_sdpa_packed(zr_tensor *qkv, int64_t Hq, int64_t Hkv, zr_tensor *seg, double scale);

/* Llama's attention over its packed q/k/v product: zr_sdpa_packed of zr_qkv_rope(qkv, Hq, Hkv, cos,
 * sin), q and k rotated (cos, sin (T, Dh) as zr_rope_tables gives them), returned as (B, T, Hq·Dh)
 * in qkv's dtype; scale <= 0: 1/sqrt(Dh). Where the Hopper kernels take it (CUDA, bf16/f16, Dh 64)
 * one node over qkv whose forward is exactly zr_qkv_rope + zr_sdpa_causal's (the same kernels, the
 * same buffers, the same tensors kept); its backward writes qkv's whole gradient, the rope's
 * transpose applied in the pass that turns the f32 dq accumulator (and dk, dv) into it: no rotated
 * dq, dk, dv are stored, and the qkv_rope backward's launch is gone. Elsewhere it is that
 * composition, op by op. seg: as zr_sdpa_packed's (packed sequences: cos and sin then hold each
 * token's own row, e.g. (B·T, Dh) for a (1, B·T, W) qkv, gathered at the tokens' positions). */
zr_tensor *zr_qkv_rope_sdpa(zr_tensor *qkv, int64_t Hq, int64_t Hkv, zr_tensor *cos, zr_tensor *sin, zr_tensor *seg,
                            double scale);

/* Qwen3's attention over its packed q/k/v product: zr_qkv_norm_rope (each head of q and k through
 * an RMSNorm over head_dim, weights wq, wk, then the rope; fused kernels on CUDA) + zr_sdpa_causal,
 * returned as (B, T, Hq·Dh) in qkv's dtype; the rest as zr_qkv_rope_sdpa's. */
zr_tensor *zr_qkv_norm_rope_sdpa(zr_tensor *qkv, int64_t Hq, int64_t Hkv, zr_tensor *wq, zr_tensor *wk, double eps,
                                 zr_tensor *cos, zr_tensor *sin, zr_tensor *seg, double scale);

#endif
