/* Rotary position embeddings with autograd (Hugging Face `apply_rotary_pos_emb` with rotate_half:
 * pairs are (i, i + Dh/2)), and the cos/sin tables of LlamaRotaryEmbedding including the
 * rope_scaling types "llama3", "longrope" and "yarn". */
#ifndef ZR_OPS_ROPE_H
#define ZR_OPS_ROPE_H

#include "core/tensor.h"

/* y = x * cos + rotate_half(x) * sin. x (B, H, T, Dh); cos, sin (T, R) with R even, R <= Dh: the
 * first R channels of each head are rotated (pairs i, i + R/2), the rest passed through
 * (transformers' partial_rotary_factor: R = Dh · factor, the tables built for R). The output
 * has x's dtype (computed in f32 for bf16/f16, rounded once). Gradients flow to x only: the
 * tables are constants (backward is the transposed, i.e. inverse, rotation). */
zr_tensor *zr_rope(zr_tensor *x, zr_tensor *cos, zr_tensor *sin);

typedef struct {
    double theta;   /* rope_theta (base), e.g. 10000 or 500000 */
    int llama3;     /* rope_scaling.rope_type == "llama3" */
    double factor, low_freq_factor, high_freq_factor, original_max_position_embeddings;
    double attention_scale; /* multiplies cos and sin; 1 for "default" and "llama3" */
    int64_t offset;         /* first position (positions are offset .. offset+T-1) */
    const double *ext_factors; /* longrope: head_dim/2 factors dividing the frequencies, or NULL */
    int yarn;                  /* rope_type "yarn": factor, and the correction range below */
    double yarn_low, yarn_high; /* the ramp's bounds in frequency index (find_correction_range's) */
} zr_rope_config;

/* Defaults: theta 10000, no scaling, attention_scale 1, offset 0. */
zr_rope_config zr_rope_config_default(void);
/* cos and sin (T, head_dim) in dtype dt (computed in f32 like transformers, or in f64 for f64),
 * on the CPU. Returns ZR_OK and two new references. */
zr_status zr_rope_tables(int64_t T, int64_t head_dim, const zr_rope_config *cfg, zr_dtype dt,
                         zr_tensor **cos, zr_tensor **sin);
/* The (head_dim/2) inverse frequencies the tables use (f32 or f64). */
zr_tensor *zr_rope_inv_freq(int64_t head_dim, const zr_rope_config *cfg, zr_dtype dt);

#endif
