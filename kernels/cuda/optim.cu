/* Multi-tensor AdamW (see optim.h): the host packs up to 64 segments and their block ranges into
 * the kernel's parameters; each block updates 4096 consecutive elements of one segment, each
 * thread 16 of them with coalesced accesses. Then Lion/Adagrad/SGD and Lamb over the same
 * batches; the plain SGD step is at the end. */
#include "optim.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>

extern "C" {
#include "../base/error.h"
}

#include "common.cuh" /* the SGD step below uses its zrk:: helpers */
#include "fused_common.cuh"

#define ADAMW_MAX_SEGS 64
#define ADAMW_THREADS 256
#define ADAMW_PER_THREAD 16
#define ADAMW_CHUNK (ADAMW_THREADS * ADAMW_PER_THREAD)

struct adamw_batch {
    int64_t offset[ADAMW_MAX_SEGS], n[ADAMW_MAX_SEGS];
    float wd[ADAMW_MAX_SEGS], lr[ADAMW_MAX_SEGS], ss[ADAMW_MAX_SEGS]; /* ss: lr / (1 - beta1^step) */
    int block0[ADAMW_MAX_SEGS + 1]; /* first block of each segment; block0[nsegs] = grid size */
    int nsegs;
};

/* The segment block b belongs to (segments are few: a linear scan). */
static __device__ __forceinline__ int segment_of(const adamw_batch &bt, int b) {
    int s = 0;
    while (s + 1 < bt.nsegs && b >= bt.block0[s + 1]) ++s;
    return s;
}

/* One element's update (grad g already scaled): moments, then the decoupled-decay step. */
static __device__ __forceinline__ void adamw_elem(float g, float &p, float &m, float &v, float decay, float b1,
                                                  float b2, float eps, float step_size, float inv_sqrt_bc2) {
    const float mi = b1 * m + (1.f - b1) * g;
    const float vi = b2 * v + (1.f - b2) * g * g;
    p = p * decay - step_size * mi / (sqrtf(vi) * inv_sqrt_bc2 + eps);
    m = mi;
    v = vi;
}

/* The scalar form on element i of the global buffers (unaligned segments, vector-kernel edges). */
template <typename G, typename L>
static __device__ __forceinline__ void adamw_at(int64_t i, float *p, float *m, float *v, L *plp, const G *grad,
                                                float gs, float decay, float b1, float b2, float eps,
                                                float step_size, float inv_sqrt_bc2) {
    float pi = p[i], mi = m[i], vi = v[i];
    adamw_elem(tof<G>(grad[i]) * gs, pi, mi, vi, decay, b1, b2, eps, step_size, inv_sqrt_bc2);
    m[i] = mi;
    v[i] = vi;
    p[i] = pi;
    if (plp) plp[i] = fromf<L>(pi);
}

template <typename G, typename L>
__global__ void __launch_bounds__(ADAMW_THREADS)
    adamw_kernel(adamw_batch bt, float *__restrict__ p, float *__restrict__ m,
                 float *__restrict__ v, L *__restrict__ plp, const G *__restrict__ grad,
                 const float *__restrict__ gscale, float b1, float b2, float eps, float inv_sqrt_bc2) {
    const int s = segment_of(bt, (int)blockIdx.x);
    const int64_t base = bt.offset[s], n = bt.n[s];
    const int64_t c0 = (int64_t)(blockIdx.x - bt.block0[s]) * ADAMW_CHUNK;
    const float decay = 1.f - bt.lr[s] * bt.wd[s], gs = gscale ? *gscale : 1.f, step_size = bt.ss[s];
#pragma unroll 4
    for (int k = 0; k < ADAMW_PER_THREAD; ++k) {
        const int64_t j = c0 + k * ADAMW_THREADS + threadIdx.x;
        if (j >= n) break;
        adamw_at<G, L>(base + j, p, m, v, plp, grad, gs, decay, b1, b2, eps, step_size, inv_sqrt_bc2);
    }
}

/* The vectorised kernel (every buffer 16-byte aligned): within a segment the elements from the
 * first multiple of 8 to the last are updated 8 at a time (two float4 per f32 buffer, one 16-byte
 * access per 16-bit buffer), ADAMW_VEC_ITEMS groups of 8 per thread with all loads issued first;
 * block 0 of the segment also does the at most 7 + 7 elements before and after that range. */
#define ADAMW_VEC_ITEMS (ADAMW_PER_THREAD / 8)

