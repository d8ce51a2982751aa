/* Private interface between attention.cu and the Hopper (sm_90a, wgmma) attention kernels in
 * attention_fwd_sm90.cu and attention_bwd_sm90.cu (head_dim 64), attention_fwd_sm90_d128.cu and
 * attention_bwd_sm90_d128.cu (128, and the narrow head_dims read in place by the 128-wide tiles),
 * bf16/f16, compute capability 9.0 only. attention.cu keeps
 * the public contract (attention.h), the argument checks and the mma.sync fallback for the rest. */
#ifndef ZR_CUDA_ATTENTION_SM90_H
#define ZR_CUDA_ATTENTION_SM90_H

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <stdint.h>

#include "attention.h"

#ifdef __cplusplus
extern "C" {
#endif

#include "../base/dtype.h"

/* A head_dim the 128-wide kernels read in place though narrower than their tiles (Phi-3's 96): a
 * multiple of 16 between 64 and 128. TMA zero-fills a tile's columns past it (so q·k and the products
 * gain nothing from them), and the epilogues store none of them; the f32 accumulators (dq, the dk/dv
 * partials) stay 128 wide. */
static inline int attn_sm90_narrow(int64_t Dh) { return Dh > 64 && Dh < 128 && Dh % 16 == 0; }
/* The kernels' tile width for head_dim Dh: 64, else 128 (128 and the narrow ones). */
static inline int64_t attn_sm90_width(int64_t Dh) { return Dh <= 64 ? 64 : 128; }

/* 1 when the Hopper kernels take a call of this head_dim/dtype on the current device (head_dim 64,
 * 128 and the narrow ones, forward and backward). */
int attn_sm90_fwd_ok(int64_t Dh, zr_dtype dt);
int attn_sm90_bwd_ok(int64_t Dh, zr_dtype dt);

/* Test and benchmark knob: -1 automatic (the default), 0 never, 1 whenever supported. */
void attn_sm90_force(int fwd, int bwd);

/* Test and benchmark knob of the persistent kernels (each block loops over work tiles): how many
 * blocks a launch may have. 0: one per SM (the default); -1: one block per tile (no block runs two);
 * n > 0: at most n (tests: every block runs many tiles, so the rings and barriers carry across). */
void attn_sm90_grid(int fwd, int bwd);
/* Test and benchmark knob of the head_dim-64 backward: the longest T whose launch takes the kernel
 * instance with the dK/dV epilogue through shared memory (2048 by default; 0: never); returns the
 * previous setting. Both instances give the same dk, dv bits. (The head_dim-128 kernel has one
 * epilogue: session 55 measured a staged one no faster.) */
int64_t attn_sm90_dkv_rows_max_t(int64_t t);
/* Blocks for a launch of `tiles` work tiles under that knob (bwd: 1 for the backward's): a block
 * per tile, or fewer; the backward's then no more than the pairs of items (ceil(tiles / 2)) they
 * run. */
int attn_sm90_blocks(int bwd, int64_t tiles);
/* Test and benchmark knob of the head_dim-64 forward: queries a tile, 128 (two consumer warpgroups)
 * or 192 (three); 0 automatic (the default: by T). Returns the previous setting. Both give the same
 * o, lse bits (each row meets the same key tiles in the same order). */
int attn_sm90_fwd_rows(int rows);
/* Test and benchmark knob of the same forward: 1 (the default) starts its tiles before row 0 so that
 * the rows a head's tiles hang past T fall before row 0 instead (in its cheapest tile, not its
 * heaviest: see fwd_qoff), 0 at row 0. Returns the previous setting. The same bits. */
int attn_sm90_fwd_tail(int on);

/* 1 when the driver offers the tensor-map encoder the TMA loads (forward and backward) need. */
int attn_sm90_tma_ready(void);
/* 1 when the current device is compute capability 9.0 exactly (the sm_90a code runs nowhere else);
 * cached per device. */
int attn_sm90_device_ok(void);

/* Encodes a 4-D tensor map (dims innermost first, byte strides of dims 1..3, box in elements) with
 * the 128-byte swizzle and zero fill out of bounds; -1 when the driver cannot. */
int attn_sm90_tmap(CUtensorMap *m, CUtensorMapDataType ty, const void *base, const uint64_t dims[4],
                   const uint64_t strides[3], const uint32_t box[4]);
/* The map of a (B, H, T, Dh) 16-bit operand with element strides sd, in boxes of rows × 64 (one
 * swizzle atom: Dh / 64 boxes a tile row). */
int attn_sm90_head_map(CUtensorMap *m, const void *base, const zr_attn_strides *sd, int64_t B,
                       int64_t H, int64_t T, int64_t Dh, int rows, zr_dtype dt);

/* Forward: o, lse as in attention_forward_cuda (scale already resolved). Returns -1 (nothing
 * launched) when a tensor map cannot be encoded. */
int attn_sm90_forward(void *o, float *lse, const void *q, const void *k, const void *v,
                      const zr_attn_layout *L, int64_t B, int64_t Hq, int64_t Hkv, int64_t T,
                      float scale, zr_dtype dt, cudaStream_t st);

/* The same at head_dim Dh 128 or narrow (attention_fwd_sm90_d128.cu). */
int attn_sm90_forward128(void *o, float *lse, const void *q, const void *k, const void *v,
                         const zr_attn_layout *L, int64_t B, int64_t Hq, int64_t Hkv, int64_t T,
                         int64_t Dh, float scale, zr_dtype dt, cudaStream_t st);

/* Splits of each kv head's query group in the backward kernel (more blocks for small grids). */
int attn_sm90_bwd_nsplit(int64_t B, int64_t Hkv, int64_t G, int64_t T);

/* The backward's tensor maps (Q, dO, K, V by head, Dh wide; the f32 dQ accumulator, (B, Hq, T,
 * attn_sm90_width(Dh))), encoded before anything is launched so that a layout TMA cannot address
 * falls back to the mma.sync kernel whole. */
typedef struct {
    CUtensorMap q, dout, k, v, dq;
} attn_sm90_bwd_maps;
/* -1 when a map cannot be encoded (nothing launched). */
int attn_sm90_backward_maps(attn_sm90_bwd_maps *m, float *dqacc, const void *dout, const void *q,
                            const void *k, const void *v, const zr_attn_layout *L, int64_t B,
                            int64_t Hq, int64_t Hkv, int64_t T, int64_t Dh, zr_dtype dt);
/* Backward main kernel: dq accumulated (unscaled, f32 reduce-adds) into dqacc (the map's), which
 * must be zeroed; nl2 = −lse·log2 e and Dd = rowsum(dO∘O) per query row (attention.cu's prep
 * kernel); with ns > 1 f32 partials of dk (unscaled) and dv go to wkv (ns·nkv each, rows
 * attn_sm90_width(Dh) wide) for attention.cu's reduction, else dk (scaled) and dv are written
 * directly (Dh columns a row). */
void attn_sm90_backward(const attn_sm90_bwd_maps *m, void *dk, void *dv, float *wkv,
                        const float *nl2, const float *Dd, const zr_attn_layout *L, int64_t B,
                        int64_t Hq, int64_t Hkv, int64_t T, int64_t Dh, int ns, int64_t nkv,
                        float scale, zr_dtype dt, cudaStream_t st);
/* The same at head_dim Dh 128 or narrow (attention_bwd_sm90_d128.cu). */
void attn_sm90_backward128(const attn_sm90_bwd_maps *m, void *dk, void *dv, float *wkv,
                           const float *nl2, const float *Dd, const zr_attn_layout *L, int64_t B,
                           int64_t Hq, int64_t Hkv, int64_t T, int64_t Dh, int ns, int64_t nkv,
                           float scale, zr_dtype dt, cudaStream_t st);

#ifdef __cplusplus
}
#endif

#endif
