/* Causal GQA flash attention backward for Hopper (sm_90a): wgmma m64n64k16 (f32 accumulate) with
 * Q, P, K, V and dS^T as A operands from registers and K, V, Q, dO, dS from 128-byte-swizzled
 * shared memory; cp.async double-buffered loads. head_dim 64, bf16/f16. 128 keys per block (64
 * per warpgroup), 128-query steps over the kv head's query group; dQ through f32 atomics. Also the
 * host-side checks shared with the forward (attention_fwd_sm90.cu). sm_90a only (see Makefile). */
#include "attention_sm90.h"

#include <math.h>

#include "attention_bwd_sm90.cuh"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "attention_bwd_sm90.cu needs -gencode arch=compute_90a,code=sm_90a (wgmma)"
#endif

using namespace sm90;

#define B_BN 128 /* backward: keys per block */
#define B_BM 128 /* backward: queries per step */
#define NTHR 256 /* two warpgroups */
static_assert(B_BM == B_BN, "the diagonal tile's mask assumes square tiles");
#define LOG2E 1.4426950408889634f

/* ---- backward ------------------------------------------------------------------------------- */

/* grid: x = (b*Hkv + hk)*nsplit + split, y = key tile j (128 keys). Each block loops over the
 * query heads of its split of the group and the query tiles i >= j (128 queries each, in two
 * halves of 64): S^T, dP^T (64 keys × 64 queries per warpgroup), P^T, dS^T, dV += P^T dO,
 * dK += dS^T Q; then dQ (64 queries per warpgroup) = dS K from shared memory, added atomically. */
template <typename T>
__global__ void __launch_bounds__(NTHR, 1)
    attn_bwd_sm90_kernel(uint16_t *__restrict__ dk, uint16_t *__restrict__ dv,
                         float *__restrict__ ws_dkv, float *__restrict__ dqacc,
                         const uint16_t *__restrict__ dout, const uint16_t *__restrict__ q,
                         const uint16_t *__restrict__ k, const uint16_t *__restrict__ v,
                         const float *__restrict__ lse, const float *__restrict__ Dd,
                         zr_attn_layout L, int T_, int Hq, int G, int nsplit, int64_t kv_elems,
                         float scale, float scale_log2) {
    extern __shared__ uint8_t smem_raw[];
    uint16_t *sK = align1024(smem_raw);
    uint16_t *sV = sK + B_BN * 64, *sQ = sV + B_BN * 64;
    uint16_t *sdO = sQ + 2 * B_BM * 64, *sdS = sdO + 2 * B_BM * 64;
    float *sL = reinterpret_cast<float *>(sdS + B_BN * B_BM), *sDd = sL + 2 * B_BM;

    const int nT = (T_ + B_BM - 1) / B_BM;
    const int j = blockIdx.y, kv0 = j * B_BN;
    const int split = blockIdx.x % nsplit, bhk = blockIdx.x / nsplit;
    const int Hkv = Hq / G, b = bhk / Hkv, hk = bhk % Hkv;
    const int Gs = G / nsplit, h0 = (bhk % Hkv) * G + split * Gs;
    const int nq = nT - j, niter = Gs * nq;
    const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
    const int g = lane >> 2, t4 = lane & 3;

    load_tile<B_BN, NTHR>(sK, k + b * L.k.sb + hk * L.k.sh, L.k.st, kv0, T_, tid);
    load_tile<B_BN, NTHR>(sV, v + b * L.v.sb + hk * L.v.sh, L.v.st, kv0, T_, tid);

    /* Issues the loads of iteration it into buffer it & 1. */
    auto prefetch = [&](int it) {
        const int h = h0 + it / nq, i = j + it % nq, buf = it & 1;
        load_tile<B_BM, NTHR>(sQ + buf * B_BM * 64, q + b * L.q.sb + h * L.q.sh, L.q.st,
                              i * B_BM, T_, tid);
        load_tile<B_BM, NTHR>(sdO + buf * B_BM * 64, dout + b * L.dout.sb + h * L.dout.sh,
                              L.dout.st, i * B_BM, T_, tid);
        const size_t roff = ((size_t)b * Hq + h) * T_;
        const int r = i * B_BM + (tid & 127);
        /* raw lse (natural log) and D, zero past T: P = 1 there, but dO = D = 0 so it adds 0 */
        const float *src = (tid < 128 ? lse : Dd) + roff + (r < T_ ? r : 0);
        cp_async4((tid < 128 ? sL : sDd) + buf * B_BM + (tid & 127), src, r < T_ ? 4 : 0);
    };
    prefetch(0);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();

    uint32_t kf[4][4], vf[4][4];
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
        lds_a(kf[kk], sK, wg * 64 + warp * 16, kk * 16, lane);
        lds_a(vf[kk], sV, wg * 64 + warp * 16, kk * 16, lane);
    }
    float dka[32], dva[32];