template <typename T> static __device__ __forceinline__ void ld8(float *f, const T *p) {
    if (sizeof(T) == 2) {
        ldv<T, 8>(f, p);
    } else {
        const float4 a = reinterpret_cast<const float4 *>(p)[0], b = reinterpret_cast<const float4 *>(p)[1];
        f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
    }
}
template <typename T> static __device__ __forceinline__ void st8(T *p, const float *f) {
    if (sizeof(T) == 2) {
        stv<T, 8>(p, f);
    } else {
        reinterpret_cast<float4 *>(p)[0] = make_float4(f[0], f[1], f[2], f[3]);
        reinterpret_cast<float4 *>(p)[1] = make_float4(f[4], f[5], f[6], f[7]);
    }
}

template <typename G, typename L>
__global__ void __launch_bounds__(ADAMW_THREADS)
    adamw_vec_kernel(adamw_batch bt, float *__restrict__ p, float *__restrict__ m,
                     float *__restrict__ v, L *__restrict__ plp, const G *__restrict__ grad,
                     const float *__restrict__ gscale, float b1, float b2, float eps,
                     float inv_sqrt_bc2) {
    const int s = segment_of(bt, (int)blockIdx.x);
    const int64_t base = bt.offset[s], end = base + bt.n[s];
    int64_t a0 = (base + 7) & ~(int64_t)7, a1 = end & ~(int64_t)7;
    if (a0 > end) a0 = end;
    if (a1 < a0) a1 = a0;
    const int64_t blk = blockIdx.x - bt.block0[s];
    const float decay = 1.f - bt.lr[s] * bt.wd[s], gs = gscale ? *gscale : 1.f, step_size = bt.ss[s];
    const int64_t c0 = a0 + blk * ADAMW_CHUNK;
    float pp[ADAMW_VEC_ITEMS][8], mm[ADAMW_VEC_ITEMS][8], vv[ADAMW_VEC_ITEMS][8],
        gg[ADAMW_VEC_ITEMS][8];
#pragma unroll
    for (int it = 0; it < ADAMW_VEC_ITEMS; ++it) {
        const int64_t i = c0 + ((int64_t)it * ADAMW_THREADS + threadIdx.x) * 8;
        if (i < a1) {
            ld8<G>(gg[it], grad + i);
            ld8<float>(pp[it], p + i);
            ld8<float>(mm[it], m + i);
            ld8<float>(vv[it], v + i);
        }
    }
#pragma unroll
    for (int it = 0; it < ADAMW_VEC_ITEMS; ++it) {
        const int64_t i = c0 + ((int64_t)it * ADAMW_THREADS + threadIdx.x) * 8;
        if (i >= a1) continue;
#pragma unroll
        for (int k = 0; k < 8; ++k)
            adamw_elem(gg[it][k] * gs, pp[it][k], mm[it][k], vv[it][k], decay, b1, b2, eps, step_size,
                       inv_sqrt_bc2);
        st8<float>(m + i, mm[it]);
        st8<float>(v + i, vv[it]);
        st8<float>(p + i, pp[it]);
        if (plp) st8<L>(plp + i, pp[it]);
    }
    if (blk == 0 && threadIdx.x < 16) { /* head [base, a0) and tail [a1, end) */
        const int64_t i = threadIdx.x < 8 ? base + threadIdx.x : a1 + (threadIdx.x - 8);
        if (threadIdx.x < 8 ? i < a0 : i < end)
            adamw_at<G, L>(i, p, m, v, plp, grad, gs, decay, b1, b2, eps, step_size, inv_sqrt_bc2);
    }
}

template <typename G, typename L>
static void adamw_launch(const adamw_batch &bt, float *p, float *m, float *v, void *plp,
                         const void *grad, const float *gs, float b1, float b2, float eps,
                         float ibc2, cudaStream_t st) {
    if (al16(p) && al16(m) && al16(v) && al16(grad) && (!plp || al16(plp)))
        adamw_vec_kernel<G, L><<<(unsigned)bt.block0[bt.nsegs], ADAMW_THREADS, 0, st>>>(
            bt, p, m, v, (L *)plp, (const G *)grad, gs, b1, b2, eps, ibc2);
    else
        adamw_kernel<G, L><<<(unsigned)bt.block0[bt.nsegs], ADAMW_THREADS, 0, st>>>(
            bt, p, m, v, (L *)plp, (const G *)grad, gs, b1, b2, eps, ibc2);
}

template <typename G>
static int adamw_launch_g(const adamw_batch &bt, float *p, float *m, float *v, void *plp,
                          zr_dtype lpt, const void *grad, const float *gs, float b1, float b2,
                          float eps, float ibc2, cudaStream_t st) {
    if (!plp || lpt == ZR_F32)
        adamw_launch<G, float>(bt, p, m, v, plp, grad, gs, b1, b2, eps, ibc2, st);
    else if (lpt == ZR_BF16)
        adamw_launch<G, __nv_bfloat16>(bt, p, m, v, plp, grad, gs, b1, b2, eps, ibc2, st);
    else if (lpt == ZR_F16)
        adamw_launch<G, __half>(bt, p, m, v, plp, grad, gs, b1, b2, eps, ibc2, st);
    else
        return zr_error("adamw_step_cuda: param copy dtype %s not supported (bf16, f16 or f32)",
                        zr_dtype_name(lpt));
    return 0;
}

