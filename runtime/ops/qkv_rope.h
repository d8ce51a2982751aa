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

#endif
