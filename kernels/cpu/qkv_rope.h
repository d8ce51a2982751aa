/* qkv_rope kernels: declarations over real/K(), see kernels.h. Twins of kernels/cuda/qkv_rope.h.
 * Rotation as kernels/cpu/rope.h (Hugging Face rotate_half, pairs (i, i + Dh/2)); layout of the
 * packed product and of q, k, v in kernels/base/qkv_layout.h; cos, sin: (T, Dh) contiguous. */

/* q, k = rope(their heads of qkv), v = its heads copied. */
void K(qkv_rope_forward_cpu)(real *q, real *k, real *v, const real *qkv, const real *cos,
                             const real *sin, const zr_qkv_layout *L, int64_t B, int64_t T,
                             int64_t H, int64_t KV, int64_t Dh);
/* dqkv (packed) = inverse rotation of dq and dk, dv copied; a NULL part counts as zeros. With
 * accumulate the result is added to dqkv, else it overwrites it. */
void K(qkv_rope_backward_cpu)(real *dqkv, const real *dq, const real *dk, const real *dv,
                              const real *cos, const real *sin, const zr_qkv_layout *L, int64_t B,
                              int64_t T, int64_t H, int64_t KV, int64_t Dh, int accumulate);