/* Segments s0 .. s0+ADAMW_MAX_SEGS-1 of segs into one launch's batch: offsets, sizes, weight
 * decay, lr / lr_div and (when ss_div > 0) the step size lr / ss_div, each segment's first block.
 * Returns 0, or ZR_ERR with the message set (a bad segment, or more blocks than a grid holds). */
static int batch_segments(adamw_batch &bt, const zr_adamw_segment *segs, int s0, int nsegs, double lr_div,
                          double ss_div, const char *fn) {
    int nb = 0, k = 0;
    for (int s = s0; s < nsegs && s < s0 + ADAMW_MAX_SEGS; ++s) {
        if (segs[s].n < 0 || segs[s].offset < 0)
            return zr_error("%s: segment %d has offset %lld, n %lld", fn, s, (long long)segs[s].offset,
                            (long long)segs[s].n);
        const int64_t blocks = (segs[s].n + ADAMW_CHUNK - 1) / ADAMW_CHUNK;
        if ((int64_t)nb + blocks > 0x7fffffffLL)
            return zr_error("%s: segment %d too large (%lld elements)", fn, s, (long long)segs[s].n);
        bt.offset[k] = segs[s].offset;
        bt.n[k] = segs[s].n;
        bt.wd[k] = segs[s].weight_decay;
        bt.lr[k] = (float)(segs[s].lr / lr_div);
        bt.ss[k] = ss_div > 0 ? (float)(segs[s].lr / ss_div) : 0.f;
        bt.block0[k] = nb;
        nb += (int)blocks;
        ++k;
    }
    bt.block0[k] = nb;
    bt.nsegs = k;
    return 0;
}

extern "C" int adamw_step_cuda(float *param, float *m, float *v, void *param_lp,
                               zr_dtype lp_dtype, const void *grad, zr_dtype grad_dtype,
                               const zr_adamw_segment *segs, int nsegs,
                               const zr_adamw_config *c, int64_t step, const float *grad_scale,
                               cudaStream_t stream) {
    const char *fn = "adamw_step_cuda";
    const float beta1 = (float)c->beta1, beta2 = (float)c->beta2, eps = (float)c->eps;
    if (step < 1) return zr_error("%s: step must be >= 1, got %lld", fn, (long long)step);
    if (nsegs < 0 || (nsegs > 0 && !segs))
        return zr_error("%s: %d segments but no segment array", fn, nsegs);
    const double bc1 = 1.0 - pow((double)beta1, (double)step);
    const double bc2 = 1.0 - pow((double)beta2, (double)step);
    const float ibc2 = (float)(1.0 / sqrt(bc2));
    for (int s0 = 0; s0 < nsegs; s0 += ADAMW_MAX_SEGS) {
        adamw_batch bt;
        if (batch_segments(bt, segs, s0, nsegs, 1.0, bc1, fn)) return ZR_ERR;
        if (bt.block0[bt.nsegs] == 0) continue;
        int rc;
        if (grad_dtype == ZR_F32)
            rc = adamw_launch_g<float>(bt, param, m, v, param_lp, lp_dtype, grad, grad_scale, beta1, beta2, eps, ibc2, stream);
        else if (grad_dtype == ZR_BF16)
            rc = adamw_launch_g<__nv_bfloat16>(bt, param, m, v, param_lp, lp_dtype, grad,
                                               grad_scale, beta1, beta2, eps, ibc2,
                                               stream);
        else if (grad_dtype == ZR_F16)
            rc = adamw_launch_g<__half>(bt, param, m, v, param_lp, lp_dtype, grad, grad_scale, beta1, beta2, eps, ibc2, stream);
        else
            return zr_error("%s: grad dtype %s not supported (f32, bf16 or f16)", fn,
                            zr_dtype_name(grad_dtype));
        if (rc) return rc;
        if (launch_check(fn)) return ZR_ERR;
    }
    return 0;
}

/* AdamW with a bf16 master and/or bf16 moments (adamw_lp_step_cuda): the twin of
 * offload_adamw_lp_pieces_cpu, DeepSpeed's FusedAdam arithmetic op by op in f32 through the _rn
 * intrinsics (never contracted into FMAs, so the bits are the CPU's); each state rounded back once
 * (nearest even); plp receives the new master (bf16). One element per thread, ADAMW_PER_THREAD per
 * thread over a block's chunk, as adamw_kernel. */
struct adamw_lp_scalars {
    float b1, omb1, b2, omb2, bc1, bc2, eps;
};