#pragma unroll
    for (int i = 0; i < 32; ++i)
        dka[i] = dva[i] = 0.f;
    const int key0 = kv0 + wg * 64 + warp * 16 + g; /* this thread's keys: key0, key0 + 8 */
    const uint32_t aK = smem_u32(sK);

    for (int it = 0; it < niter; ++it) {
        cp_async_wait<0>();
        fence_proxy_async();
        __syncthreads(); /* buffer it & 1 visible; everyone is done with iteration it - 1 */
        if (it + 1 < niter) prefetch(it + 1);
        cp_async_commit();
        const int buf = it & 1, h = h0 + it / nq, i = j + it % nq;
        const uint16_t *cQ = sQ + buf * B_BM * 64, *cdO = sdO + buf * B_BM * 64;
        const float *cL = sL + buf * B_BM, *cD = sDd + buf * B_BM;
        const uint32_t aQ = smem_u32(cQ), adO = smem_u32(cdO);
        const bool diag = (i == j);

        uint32_t pf[2][4][4], sf[2][4][4]; /* A operands of the dV/dK products of each half */
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            float st[32], dpt[32]; /* overwritten by the first k-step (acc = 0) */
            reg_fence(st);
            reg_fence(dpt);
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < 4; ++kk)
                wg_rs64<T, 0>(st, kf[kk], desc128(aQ + hh * 64 * 128 + kk * 32), kk);
            wg_commit();
#pragma unroll
            for (int kk = 0; kk < 4; ++kk)
                wg_rs64<T, 0>(dpt, vf[kk], desc128(adO + hh * 64 * 128 + kk * 32), kk);
            wg_commit();
            /* P^T (rows are keys, columns queries), computed while dP^T may still run. */
            wg_wait<1>();
            reg_fence(st);
            if (hh == 1) { /* the dV/dK products of half 0 are done with these now */
                reg_fence(pf[0]);
                reg_fence(sf[0]);
            }
            p_tile(st, cL + hh * 64 + t4 * 2, scale_log2);
            /* the causal mask, on the diagonal tile only (its query rows start at the keys'): a
             * branch after the exponentials, so that they stay ahead of the wait below, where the
             * SASS shows them (ptxas schedules a wgmma wait early in its basic block) */
            if (diag) mask_tile(st, key0 - kv0 - hh * 64 - t4 * 2);
            wg_wait<0>();
            reg_fence(dpt);
            ds_pack<T>(dpt, st, cD + hh * 64 + t4 * 2, pf[hh], sf[hh],
                       sdS + hh * B_BN * 64 /* [key][query of this half] */,
                       wg * 64 + warp * 16 + g, t4);
            dvdk_issue<T>(dva, dka, pf[hh], sf[hh], adO + hh * 64 * 128, aQ + hh * 64 * 128);
        }
        fence_proxy_async();
        float *dqb = dqacc + ((size_t)b * Hq + h) * T_ * 64;
        __syncthreads(); /* both halves of dS^T written */

        /* dQ rows i*128 + wg*64 .. +63: dS (64 queries × 128 keys) · K (128 keys × 64). */
        float dq[32]; /* overwritten by the first k-step */
        dq_issue<T>(dq, smem_u32(sdS + wg * B_BN * 64), aK);
        wg_wait<0>();
        reg_fence(dq);
        reg_fence(dva);
        reg_fence(dka);
        reg_fence(pf[1]);
        reg_fence(sf[1]);
        const int qr = i * B_BM + wg * 64 + warp * 16 + g;
        /* Lane pairs swap halves so that each lane adds 4 consecutive floats of one row:
         * even lanes row qr, odd lanes row qr + 8, columns 8nt + 2(t4 & ~1) .. +3. */
        const bool odd = t4 & 1;
        const int row = odd ? qr + 8 : qr, c0 = 2 * (t4 & ~1);
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
            const float x0 = __shfl_xor_sync(0xffffffffu, odd ? dq[4 * nt] : dq[4 * nt + 2], 1);
            const float x1 = __shfl_xor_sync(0xffffffffu, odd ? dq[4 * nt + 1] : dq[4 * nt + 3], 1);
            const float4 val = odd ? make_float4(x0, x1, dq[4 * nt + 2], dq[4 * nt + 3])
                                   : make_float4(dq[4 * nt], dq[4 * nt + 1], x0, x1);
            if (row < T_)
                atomicAdd(reinterpret_cast<float4 *>(dqb + (size_t)row * 64 + nt * 8 + c0), val);
        }
    }

    store_dkv<T>(dk, dv, ws_dkv, dka, dva, L.dk, L.dv, b, hk, bhk, key0, t4, T_, split, nsplit,
                 kv_elems, scale);
}

