/* rope kernels: declarations over real/K(), see kernels.h. Hugging Face rotate_half layout: the
 * rotation pairs are (i, i + Dh/2) within each head vector. */

/* y = x * cos + rotate_half(x) * sin on the first R channels of each head vector (rotary_dim R,
 * even, <= Dh: transformers' partial_rotary_factor), rotate_half(x) = (-x[h:R], x[:h]), h = R/2;
 * channels R..Dh-1 are copied. x, y: (BH, T, Dh) contiguous; cos, sin: (T, R). */
void K(rope_forward_cpu)(real *y, const real *x, const real *cos, const real *sin, int64_t BH,
                         int64_t T, int64_t Dh, int64_t R);
/* The transpose of the forward map (the inverse rotation when cos/sin come from rope_tables):
 * dx = dy * cos + rotate_half^T(dy * sin), rotate_half^T(u) = (u[h:], -u[:h]). */
void K(rope_backward_cpu)(real *dx, const real *dy, const real *cos, const real *sin, int64_t BH,
                          int64_t T, int64_t Dh, int64_t R);
/* inv_freq (Dh/2) as Hugging Face computes it: 1 / theta^(2i/Dh); with llama3 != 0 the
 * rope_scaling "llama3" rule (_compute_llama3_parameters) is applied on top; ext (Dh/2, or NULL):
 * longrope's factors (_compute_longrope_parameters: 1 / (ext[i] * theta^(2i/Dh))); with yarn != 0
 * YaRN's blend (_compute_yarn_parameters) of 1 / p and 1 / (factor · p) by a linear ramp over the
 * frequency index from yarn_low to yarn_high (its correction range). */
void K(rope_inv_freq_cpu)(real *inv_freq, int64_t Dh, double theta, int llama3, double factor,
                          double low_freq_factor, double high_freq_factor, double original_max_pos,
                          const double *ext, int yarn, double yarn_low, double yarn_high);
/* cos/sin (T, Dh): angle[t, i] = (offset + t) * inv_freq[i mod Dh/2], times attention_scale. */
void K(rope_tables_cpu)(real *cos_t, real *sin_t, const real *inv_freq, int64_t T, int64_t Dh,
                        int64_t offset, double attention_scale);