template <typename G, typename M, typename S>
__global__ void __launch_bounds__(ADAMW_THREADS)
    adamw_lp_kernel(adamw_batch bt, M *__restrict__ p, S *__restrict__ m, S *__restrict__ v,
                    __nv_bfloat16 *__restrict__ plp, const G *__restrict__ grad, const float *__restrict__ gscale,
                    adamw_lp_scalars a) {
    const int s = segment_of(bt, (int)blockIdx.x);
    const int64_t base = bt.offset[s], n = bt.n[s];
    const int64_t c0 = (int64_t)(blockIdx.x - bt.block0[s]) * ADAMW_CHUNK;
    const float wd = bt.wd[s], lr = bt.lr[s], gs = gscale ? *gscale : 1.f;
    for (int k = 0; k < ADAMW_PER_THREAD; ++k) {
        const int64_t j = c0 + k * ADAMW_THREADS + threadIdx.x;
        if (j >= n) break;
        const int64_t i = base + j;
        float g = __fmul_rn(tof<G>(grad[i]), gs);
        if (sizeof(G) == 2) g = tof<G>(fromf<G>(g)); /* DeepSpeed scales the 16-bit partition in place */
        const float pi = tof<M>(p[i]);
        const float mi = __fadd_rn(__fmul_rn(a.b1, tof<S>(m[i])), __fmul_rn(a.omb1, g));
        const float vi = __fadd_rn(__fmul_rn(a.b2, tof<S>(v[i])), __fmul_rn(__fmul_rn(a.omb2, g), g));
        const float denom = __fadd_rn(__fsqrt_rn(__fdiv_rn(vi, a.bc2)), a.eps);
        const float update = __fadd_rn(__fdiv_rn(__fdiv_rn(mi, a.bc1), denom), __fmul_rn(wd, pi));
        const float pn = __fsub_rn(pi, __fmul_rn(lr, update));
        m[i] = fromf<S>(mi);
        v[i] = fromf<S>(vi);
        p[i] = fromf<M>(pn);
        if (plp) plp[i] = fromf<__nv_bfloat16>(pn);
    }
}

template <typename G, typename M>
static void adamw_lp_launch_s(const adamw_batch &bt, void *p, void *m, void *v, zr_dtype sdt, void *plp,
                              const void *grad, const float *gs, const adamw_lp_scalars &a, cudaStream_t st) {
    const unsigned nb = (unsigned)bt.block0[bt.nsegs];
    if (sdt == ZR_BF16)
        adamw_lp_kernel<G, M, __nv_bfloat16><<<nb, ADAMW_THREADS, 0, st>>>(
            bt, (M *)p, (__nv_bfloat16 *)m, (__nv_bfloat16 *)v, (__nv_bfloat16 *)plp, (const G *)grad, gs, a);
    else
        adamw_lp_kernel<G, M, float><<<nb, ADAMW_THREADS, 0, st>>>(bt, (M *)p, (float *)m, (float *)v,
                                                                   (__nv_bfloat16 *)plp, (const G *)grad, gs, a);
}

template <typename G>
static void adamw_lp_launch_g(const adamw_batch &bt, void *p, zr_dtype mdt, void *m, void *v, zr_dtype sdt,
                              void *plp, const void *grad, const float *gs, const adamw_lp_scalars &a,
                              cudaStream_t st) {
    if (mdt == ZR_BF16) adamw_lp_launch_s<G, __nv_bfloat16>(bt, p, m, v, sdt, plp, grad, gs, a, st);
    else adamw_lp_launch_s<G, float>(bt, p, m, v, sdt, plp, grad, gs, a, st);
}

extern "C" int adamw_lp_step_cuda(void *param, zr_dtype master_dtype, void *m, void *v, zr_dtype state_dtype,
                                  void *param_lp, const void *grad, zr_dtype grad_dtype, const zr_adamw_segment *segs,
                                  int nsegs, const zr_adamw_config *c, int64_t step, const float *grad_scale,
                                  cudaStream_t stream) {
    const char *fn = "adamw_lp_step_cuda";
    if (step < 1) return zr_error("%s: step must be >= 1, got %lld", fn, (long long)step);
    if (nsegs < 0 || (nsegs > 0 && !segs)) return zr_error("%s: %d segments but no segment array", fn, nsegs);
    if ((master_dtype != ZR_F32 && master_dtype != ZR_BF16) || (state_dtype != ZR_F32 && state_dtype != ZR_BF16))
        return zr_error("%s: master %s, moments %s: each must be f32 or bf16", fn, zr_dtype_name(master_dtype),
                        zr_dtype_name(state_dtype));
    if (grad_dtype != ZR_F32 && grad_dtype != ZR_BF16)
        return zr_error("%s: grad dtype %s not supported (f32 or bf16)", fn, zr_dtype_name(grad_dtype));
    /* the scalars as offload_adamw_lp_pieces_cpu (FusedAdam's host code) rounds them */
    const float b1 = (float)c->beta1, b2 = (float)c->beta2;
    const adamw_lp_scalars a = {b1, 1.0f - b1, b2, 1.0f - b2, (float)(1 - pow((double)b1, (double)step)),
                                (float)(1 - pow((double)b2, (double)step)), (float)c->eps};
    for (int s0 = 0; s0 < nsegs; s0 += ADAMW_MAX_SEGS) {
        adamw_batch bt;
        if (batch_segments(bt, segs, s0, nsegs, 1.0, 0, fn)) return ZR_ERR; /* lr and wd as f32, as on the CPU */
        if (bt.block0[bt.nsegs] == 0) continue;
        if (grad_dtype == ZR_F32)
            adamw_lp_launch_g<float>(bt, param, master_dtype, m, v, state_dtype, param_lp, grad, grad_scale, a, stream);
        else
            adamw_lp_launch_g<__nv_bfloat16>(bt, param, master_dtype, m, v, state_dtype, param_lp, grad, grad_scale, a,
                                             stream);
        if (launch_check(fn)) return ZR_ERR;
    }
    return 0;
}


