/* Row normalisations on CUDA: RMSNorm and LayerNorm, forward and backward, over rows of D
 * contiguous elements (N rows). Statistics are computed in f32; x, y, w, b, dx, dw, db share one
 * dtype (ZR_F32, ZR_BF16 or ZR_F16); rstd/mean are f32 (N).
 * Weight gradients are reduced deterministically (per-block partials in a workspace, then a fixed
 * order sum). Every call returns 0 or sets zr_error naming the kernel. */
#ifndef ZR_CUDA_NORM_H
#define ZR_CUDA_NORM_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "../base/dtype.h" /* C header: inside the extern "C" block */

/* w_offset 0: y = w * (x * rsqrt(mean(x^2) + eps)), the normalised row rounded to the dtype before
 * the weight (Hugging Face LlamaRMSNorm); 1 (with a weight): y = (x * rsqrt(..)) * (1 + w) in f32,
 * rounded once (Gemma's RMSNorm, whose weights start at zero). rstd (N) may be NULL (inference). */
int rmsnorm_forward_cuda(void *y, float *rstd, const void *x, const void *w, int64_t N, int64_t D,
                         float eps, float w_offset, zr_dtype dtype, cudaStream_t stream);
/* The residual add fused in: h = x + res (rounded to the dtype, written to h), then y = rmsnorm(h)
 * as rmsnorm_forward_cuda; one read of x and res. h may alias x or res; rstd (N) may be NULL.
 * Its backward is rmsnorm_backward_cuda on h (with dres: the gradient of x and res alike). */
int add_rmsnorm_forward_cuda(void *y, void *h, float *rstd, const void *x, const void *res,
                             const void *w, int64_t N, int64_t D, float eps, float w_offset,
                             zr_dtype dtype, cudaStream_t stream);
/* Bytes of workspace rmsnorm_backward_cuda and layernorm_backward_cuda need. */
size_t rmsnorm_backward_workspace_size(int64_t N, int64_t D);
size_t layernorm_backward_workspace_size(int64_t N, int64_t D);
/* dx = d rmsnorm / dx · dy (+ dres when non-NULL: the residual stream's gradient, which makes dx
 * the gradient of both x and res of the fused forward). dw (D) is overwritten; NULL skips it.
 * x is the normalised input (h for the fused forward); rstd and w_offset as the forward's (dw is
 * the gradient of w either way). */
int rmsnorm_backward_cuda(void *dx, void *dw, const void *dy, const void *x, const void *w,
                          const float *rstd, const void *dres, void *workspace, int64_t N,
                          int64_t D, float w_offset, zr_dtype dtype, cudaStream_t stream);

/* As rmsnorm_backward_cuda, with dw of dtype dw_dtype (dtype, or ZR_F32: a ZeRO fp32 gradient) and
 * acc 1: dw += the weight gradient, 0: dw = it; no 16-bit dw and no cast or add kernel after.
 * N = 0 leaves dw untouched. */
int rmsnorm_backward_acc_cuda(void *dx, void *dw, zr_dtype dw_dtype, int acc, const void *dy,
                              const void *x, const void *w, const float *rstd, const void *dres,
                              void *workspace, int64_t N, int64_t D, float w_offset, zr_dtype dtype,
                              cudaStream_t stream);

/* y = (x - mean) * rstd * w + b; w and b may be NULL (1 and 0); mean, rstd (N) may be NULL. */
int layernorm_forward_cuda(void *y, float *mean, float *rstd, const void *x, const void *w,
                           const void *b, int64_t N, int64_t D, float eps, zr_dtype dtype,
                           cudaStream_t stream);
/* The residual add fused in, as add_rmsnorm_forward_cuda: h = x + res (rounded to the dtype,
 * written to h; may alias x or res), then y, mean, rstd as layernorm_forward_cuda on h; one read of
 * x and res. Its backward is layernorm_backward_cuda on h (dres: the gradient arriving at h). */
int add_layernorm_forward_cuda(void *y, void *h, float *mean, float *rstd, const void *x,
                               const void *res, const void *w, const void *b, int64_t N, int64_t D,
                               float eps, zr_dtype dtype, cudaStream_t stream);
/* dx from dy (+ dres when non-NULL, which dx may alias: a gradient already there is added in the
 * same pass); dw, db (D) overwritten, either may be NULL. w may be NULL (1). */
int layernorm_backward_cuda(void *dx, void *dw, void *db, const void *dy, const void *x,
                            const void *w, const float *mean, const float *rstd, const void *dres,
                            void *workspace, int64_t N, int64_t D, zr_dtype dtype,
                            cudaStream_t stream);
/* As layernorm_backward_cuda, with dw and db each of dtype dw_dtype / db_dtype (dtype, or ZR_F32:
 * a ZeRO fp32 gradient) and acc_w / acc_b 1: += the gradient, 0: = it (as
 * rmsnorm_backward_acc_cuda). N = 0 leaves dw and db untouched. */
int layernorm_backward_acc_cuda(void *dx, void *dw, zr_dtype dw_dtype, int acc_w, void *db,
                                zr_dtype db_dtype, int acc_b, const void *dy, const void *x,
                                const void *w, const float *mean, const float *rstd,
                                const void *dres, void *workspace, int64_t N, int64_t D,
                                zr_dtype dtype, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
