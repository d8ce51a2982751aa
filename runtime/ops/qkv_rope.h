/* The fused q/k/v rope of a Llama attention block: one op that reads the packed q/k/v product
 * (zr_linear_multi's output) in place, rotates q and k, and hands back q, k, v in the layout the
 * attention kernels read; its backward writes the packed gradient in one pass, into the buffer
 * the product's backward reads (no split gather, no transposing copies). */
#ifndef ZR_OPS_QKV_ROPE_H
#define ZR_OPS_QKV_ROPE_H

#include "core/tensor.h"

/* Where q, k, v live: ZR_QKV_AUTO picks BTHD when the attention kernels of qkv's device read
 * strided operands (CUDA, the Hopper kernels), else BHTD. */
enum {
    ZR_QKV_AUTO = -1,
    ZR_QKV_BHTD = 0, /* one buffer holding q (B,H,T,Dh), k, v (B,KV,T,Dh), each contiguous */
    ZR_QKV_BTHD = 1  /* one (B, T, H + 2 KV, Dh) buffer; q, k, v its head slices, transposed */
};

/* out[0] = q = rope(qkv[..., :H·Dh]) as (B, H, T, Dh), out[1] = k = rope(the next KV·Dh) as
 * (B, KV, T, Dh), out[2] = v = the last KV·Dh as (B, KV, T, Dh), Dh = qkv.shape[3] / (H + 2 KV)
 * (even). qkv: (B, T, (H + 2 KV)·Dh); cos, sin: (T, Dh) (zr_rope_tables), any float dtype. The
 * same values as split + view + transpose + zr_rope, computed in f32 for bf16/f16 (rounded once).
 * out[0..2] are views of one new buffer (layout: ZR_QKV_*). Gradients flow to qkv only. */
zr_status zr_qkv_rope(zr_tensor *qkv, int64_t H, int64_t KV, zr_tensor *cos, zr_tensor *sin, int layout,
                      zr_tensor **out);

/* zr_qkv_rope's argument checks alone (the error names qkv_rope). */
zr_status zr_qkv_rope_check(zr_tensor *qkv, int64_t H, int64_t KV, zr_tensor *cos, zr_tensor *sin);

/* zr_qkv_rope(..., ZR_QKV_AUTO, out) without autograd, for an op that runs it inside its own node
 * (zr_qkv_rope_sdpa): the same kernel into the same buffer and views; tab[0], tab[1] = cos, sin
 * as that kernel read them (contiguous: the CPU compute dtype, or f32 on CUDA), the caller's. */
zr_status zr_qkv_rope_forward(zr_tensor *qkv, int64_t H, int64_t KV, zr_tensor *cos, zr_tensor *sin,
                              zr_tensor **out, zr_tensor **tab);

/* Qwen3's q/k/v: zr_qkv_rope with each head of q and k first through an RMSNorm over head_dim
 * (weights wq, wk of Dh, eps: Qwen3Attention's q_norm / k_norm, as zr_rmsnorm computes them). On
 * CUDA (zr_qkv_norm_rope_fused) one kernel writes q, k, v into one buffer as zr_qkv_rope does
 * (layout the same), and each output's backward writes its columns of qkv's gradient in one kernel,
 * back through the rope and the norm (with the norm weight's gradient); elsewhere the composition
 * split + view + zr_rmsnorm + transpose + zr_rope (q, k; v viewed and transposed), op by op, whose
 * outputs are (B, heads, T, Dh) views (layout then unused). */
zr_status zr_qkv_norm_rope(zr_tensor *qkv, int64_t H, int64_t KV, zr_tensor *wq, zr_tensor *wk, double eps,
                           zr_tensor *cos, zr_tensor *sin, int layout, zr_tensor **out);

/* 1 where zr_qkv_norm_rope runs its fused kernels for a qkv of dtype dt on dev with head_dim Dh
 * (CUDA, f32/bf16/f16, head_dim 64 or 128), 0 where it runs the composition. */
int zr_qkv_norm_rope_fused(zr_device dev, zr_dtype dt, int64_t Dh);

#endif