/* --- Lion, Adagrad, SGD: the one-state optimizers over partition segments (optim_step_cpu's
 * twin). Same batching as AdamW (adamw_batch: up to 64 segments, ADAMW_CHUNK elements per block),
 * a scalar loop per thread: these run where AdamW's vector kernel is not worth a second copy. --- */

/* One element, g already scaled; the arithmetic and order of kernels/cpu/offload.c's optim_elem_cpu. */
static __device__ __forceinline__ float optim_elem(int kind, float g, float p, float &s, float lr, float wd, float b1,
                                                   float b2, float eps, float mo, float damp1, int nesterov,
                                                   int first, int has_buf) {
    if (kind == ZR_OPTIM_LION) {
        const float c = b1 * s + (1.f - b1) * g;
        p = p * (1.f - lr * wd) - lr * (float)((c > 0.f) - (c < 0.f));
        s = b2 * s + (1.f - b2) * g;
    } else if (kind == ZR_OPTIM_ADAGRAD) {
        g += wd * p;
        s += g * g;
        p -= lr * g / (sqrtf(s) + eps);
    } else { /* SGD */
        const float d = g + wd * p;
        if (has_buf) {
            const float b = first ? d : mo * s + damp1 * d;
            s = b;
            p -= lr * (nesterov ? d + mo * b : b);
        } else
            p -= lr * d;
    }
    return p;
}

template <typename G, typename L>
__global__ void __launch_bounds__(ADAMW_THREADS)
    optim_kernel(adamw_batch bt, int kind, float *__restrict__ p, float *__restrict__ st, L *__restrict__ plp,
                 const G *__restrict__ grad, const float *__restrict__ gscale, float b1, float b2, float eps,
                 float mo, float damp1, int nesterov, int first) {
    const int s = segment_of(bt, (int)blockIdx.x);
    const int64_t base = bt.offset[s], n = bt.n[s];
    const int64_t c0 = (int64_t)(blockIdx.x - bt.block0[s]) * ADAMW_CHUNK;
    const float gs = gscale ? *gscale : 1.f, lr = bt.lr[s], wd = bt.wd[s];
    for (int k = 0; k < ADAMW_PER_THREAD; ++k) {
        const int64_t j = c0 + k * ADAMW_THREADS + threadIdx.x;
        if (j >= n) break;
        const int64_t i = base + j;
        float si = st ? st[i] : 0.f;
        const float pi = optim_elem(kind, tof<G>(grad[i]) * gs, p[i], si, lr, wd, b1, b2, eps, mo, damp1, nesterov,
                                    first, st != nullptr);
        if (st) st[i] = si;
        p[i] = pi;
        if (plp) plp[i] = fromf<L>(pi);
    }
}

template <typename G, typename L>
static void optim_launch(const adamw_batch &bt, const zr_adamw_config *c, float *p, float *st, void *plp,
                         const void *grad, const float *gs, int first, cudaStream_t stream) {
    optim_kernel<G, L><<<(unsigned)bt.block0[bt.nsegs], ADAMW_THREADS, 0, stream>>>(
        bt, c->kind, p, st, (L *)plp, (const G *)grad, gs, (float)c->beta1, (float)c->beta2, (float)c->eps,
        (float)c->momentum, (float)(1 - c->dampening), c->nesterov, first);
}