/* ---- host side ------------------------------------------------------------------------------ */

static int g_force_fwd = -1, g_force_bwd = -1;

extern "C" void attn_sm90_force(int fwd, int bwd) {
    g_force_fwd = fwd;
    g_force_bwd = bwd;
}

/* Compute capability 9.0 exactly (the sm_90a code runs nowhere else); cached per device. */
static int device_is_sm90(void) {
    static int cache[64]; /* 0 unknown, 1 yes, 2 no */
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return 0;
    if (!cache[dev]) {
        int ma = 0, mi = 0;
        cudaDeviceGetAttribute(&ma, cudaDevAttrComputeCapabilityMajor, dev);
        cudaDeviceGetAttribute(&mi, cudaDevAttrComputeCapabilityMinor, dev);
        cache[dev] = (ma == 9 && mi == 0) ? 1 : 2;
    }
    return cache[dev] == 1;
}

static int supported(int64_t Dh, zr_dtype dt) {
    return Dh == 64 && (dt == ZR_BF16 || dt == ZR_F16) && device_is_sm90();
}

extern "C" int attn_sm90_fwd_ok(int64_t Dh, zr_dtype dt) {
    return g_force_fwd != 0 && supported(Dh, dt) && attn_sm90_fwd_tma_ready();
}
extern "C" int attn_sm90_bwd_ok(int64_t Dh, zr_dtype dt) {
    return g_force_bwd != 0 && supported(Dh, dt);
}

extern "C" int attn_sm90_bwd_nsplit(int64_t B, int64_t Hkv, int64_t G, int64_t T) {
    const int64_t blocks = B * Hkv * ((T + B_BN - 1) / B_BN);
    int ns = 1;
    while (G % (ns * 2) == 0 && blocks * ns < 200)
        ns *= 2;
    return ns;
}

template <typename T>
static void bwd_launch(void *dk, void *dv, float *wkv, float *dqacc, const void *dout,
                       const void *q, const void *k, const void *v, const float *lse,
                       const float *Dd, const zr_attn_layout &L, int64_t B, int64_t Hq,
                       int64_t Hkv, int64_t T_, int ns, int64_t nkv, float scale, cudaStream_t st) {
    const int smem = (2 * B_BN * 64 + 4 * B_BM * 64 + 2 * B_BN * 64) * 2 + 4 * B_BM * 4 + 1024;
    auto kern = attn_bwd_sm90_kernel<T>;
    cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    dim3 grid((unsigned)(B * Hkv * ns), (unsigned)((T_ + B_BN - 1) / B_BN));
    kern<<<grid, NTHR, smem, st>>>((uint16_t *)dk, (uint16_t *)dv, wkv, dqacc,
                                   (const uint16_t *)dout, (const uint16_t *)q, (const uint16_t *)k,
                                   (const uint16_t *)v, lse, Dd, L, (int)T_, (int)Hq,
                                   (int)(Hq / Hkv), ns, nkv, scale, scale * LOG2E);
}

extern "C" void attn_sm90_backward(void *dk, void *dv, float *wkv, float *dqacc, const void *dout,
                                   const void *q, const void *k, const void *v, const float *lse,
                                   const float *Dd, const zr_attn_layout *L, int64_t B, int64_t Hq,
                                   int64_t Hkv, int64_t T, int ns, int64_t nkv, float scale,
                                   zr_dtype dt, cudaStream_t st) {
    if (dt == ZR_BF16)
        bwd_launch<__nv_bfloat16>(dk, dv, wkv, dqacc, dout, q, k, v, lse, Dd, *L, B, Hq, Hkv, T,
                                  ns, nkv, scale, st);
    else
        bwd_launch<__half>(dk, dv, wkv, dqacc, dout, q, k, v, lse, Dd, *L, B, Hq, Hkv, T, ns, nkv,
                           scale, st);
}
