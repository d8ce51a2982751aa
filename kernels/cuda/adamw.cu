/* Multi-tensor AdamW (see adamw.h): the host packs up to 64 segments and their block ranges into
 * the kernel's parameters; each block updates 4096 consecutive elements of one segment, each
 * thread 16 of them with coalesced accesses. */
#include "adamw.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>

extern "C" {
#include "error.h"
}

#include "fused_common.cuh"

#define ADAMW_MAX_SEGS 64
#define ADAMW_THREADS 256
#define ADAMW_PER_THREAD 16
#define ADAMW_CHUNK (ADAMW_THREADS * ADAMW_PER_THREAD)

struct adamw_batch {
    int64_t offset[ADAMW_MAX_SEGS], n[ADAMW_MAX_SEGS];
    float wd[ADAMW_MAX_SEGS];
    int block0[ADAMW_MAX_SEGS + 1]; /* first block of each segment; block0[nsegs] = grid size */
    int nsegs;
};

template <typename G, typename L>
__global__ void __launch_bounds__(ADAMW_THREADS)
    adamw_kernel(adamw_batch bt, float *__restrict__ p, float *__restrict__ m,
                 float *__restrict__ v, L *__restrict__ plp, const G *__restrict__ grad,
                 const float *__restrict__ gscale, float lr, float b1, float b2, float eps,
                 float step_size, float inv_sqrt_bc2) {
    int s = 0;
    while (s + 1 < bt.nsegs && (int)blockIdx.x >= bt.block0[s + 1]) ++s;
    const int64_t base = bt.offset[s], n = bt.n[s];
    const int64_t c0 = (int64_t)(blockIdx.x - bt.block0[s]) * ADAMW_CHUNK;
    const float decay = 1.f - lr * bt.wd[s], gs = gscale ? *gscale : 1.f;
#pragma unroll 4
    for (int k = 0; k < ADAMW_PER_THREAD; ++k) {
        const int64_t j = c0 + k * ADAMW_THREADS + threadIdx.x;
        if (j >= n) break;
        const int64_t i = base + j;
        const float g = tof<G>(grad[i]) * gs;
        const float mi = b1 * m[i] + (1.f - b1) * g;
        const float vi = b2 * v[i] + (1.f - b2) * g * g;
        const float pi = p[i] * decay - step_size * mi / (sqrtf(vi) * inv_sqrt_bc2 + eps);
        m[i] = mi;
        v[i] = vi;
        p[i] = pi;
        if (plp) plp[i] = fromf<L>(pi);
    }
}

template <typename G, typename L>
static void adamw_launch(const adamw_batch &bt, float *p, float *m, float *v, void *plp,
                         const void *grad, const float *gs, float lr, float b1, float b2,
                         float eps, float ss, float ibc2, cudaStream_t st) {
    adamw_kernel<G, L><<<(unsigned)bt.block0[bt.nsegs], ADAMW_THREADS, 0, st>>>(
        bt, p, m, v, (L *)plp, (const G *)grad, gs, lr, b1, b2, eps, ss, ibc2);
}

template <typename G>
static int adamw_launch_g(const adamw_batch &bt, float *p, float *m, float *v, void *plp,
                          zr_dtype lpt, const void *grad, const float *gs, float lr, float b1,
                          float b2, float eps, float ss, float ibc2, cudaStream_t st) {
    if (!plp || lpt == ZR_F32)
        adamw_launch<G, float>(bt, p, m, v, plp, grad, gs, lr, b1, b2, eps, ss, ibc2, st);
    else if (lpt == ZR_BF16)
        adamw_launch<G, __nv_bfloat16>(bt, p, m, v, plp, grad, gs, lr, b1, b2, eps, ss, ibc2, st);
    else if (lpt == ZR_F16)
        adamw_launch<G, __half>(bt, p, m, v, plp, grad, gs, lr, b1, b2, eps, ss, ibc2, st);
    else
        return zr_error("adamw_step_cuda: param copy dtype %s not supported (bf16, f16 or f32)",
                        zr_dtype_name(lpt));
    return 0;
}

extern "C" int adamw_step_cuda(float *param, float *m, float *v, void *param_lp,
                               zr_dtype lp_dtype, const void *grad, zr_dtype grad_dtype,
                               const zr_adamw_segment *segs, int nsegs, float lr, float beta1,
                               float beta2, float eps, int64_t step, const float *grad_scale,
                               cudaStream_t stream) {
    const char *fn = "adamw_step_cuda";
    if (step < 1) return zr_error("%s: step must be >= 1, got %lld", fn, (long long)step);
    if (nsegs < 0 || (nsegs > 0 && !segs))
        return zr_error("%s: %d segments but no segment array", fn, nsegs);
    const double bc1 = 1.0 - pow((double)beta1, (double)step);
    const double bc2 = 1.0 - pow((double)beta2, (double)step);
    const float ss = (float)(lr / bc1), ibc2 = (float)(1.0 / sqrt(bc2));
    for (int s0 = 0; s0 < nsegs; s0 += ADAMW_MAX_SEGS) {
        adamw_batch bt;
        int nb = 0, k = 0;
        for (int s = s0; s < nsegs && s < s0 + ADAMW_MAX_SEGS; ++s) {
            if (segs[s].n < 0 || segs[s].offset < 0)
                return zr_error("%s: segment %d has offset %lld, n %lld", fn, s,
                                (long long)segs[s].offset, (long long)segs[s].n);
            const int64_t blocks = (segs[s].n + ADAMW_CHUNK - 1) / ADAMW_CHUNK;
            if ((int64_t)nb + blocks > 0x7fffffffLL)
                return zr_error("%s: segment %d too large (%lld elements)", fn, s,
                                (long long)segs[s].n);
            bt.offset[k] = segs[s].offset;
            bt.n[k] = segs[s].n;
            bt.wd[k] = segs[s].weight_decay;
            bt.block0[k] = nb;
            nb += (int)blocks;
            ++k;
        }
        bt.block0[k] = nb;
        bt.nsegs = k;
        if (nb == 0) continue;
        int rc;
        if (grad_dtype == ZR_F32)
            rc = adamw_launch_g<float>(bt, param, m, v, param_lp, lp_dtype, grad, grad_scale, lr,
                                       beta1, beta2, eps, ss, ibc2, stream);
        else if (grad_dtype == ZR_BF16)
            rc = adamw_launch_g<__nv_bfloat16>(bt, param, m, v, param_lp, lp_dtype, grad,
                                               grad_scale, lr, beta1, beta2, eps, ss, ibc2,
                                               stream);
        else if (grad_dtype == ZR_F16)
            rc = adamw_launch_g<__half>(bt, param, m, v, param_lp, lp_dtype, grad, grad_scale, lr,
                                        beta1, beta2, eps, ss, ibc2, stream);
        else
            return zr_error("%s: grad dtype %s not supported (f32, bf16 or f16)", fn,
                            zr_dtype_name(grad_dtype));
        if (rc) return rc;
        if (launch_check(fn)) return ZR_ERR;
    }
    return 0;
}