template <typename G>
static int optim_launch_g(const adamw_batch &bt, const zr_adamw_config *c, float *p, float *st, void *plp,
                          zr_dtype lpt, const void *grad, const float *gs, int first, cudaStream_t stream) {
    if (!plp || lpt == ZR_F32)
        optim_launch<G, float>(bt, c, p, st, plp, grad, gs, first, stream);
    else if (lpt == ZR_BF16)
        optim_launch<G, __nv_bfloat16>(bt, c, p, st, plp, grad, gs, first, stream);
    else if (lpt == ZR_F16)
        optim_launch<G, __half>(bt, c, p, st, plp, grad, gs, first, stream);
    else
        return zr_error("optim_step_cuda: param copy dtype %s not supported (bf16, f16 or f32)", zr_dtype_name(lpt));
    return 0;
}

extern "C" int optim_step_cuda(float *param, float *state, void *param_lp, zr_dtype lp_dtype, const void *grad,
                               zr_dtype grad_dtype, const zr_adamw_segment *segs, int nsegs,
                               const zr_adamw_config *c, int64_t step, const float *grad_scale,
                               cudaStream_t stream) {
    const char *fn = "optim_step_cuda";
    if (c->kind != ZR_OPTIM_LION && c->kind != ZR_OPTIM_ADAGRAD && c->kind != ZR_OPTIM_SGD)
        return zr_error("%s: optimizer kind %d is not Lion, Adagrad or SGD", fn, c->kind);
    if (step < 1) return zr_error("%s: step must be >= 1, got %lld", fn, (long long)step);
    if (nsegs < 0 || (nsegs > 0 && !segs)) return zr_error("%s: %d segments but no segment array", fn, nsegs);
    if (!state && c->kind != ZR_OPTIM_SGD) return zr_error("%s: Lion and Adagrad need a state buffer", fn);
    const double decay = c->kind == ZR_OPTIM_ADAGRAD ? 1 + (double)(step - 1) * c->lr_decay : 1;
    for (int s0 = 0; s0 < nsegs; s0 += ADAMW_MAX_SEGS) {
        adamw_batch bt;
        if (batch_segments(bt, segs, s0, nsegs, decay, 0.0, fn)) return ZR_ERR;
        if (bt.block0[bt.nsegs] == 0) continue;
        int rc;
        if (grad_dtype == ZR_F32)
            rc = optim_launch_g<float>(bt, c, param, state, param_lp, lp_dtype, grad, grad_scale, step == 1, stream);
        else if (grad_dtype == ZR_BF16)
            rc = optim_launch_g<__nv_bfloat16>(bt, c, param, state, param_lp, lp_dtype, grad, grad_scale, step == 1,
                                               stream);
        else if (grad_dtype == ZR_F16)
            rc = optim_launch_g<__half>(bt, c, param, state, param_lp, lp_dtype, grad, grad_scale, step == 1, stream);
        else
            return zr_error("%s: grad dtype %s not supported (f32, bf16 or f16)", fn, zr_dtype_name(grad_dtype));
        if (rc) return rc;
        if (launch_check(fn)) return ZR_ERR;
    }
    return 0;
}

/* --- Lamb: two passes over partition segments (lamb_sums_cpu / lamb_apply_cpu's twins). Same
 * batching as AdamW (adamw_batch: ADAMW_CHUNK elements per block; ss holds each segment's step
 * size). Pass 1 updates the moments and leaves each block's sums of p^2 and u^2 (double) in the
 * workspace; a second kernel adds a segment's blocks in a fixed order; pass 2 reads the sums. --- */

/* a[0..ADAMW_THREADS) and b[..] summed into a[0], b[0] (tree order: the same bits on every run). */
static __device__ __forceinline__ void block_sum2(double *a, double *b) {
    for (int h = ADAMW_THREADS / 2; h > 0; h >>= 1) {
        __syncthreads();
        if ((int)threadIdx.x < h) {
            a[threadIdx.x] += a[threadIdx.x + h];
            b[threadIdx.x] += b[threadIdx.x + h];
        }
    }
    __syncthreads();
}

template <typename G>
__global__ void __launch_bounds__(ADAMW_THREADS)
    lamb_sums_kernel(adamw_batch bt, const float *__restrict__ p, float *__restrict__ m, float *__restrict__ v,
                     const G *__restrict__ grad, const float *__restrict__ gscale, float b1, float b2, float eps,
                     int inside, double *__restrict__ part) {
    __shared__ double sp[ADAMW_THREADS], su[ADAMW_THREADS];
    const int s = segment_of(bt, (int)blockIdx.x);
    const int64_t base = bt.offset[s], n = bt.n[s];
    const int64_t c0 = (int64_t)(blockIdx.x - bt.block0[s]) * ADAMW_CHUNK;
    const float gs = gscale ? *gscale : 1.f, wd = bt.wd[s];
    double psq = 0, usq = 0;
    for (int k = 0; k < ADAMW_PER_THREAD; ++k) {
        const int64_t j = c0 + k * ADAMW_THREADS + threadIdx.x;
        if (j >= n) break;
        const int64_t i = base + j;
        const float g = tof<G>(grad[i]) * gs, pi = p[i];
        const float mi = b1 * m[i] + (1.f - b1) * g, vi = b2 * v[i] + (1.f - b2) * g * g;
        m[i] = mi;
        v[i] = vi;
        const float u = zr_lamb_u(mi, vi, pi, eps, wd, inside);
        psq += (double)pi * pi;
        usq += (double)u * u;
    }
    sp[threadIdx.x] = psq;
    su[threadIdx.x] = usq;
    block_sum2(sp, su);
    if (threadIdx.x == 0) {
        part[2 * blockIdx.x] = sp[0];
        part[2 * blockIdx.x + 1] = su[0];
    }
}

