/* attention kernels: declarations over real/K(), see kernels.h. Causal scaled dot-product
 * attention with grouped-query heads: query head h reads kv head h / (Hq / Hkv).
 * q, o, dq, dout: (B, Hq, T, Dh); k, v, dk, dv: (B, Hkv, T, Dh); lse: (B, Hq, T); all contiguous.
 * seg: NULL (each row one causal sequence) or 2·B·T int32, lo (B, T) then hi (B, T): the row of
 * packed sequences (a padding-free batch) where query i of row b attends to keys lo[b·T + i] .. i
 * only (lo <= i, row-relative; hi is not read here, the CUDA kernels' tiles use it). */

/* o = softmax(scale q k^T + causal mask) v, and lse = logsumexp of each score row.
 * work: B*Hq*T reals of scratch (each query row's running softmax sum). */
void K(sdpa_causal_forward_cpu)(real *o, real *lse, const real *q, const real *k, const real *v,
                                const int32_t *seg, real *work, int64_t B, int64_t Hq, int64_t Hkv,
                                int64_t T, int64_t Dh, double scale);
/* Recomputes the probabilities from q, k and lse (nothing T x T is stored) and writes dq, dk, dv.
 * When Hq != Hkv, dk_work and dv_work are (B, Hq, T, Dh) scratch for the per-query-head parts
 * that are then summed per kv head; when Hq == Hkv they are unused (may be NULL). */
void K(sdpa_causal_backward_cpu)(real *dq, real *dk, real *dv, real *dk_work, real *dv_work,
                                 const real *dout, const real *q, const real *k, const real *v,
                                 const real *o, const real *lse, const int32_t *seg, int64_t B,
                                 int64_t Hq, int64_t Hkv, int64_t T, int64_t Dh, double scale);
