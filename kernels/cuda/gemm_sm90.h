/* Our own Hopper (sm_90a) matrix product, for the products whose epilogue cuBLASLt does not overlap
 * with the next tile's main loop: a persistent wgmma GEMM whose two consumer warpgroups take turns
 * (ping-pong), bf16 inputs, f32 accumulation, fused bias / bias+GELU(aux) / f32 beta-1 epilogues. */
#ifndef ZR_CUDA_GEMM_SM90_H
#define ZR_CUDA_GEMM_SM90_H

#include <cuda_runtime_api.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "../base/dtype.h" /* C linkage before matmul.h includes it */
#ifdef __cplusplus
}
#endif
#include "matmul.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The products it takes, in zr_gemm_desc's terms (row-major C (m, n) = op(A) op(B), ta/tb as in
 * kernels/cpu/matmul.h; every flag combination: forward Y = X Wᵀ is ta 0 tb 1, dX = dY W is ta 0
 * tb 0, dW = dYᵀ X is ta 1 tb 0):
 *   batch 1, alpha 1, ab_dtype bf16, on a compute capability 9.0 device;
 *   m, n, k multiples of 8 (any size otherwise: partial 128 x 128 tiles are masked), every leading
 *   dimension a multiple of 8 and at least the row it holds, a, b, c, bias, aux 16-byte aligned;
 *   c_dtype bf16: beta 0, bias optional; epilogue ZR_GEMM_EPI_GELU_AUX writes c = gelu_tanh(z)
 *     and aux (ld_aux) = z, z = product (+ bias) (cuBLASLt's GELU_AUX(_BIAS));
 *   c_dtype f32: beta 0 or 1 (C = product + C: a gradient accumulator), no bias, no epilogue.
 * Returns 0 when it takes g, else -1 with zr_error saying why (the caller uses cuBLASLt then). */
int gemm_sm90_check(const zr_gemm_desc *g);

/* Runs g (checked as above; -1 and nothing launched when refused). grid: 0 for one block per SM,
 * n > 0 for at most n blocks (tests: persistence across many tiles a block); never more blocks
 * than 128 x 128 output tiles (clusters of 2: gemm_sm90_cluster; ring stages: gemm_sm90_stages). */
int gemm_sm90(const zr_gemm_desc *g, int grid, cudaStream_t stream);

/* The cooperative twin (kernels/cuda/gemm_sm90_wide.cu): 128 x 256 output tiles, both consumer
 * warpgroups on the same tile (64 rows each, one m64n256k16 wgmma a k16 step): fewer bytes from L2
 * a MAC, an epilogue nothing overlaps. Takes and refuses exactly what gemm_sm90 does
 * (gemm_sm90_check); grid as gemm_sm90's, never more blocks than 128 x 256 tiles. Clusters: its own
 * setting, gemm_sm90_wide_cluster (gemm_sm90_cluster does not apply to it). */
int gemm_sm90_wide(const zr_gemm_desc *g, int grid, cudaStream_t stream);

/* Clusters of n blocks (1, the default, or 2) for every later gemm_sm90 call: with 2, the blocks of
 * a cluster take the output tiles (2i, j) and (2i + 1, j), each loads half of their shared B tile
 * and multicasts it to both (TMA .multicast::cluster: a quarter less L2 -> SM traffic); as many
 * clusters as fit at once (or grid / 2, at least 1, for gemm_sm90's grid n > 0). Same results bit
 * for bit. Returns 0, or -1 (message set) for any other n. Not thread-safe (a global). Measured on
 * the H200 (session 16): clusters of 2 ran the main loop at HALF the rate of blocks alone (29.8 vs
 * 14.0 us a tile, the epilogue alone unchanged), with every ring release at cluster scope (a
 * MEMBAR.ALL.GPU each in the SASS); now at CTA scope as CUTLASS (GEMM_SM90_DBG_CLUSTER_SCOPE: the
 * old way); not yet measured: bench only. */
int gemm_sm90_cluster(int n);

/* Ring stages of gemm_sm90 (the ping-pong kernel) for every later call: 4 (the default: 128 KB of
 * shared memory) or 6 (192 KB: more loads in flight, for clusters of 2, whose refills wait for
 * both blocks' releases). Same results bit for bit. Returns 0, or -1 (message set) for any other
 * n. Not thread-safe (a global). Bench only until measured. */
int gemm_sm90_stages(int n);

/* Clusters of n blocks (1, the default, or 2) for every later gemm_sm90_wide call: with 2, the
 * blocks of a cluster take the 128 x 256 tiles (2i, j) and (2i + 1, j), each loads its own A and
 * half of their shared B (128 of the 256 columns) and multicasts it to both (cuBLASLt's 2 x 1
 * layout); as many clusters as fit at once (or grid / 2, at least 1). Same results bit for bit.
 * Returns 0, or -1 (message set) for any other n. Not thread-safe (a global). Bench only until
 * measured. */
int gemm_sm90_wide_cluster(int n);

/* Blocks the last gemm_sm90 or gemm_sm90_wide launch ran (with clusters of 2: twice the clusters that
 * cudaOccupancyMaxActiveClusters let run at once, or fewer for few tiles): the bench prints it. */
int gemm_sm90_last_blocks(void);

/* Timing diagnostics (tests/bench/bench_gemm_sm90.cu): every later gemm_sm90 (and gemm_sm90_wide)
 * call leaves the flagged stages out, so that timing the variants shows where a tile's time goes.
 * Results are wrong with any flag set but CLUSTER_SCOPE; 0 (the default) restores the real kernel. Not thread-safe
 * (a global). gemm_sm90_wide takes every flag but SERIAL (refused: -1, nothing launched). */
enum {
    GEMM_SM90_DBG_NO_STORE = 1, /* the epilogue computes but stores nothing */
    GEMM_SM90_DBG_NO_CLOAD = 2, /* no C (f32 beta 1) or bias loads: the accumulators start at 0 */
    GEMM_SM90_DBG_NO_GELU = 4,  /* the GELU epilogue stores z itself as c (no GELU math) */
    GEMM_SM90_DBG_SERIAL = 8,   /* a warpgroup hands the tensor cores on after its epilogue, not
                                 * before it: no ping-pong overlap */
    GEMM_SM90_DBG_NO_MMA = 16,  /* the consumers wait for and release every stage but issue no
                                 * wgmma: TMA loads and epilogues alone */
    GEMM_SM90_DBG_CLUSTER_SCOPE = 32 /* clusters of 2 (either kernel): the ring's releases and the
                                      * producer's waits at cluster scope, as session 16's code
                                      * (results right; only the speed changes) */
};
/* Returns 0, or -1 (message set) for bits outside the flags above. */
int gemm_sm90_debug(int flags);

#ifdef __cplusplus
}
#endif

#endif