/* Block s: the partials of segment s's blocks added into sums[2s], sums[2s+1] (0 for an empty one). */
__global__ void __launch_bounds__(ADAMW_THREADS)
    lamb_reduce_kernel(adamw_batch bt, const double *__restrict__ part, double *__restrict__ sums) {
    __shared__ double sp[ADAMW_THREADS], su[ADAMW_THREADS];
    const int s = blockIdx.x;
    double a = 0, b = 0;
    for (int k = bt.block0[s] + threadIdx.x; k < bt.block0[s + 1]; k += ADAMW_THREADS) {
        a += part[2 * k];
        b += part[2 * k + 1];
    }
    sp[threadIdx.x] = a;
    su[threadIdx.x] = b;
    block_sum2(sp, su);
    if (threadIdx.x == 0) {
        sums[2 * s] = sp[0];
        sums[2 * s + 1] = su[0];
    }
}

template <typename L>
__global__ void __launch_bounds__(ADAMW_THREADS)
    lamb_apply_kernel(adamw_batch bt, float *__restrict__ p, const float *__restrict__ m,
                      const float *__restrict__ v, L *__restrict__ plp, float eps, int inside, double max_coeff,
                      double min_coeff, const double *__restrict__ sums) {
    const int s = segment_of(bt, (int)blockIdx.x);
    const int64_t base = bt.offset[s], n = bt.n[s];
    const int64_t c0 = (int64_t)(blockIdx.x - bt.block0[s]) * ADAMW_CHUNK;
    const float f = (float)((double)bt.ss[s] * zr_lamb_ratio(sums[2 * s], sums[2 * s + 1], max_coeff, min_coeff));
    const float wd = bt.wd[s];
    for (int k = 0; k < ADAMW_PER_THREAD; ++k) {
        const int64_t j = c0 + k * ADAMW_THREADS + threadIdx.x;
        if (j >= n) break;
        const int64_t i = base + j;
        const float pi = p[i] - f * zr_lamb_u(m[i], v[i], p[i], eps, wd, inside);
        p[i] = pi;
        if (plp) plp[i] = fromf<L>(pi);
    }
}

extern "C" int64_t lamb_workspace_cuda(const zr_adamw_segment *segs, int nsegs) {
    int64_t blocks = 0;
    for (int s = 0; s < nsegs; ++s) blocks += segs[s].n > 0 ? (segs[s].n + ADAMW_CHUNK - 1) / ADAMW_CHUNK : 0;
    return 2 * (blocks > 0 ? blocks : 1);
}

extern "C" int lamb_sums_cuda(const float *param, float *m, float *v, const void *grad, zr_dtype grad_dtype,
                              const zr_adamw_segment *segs, int nsegs, const zr_adamw_config *c,
                              const float *grad_scale, double *sums, double *work, cudaStream_t stream) {
    const char *fn = "lamb_sums_cuda";
    if (nsegs < 0 || (nsegs > 0 && !segs)) return zr_error("%s: %d segments but no segment array", fn, nsegs);
    const float b1 = (float)c->beta1, b2 = (float)c->beta2, eps = (float)c->eps;
    int64_t used = 0; /* batches take consecutive ranges of the workspace */
    for (int s0 = 0; s0 < nsegs; s0 += ADAMW_MAX_SEGS) {
        adamw_batch bt;
        if (batch_segments(bt, segs, s0, nsegs, 1.0, 0.0, fn)) return ZR_ERR;
        const unsigned nb = (unsigned)bt.block0[bt.nsegs];
        double *part = work + used;
        used += 2 * (int64_t)nb;
        if (nb > 0) {
            if (grad_dtype == ZR_F32)
                lamb_sums_kernel<float><<<nb, ADAMW_THREADS, 0, stream>>>(bt, param, m, v, (const float *)grad,
                                                                          grad_scale, b1, b2, eps,
                                                                          c->eps_inside_sqrt, part);
            else if (grad_dtype == ZR_BF16)
                lamb_sums_kernel<__nv_bfloat16><<<nb, ADAMW_THREADS, 0, stream>>>(
                    bt, param, m, v, (const __nv_bfloat16 *)grad, grad_scale, b1, b2, eps, c->eps_inside_sqrt, part);
            else if (grad_dtype == ZR_F16)
                lamb_sums_kernel<__half><<<nb, ADAMW_THREADS, 0, stream>>>(
                    bt, param, m, v, (const __half *)grad, grad_scale, b1, b2, eps, c->eps_inside_sqrt, part);
            else
                return zr_error("%s: grad dtype %s not supported (f32, bf16 or f16)", fn, zr_dtype_name(grad_dtype));
            if (launch_check(fn)) return ZR_ERR;
        }
        lamb_reduce_kernel<<<(unsigned)bt.nsegs, ADAMW_THREADS, 0, stream>>>(bt, part, sums + 2 * s0);
        if (launch_check(fn)) return ZR_ERR;
    }
    return 0;
}

