/* Fused projections: several Linear layers that read one input as ONE product (q/k/v, gate/up),
 * with zr_split_sizes (ops/view.h: views whose backward gathers every part's gradient into ONE
 * buffer), so
 *
 *   zr_tensor *w[3] = {wq, wk, wv};
 *   zr_tensor *qkv = zr_linear_multi(x, 3, w, NULL);          // (..., nq + nk + nv)
 *   zr_tensor *p[3];
 *   zr_split_sizes(qkv, 3, (int64_t[]){nq, nk, nv}, -1, p);  // q, k, v: views of qkv
 *
 * costs one GEMM per direction when the weights sit back to back in memory (ZeRO's flat parameter
 * buffer in direct mode) and no full-size zero-padded gradient per part. */
#ifndef ZR_OPS_LINEAR_MULTI_H
#define ZR_OPS_LINEAR_MULTI_H

#include "core/tensor.h"

/* Most weights one zr_linear_multi takes. */
#define ZR_LINEAR_MULTI_MAX 7

/* y = x · [w1; ...; wn]ᵀ (+ [b1, ..., bn]) for x (..., in), w_i (out_i, in), b NULL or n biases
 * b_i (out_i); y (..., Σ out_i) in the promoted dtype, columns in weight order.
 * Forward: one GEMM per run of adjacent weights (same storage and dtype, contiguous, w_{i+1}
 * starting where w_i ends; a spanning view is used, nothing is copied), so one GEMM when all are
 * adjacent; otherwise each run's GEMM writes its column block of y in place (no concatenation).
 * Backward: dx = Σ runs gy[:, run] · W_run (one GEMM when adjacent); dW: when every weight's
 * existing leaf gradient (zr_node_leaf_grad) is adjacent to the next, of a dtype the GEMM can
 * write (CPU: the compute dtype f32/f64; CUDA: f32 or the compute dtype) and all share one
 * grad_stale flag, ONE GEMM writes (stale: beta 0, the flags are cleared) or adds into the
 * spanning region; otherwise per weight, into its leaf gradient likewise when it has a usable
 * one, else returned; gradients read column blocks of gy in place. db: one column sum of gy,
 * sliced per bias. */
zr_tensor *zr_linear_multi(zr_tensor *x, int n, zr_tensor *const *w, zr_tensor *const *b);
/* How many GEMMs zr_linear_multi's forward runs for these weights (runs of adjacent ones): 1 when
 * they sit back to back. For tests and diagnostics. */
int zr_linear_multi_runs(int n, zr_tensor *const *w);


/* --- For ops/lora.c (internal; row-major matrices as in kernels/cpu/matmul.h) --- */
/* C (m, n; row stride ldc; dtype cdt) = alpha op(A) · op(B) + beta C (+ bias (n), CUDA only), A and B
 * of dtype dt on dev: OpenBLAS (cdt must be dt, f32 or f64) or cuBLASLt. */
zr_status zr_gemm_rows(zr_device dev, zr_dtype dt, zr_dtype cdt, int ta, int tb, int64_t m, int64_t n, int64_t k,
                       double alpha, const void *a, int64_t lda, const void *b, int64_t ldb, double beta, void *c,
                       int64_t ldc, const void *bias);
/* y[:, off[i] .. off[i+1]) = alpha x · w_iᵀ + beta y (+ bias[off[i] ..], CUDA only) for the n weights,
 * one GEMM per run of adjacent ones: x (rows, in) contiguous and y (row stride ldy) in ct. */
zr_status zr_linear_multi_into(zr_device dev, zr_dtype ct, void *y, int64_t ldy, const void *x, int n,
                               zr_tensor *const *w, int64_t rows, int64_t in, const int64_t *off, double alpha,
                               double beta, const void *bias);
/* dx (rows, in, contiguous) = Σ g[:, off[i] .. off[i+1]) · w_i + beta dx (g's row stride ldg), per run. */
zr_status zr_linear_multi_dx_into(zr_device dev, zr_dtype ct, void *dx, const void *g, int64_t ldg, int n,
                                  zr_tensor *const *w, int64_t rows, int64_t in, const int64_t *off,
                                  double beta);
/* o (rows, N) = xi · [w]ᵀ + biases (bc: zr_linear_multi_biases, or NULL), o and xi contiguous in o's
 * dtype (the compute dtype). */
zr_status zr_linear_multi_rows(zr_tensor *o, zr_tensor *xi, int n, zr_tensor *const *w, zr_tensor *bc,
                               int64_t rows, int64_t in, int64_t N, const int64_t *off);
/* The n biases end to end, (off[n]) in ct on dev (workspace). */
zr_tensor *zr_linear_multi_biases(zr_tensor *const *b, int n, const int64_t *off, zr_dtype ct, zr_device dev);
/* c (m, n; ldc) = alpha a (m, k; lda) · t + beta c (+ bias (n), CUDA only), for t (k, n), or tᵀ when transpose
 * (t (n, k)): t read in place where its layout allows (zr_gemm_operand_prepare). */
zr_status zr_gemm_right(zr_device dev, zr_dtype ct, zr_tensor *t, int transpose, int64_t m, int64_t n, int64_t k,
                        double alpha, const void *a, int64_t lda, double beta, void *c, int64_t ldc, const void *bias);
/* Input e's gradient (m, n) = alpha aᵀ · b for a (k, m; lda) and b (k, n; ldb) in ct: straight into its leaf
 * gradient where a GEMM can write it (CPU: of dtype ct; CUDA: f32 or ct; a stale one overwritten), else a new
 * tensor handed back in gin[e] (in the input's dtype). Nothing when input e needs no gradient. */
zr_status zr_grad_product(zr_node *nd, int e, zr_device dev, zr_dtype ct, int64_t m, int64_t n, int64_t k,
                          double alpha, const void *a, int64_t lda, const void *b, int64_t ldb, zr_tensor **gin);
#endif