template <typename L>
static void lamb_apply_launch(const adamw_batch &bt, float *p, const float *m, const float *v, void *plp,
                              const zr_adamw_config *c, const double *sums, cudaStream_t stream) {
    lamb_apply_kernel<L><<<(unsigned)bt.block0[bt.nsegs], ADAMW_THREADS, 0, stream>>>(
        bt, p, m, v, (L *)plp, (float)c->eps, c->eps_inside_sqrt, c->max_coeff, c->min_coeff, sums);
}

extern "C" int lamb_apply_cuda(float *param, const float *m, const float *v, void *param_lp, zr_dtype lp_dtype,
                               const zr_adamw_segment *segs, int nsegs, const zr_adamw_config *c, int64_t step,
                               const double *sums, cudaStream_t stream) {
    const char *fn = "lamb_apply_cuda";
    if (step < 1) return zr_error("%s: step must be >= 1, got %lld", fn, (long long)step);
    if (nsegs < 0 || (nsegs > 0 && !segs)) return zr_error("%s: %d segments but no segment array", fn, nsegs);
    const double ss_div = 1.0 / zr_lamb_step_size(c, 1.0, step); /* lr / ss_div: each segment's step size */
    for (int s0 = 0; s0 < nsegs; s0 += ADAMW_MAX_SEGS) {
        adamw_batch bt;
        if (batch_segments(bt, segs, s0, nsegs, 1.0, ss_div, fn)) return ZR_ERR;
        if (bt.block0[bt.nsegs] == 0) continue;
        const double *bs = sums + 2 * s0;
        if (!param_lp || lp_dtype == ZR_F32) lamb_apply_launch<float>(bt, param, m, v, param_lp, c, bs, stream);
        else if (lp_dtype == ZR_BF16) lamb_apply_launch<__nv_bfloat16>(bt, param, m, v, param_lp, c, bs, stream);
        else if (lp_dtype == ZR_F16) lamb_apply_launch<__half>(bt, param, m, v, param_lp, c, bs, stream);
        else return zr_error("%s: param copy dtype %s not supported (bf16, f16 or f32)", fn, zr_dtype_name(lp_dtype));
        if (launch_check(fn)) return ZR_ERR;
    }
    return 0;
}

/* SGD: a grid-stride kernel in the parameter's precision; inside namespace zrk so that its
 * helpers are found before fused_common.cuh's. */
namespace zrk {
namespace {

template <typename R>
__global__ void sgd_kernel(R *p, const R *g, R *buf, int64_t n, R lr, R mo, R damp, R wd, int nesterov, int first) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        if (!buf) {
            p[i] -= lr * (g[i] + wd * p[i]);
            continue;
        }
        R d = g[i] + wd * p[i];
        R b = first ? d : mo * buf[i] + damp * d;
        buf[i] = b;
        p[i] -= lr * (nesterov ? d + mo * b : b);
    }
}

}  // namespace

extern "C" int sgd_step_cuda(void *p, const void *g, void *buf, int64_t n, double lr, double momentum,
                             double dampening, double weight_decay, int nesterov, int first, zr_dtype dt,
                             cudaStream_t stream) {
    if (n <= 0) return 0;
    unsigned grid = grid_for(n, 256);
    if (dt == ZR_F32)
        sgd_kernel<float><<<grid, 256, 0, stream>>>((float *)p, (const float *)g, (float *)buf, n, (float)lr,
                                                    (float)momentum, (float)(1 - dampening), (float)weight_decay,
                                                    nesterov, first);
    else if (dt == ZR_F64)
        sgd_kernel<double><<<grid, 256, 0, stream>>>((double *)p, (const double *)g, (double *)buf, n, lr, momentum,
                                                     1 - dampening, weight_decay, nesterov, first);
    else
        return zr_error("sgd_step_cuda: parameters must be f32 or f64, got %s", zr_dtype_name(dt));
    return launch_check("sgd_step_cuda");
}

}  // namespace zrk
