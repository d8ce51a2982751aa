/* Causal GQA flash attention for Hopper (sm_90a): wgmma m64n64k16 (f32 accumulate) with Q, P,
 * K, V and dS^T as A operands from registers and K, V, Q, dO, dS from 128-byte-swizzled shared
 * memory; cp.async multi-stage loads. head_dim 64, bf16/f16. Forward: 128 queries per block (64
 * per warpgroup), 64-key tiles. Backward: 128 keys per block (64 per warpgroup), 128-query steps
 * over the kv head's query group; dQ through f32 atomics. sm_90a only (see Makefile). */
#include "attention_sm90.h"

#include <math.h>

#include "attention_sm90.cuh"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "attention_sm90.cu needs -gencode arch=compute_90a,code=sm_90a (wgmma)"
#endif

using namespace sm90;

#define F_BM 128 /* forward: queries per block */
#define F_BN 64  /* forward: keys per tile */
#define F_ST 4   /* forward: K/V pipeline stages */
#define B_BN 128 /* backward: keys per block */
#define B_BM 128 /* backward: queries per step */
#define NTHR 256 /* two warpgroups */
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

static __device__ __forceinline__ uint16_t *align1024(uint8_t *p) {
    return (uint16_t *)(p + ((1024 - (smem_u32(p) & 1023)) & 1023));
}

/* ---- forward -------------------------------------------------------------------------------- */

/* Online-softmax step on a warpgroup's 64×64 tile of raw scores s (accumulator layout: this
 * thread's rows qrow, qrow + 8; columns key0 + 8*nt + {0, 1}): masks keys after the row when diag,
 * raises the running row maxima m0, m1 (raw score units), turns s into P = 2^((s − m)·sl) and
 * returns the factors al that rescale the old O and l, and this tile's partial row sums rs. */
static __device__ __forceinline__ void softmax_tile(float (&s)[32], float &m0, float &m1,
                                                    float &al0, float &al1, float &rs0, float &rs1,
                                                    bool diag, int key0, int qrow, float sl) {
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
        if (diag) {
#pragma unroll
            for (int e = 0; e < 4; ++e)
                if (key0 + nt * 8 + (e & 1) > qrow + (e >> 1) * 8) s[4 * nt + e] = -INFINITY;
        }
        mx0 = fmaxf(mx0, fmaxf(s[4 * nt], s[4 * nt + 1]));
        mx1 = fmaxf(mx1, fmaxf(s[4 * nt + 2], s[4 * nt + 3]));
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    /* finite: the first key of every processed tile is <= each row of the warpgroup */
    const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
    al0 = ex2((m0 - mn0) * sl);
    al1 = ex2((m1 - mn1) * sl);
    m0 = mn0;
    m1 = mn1;
    const float b0 = mn0 * sl, b1 = mn1 * sl;
    rs0 = rs1 = 0.f;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
        s[4 * nt] = ex2(fmaf(s[4 * nt], sl, -b0));
        s[4 * nt + 1] = ex2(fmaf(s[4 * nt + 1], sl, -b0));
        s[4 * nt + 2] = ex2(fmaf(s[4 * nt + 2], sl, -b1));
        s[4 * nt + 3] = ex2(fmaf(s[4 * nt + 3], sl, -b1));
        rs0 += s[4 * nt] + s[4 * nt + 1];
        rs1 += s[4 * nt + 2] + s[4 * nt + 3];
    }
}

/* grid: x = b*Hq + h, y = query tile counted from the last (heaviest first). Warpgroup w owns
 * query rows 64w..64w+63 of the block's 128. The PV product of key tile j − 1 runs on the tensor
 * cores while tile j's softmax runs (issued right after tile j's QK^T); K/V go through 4 stages,
 * so V of tile j − 1 stays while tile j + 2 loads. */
template <typename T>
__global__ void __launch_bounds__(NTHR, 2)
    attn_fwd_sm90_kernel(uint16_t *__restrict__ o, float *__restrict__ lse,
                         const uint16_t *__restrict__ q, const uint16_t *__restrict__ k,
                         const uint16_t *__restrict__ v, int T_, int Hq, int G, float scale_log2) {
    extern __shared__ uint8_t smem_raw[];
    uint16_t *sQ = align1024(smem_raw);
    uint16_t *sK = sQ + F_BM * 64, *sV = sK + F_ST * F_BN * 64;
    const int nQt = (T_ + F_BM - 1) / F_BM;
    const int qt = nQt - 1 - (int)blockIdx.y;
    const int bh = blockIdx.x, b = bh / Hq, h = bh % Hq, Hkv = Hq / G;
    const size_t kvoff = (size_t)(b * Hkv + h / G) * T_ * 64;
    const uint16_t *qb = q + (size_t)bh * T_ * 64, *kb = k + kvoff, *vb = v + kvoff;
    const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
    const int g = lane >> 2, t4 = lane & 3;
    const int q0 = qt * F_BM, wrow0 = q0 + wg * 64, wlast = wrow0 + 63;
    const int nkv = (min(T_, q0 + F_BM) + F_BN - 1) / F_BN;
    const int jmax = min(nkv - 1, wlast / F_BN); /* last tile with a key <= this warpgroup's rows */

    load_tile<F_BM, NTHR>(sQ, qb, q0, T_, tid);
    load_tile<F_BN, NTHR>(sK, kb, 0, T_, tid);
    load_tile<F_BN, NTHR>(sV, vb, 0, T_, tid);
    cp_async_commit();
    if (nkv > 1) {
        load_tile<F_BN, NTHR>(sK + F_BN * 64, kb, F_BN, T_, tid);
        load_tile<F_BN, NTHR>(sV + F_BN * 64, vb, F_BN, T_, tid);
    }
    cp_async_commit();

    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
    float acc[32];
#pragma unroll
    for (int i = 0; i < 32; ++i)
        acc[i] = 0.f;
    uint32_t qf[4][4], pf[4][4];
#pragma unroll
    for (int kc = 0; kc < 4; ++kc)
        pf[kc][0] = pf[kc][1] = pf[kc][2] = pf[kc][3] = 0u;
    const int qrow = wrow0 + warp * 16 + g; /* this thread's rows: qrow, qrow + 8 */

    for (int j = 0; j < nkv; ++j) {
        cp_async_wait<1>();
        fence_proxy_async();
        __syncthreads(); /* tile j visible to all; everyone is done with tile j - 2 */
        if (j == 0) {
#pragma unroll
            for (int kk = 0; kk < 4; ++kk)
                lds_a(qf[kk], sQ, wg * 64 + warp * 16, kk * 16, lane);
        }
        if (j + 2 < nkv) {
            const int ns = (j + 2) % F_ST;
            load_tile<F_BN, NTHR>(sK + ns * F_BN * 64, kb, (j + 2) * F_BN, T_, tid);
            load_tile<F_BN, NTHR>(sV + ns * F_BN * 64, vb, (j + 2) * F_BN, T_, tid);
        }
        cp_async_commit();
        if (j > jmax) continue;
        const uint32_t ka = smem_u32(sK + (j % F_ST) * F_BN * 64);
        /* V of tile j − 1; at j = 0 tile 0's (P is still 0 then, so the product adds nothing). */
        const uint32_t vp = smem_u32(sV + (j ? (j + F_ST - 1) % F_ST : 0) * F_BN * 64);

        float s[32];
#pragma unroll
        for (int i = 0; i < 32; ++i)
            s[i] = 0.f;
        reg_fence(s);
        reg_fence(acc);
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
            wg_rs64<T, 0>(s, qf[kk], desc128(ka + kk * 32), 1);
        wg_commit();
#pragma unroll
        for (int kc = 0; kc < 4; ++kc)
            wg_rs64<T, 1>(acc, pf[kc], desc128(vp + kc * 2048), 1);
        wg_commit();
        wg_wait<1>(); /* QK^T done; PV may still run */
        reg_fence(s);
        float al0, al1, rs0, rs1;
        softmax_tile(s, m0, m1, al0, al1, rs0, rs1, j * F_BN + F_BN - 1 > wrow0, j * F_BN + t4 * 2,
                     qrow, scale_log2);
        wg_wait<0>();
        reg_fence(acc);
        reg_fence(pf);
        l0 = l0 * al0 + rs0;
        l1 = l1 * al1 + rs1;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            acc[4 * i] *= al0;
            acc[4 * i + 1] *= al0;
            acc[4 * i + 2] *= al1;
            acc[4 * i + 3] *= al1;
        }
#pragma unroll
        for (int kc = 0; kc < 4; ++kc) {
            pf[kc][0] = cvt<T>::pack(s[8 * kc], s[8 * kc + 1]);
            pf[kc][1] = cvt<T>::pack(s[8 * kc + 2], s[8 * kc + 3]);
            pf[kc][2] = cvt<T>::pack(s[8 * kc + 4], s[8 * kc + 5]);
            pf[kc][3] = cvt<T>::pack(s[8 * kc + 6], s[8 * kc + 7]);
        }
    }
    { /* PV of the last tile */
        const uint32_t vl = smem_u32(sV + (jmax % F_ST) * F_BN * 64);
        reg_fence(acc);
        wg_fence();
#pragma unroll
        for (int kc = 0; kc < 4; ++kc)
            wg_rs64<T, 1>(acc, pf[kc], desc128(vl + kc * 2048), 1);
        wg_commit();
        wg_wait<0>();
        reg_fence(acc);
    }

    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    const float i0 = 1.f / l0, i1 = 1.f / l1;
    const int r0 = wg * 64 + warp * 16 + g;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
        const int c = nt * 8 + t4 * 2;
        *reinterpret_cast<uint32_t *>(sQ + swz(r0, c)) =
            cvt<T>::pack(acc[4 * nt] * i0, acc[4 * nt + 1] * i0);
        *reinterpret_cast<uint32_t *>(sQ + swz(r0 + 8, c)) =
            cvt<T>::pack(acc[4 * nt + 2] * i1, acc[4 * nt + 3] * i1);
    }
    if (t4 == 0) {
        if (qrow < T_) lse[(size_t)bh * T_ + qrow] = (m0 * scale_log2 + log2f(l0)) * LN2;
        if (qrow + 8 < T_) lse[(size_t)bh * T_ + qrow + 8] = (m1 * scale_log2 + log2f(l1)) * LN2;
    }
    __syncwarp();
    uint16_t *ob = o + (size_t)bh * T_ * 64;
#pragma unroll
    for (int c = lane; c < 16 * 8; c += 32) {
        const int row = wg * 64 + warp * 16 + (c >> 3), ch = c & 7;
        const int gr = q0 + row;
        if (gr < T_)
            *reinterpret_cast<uint4 *>(ob + (size_t)gr * 64 + ch * 8) =
                *reinterpret_cast<const uint4 *>(sQ + row * 64 + ((ch ^ (row & 7)) << 3));
    }
}

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
                         const float *__restrict__ lse, const float *__restrict__ Dd, int T_,
                         int Hq, int G, int nsplit, int64_t kv_elems, float scale,
                         float scale_log2) {
    extern __shared__ uint8_t smem_raw[];
    uint16_t *sK = align1024(smem_raw);
    uint16_t *sV = sK + B_BN * 64, *sQ = sV + B_BN * 64;
    uint16_t *sdO = sQ + 2 * B_BM * 64, *sdS = sdO + 2 * B_BM * 64;
    float *sL = reinterpret_cast<float *>(sdS + B_BN * B_BM), *sDd = sL + 2 * B_BM;

    const int nT = (T_ + B_BM - 1) / B_BM;
    const int j = blockIdx.y, kv0 = j * B_BN;
    const int split = blockIdx.x % nsplit, bhk = blockIdx.x / nsplit;
    const int Hkv = Hq / G, b = bhk / Hkv;
    const int Gs = G / nsplit, h0 = (bhk % Hkv) * G + split * Gs;
    const int nq = nT - j, niter = Gs * nq;
    const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
    const int g = lane >> 2, t4 = lane & 3;

    const size_t kvoff = (size_t)bhk * T_ * 64;
    load_tile<B_BN, NTHR>(sK, k + kvoff, kv0, T_, tid);
    load_tile<B_BN, NTHR>(sV, v + kvoff, kv0, T_, tid);

    /* Issues the loads of iteration it into buffer it & 1. */
    auto prefetch = [&](int it) {
        const int h = h0 + it / nq, i = j + it % nq, buf = it & 1;
        const size_t qoff = ((size_t)b * Hq + h) * T_ * 64;
        load_tile<B_BM, NTHR>(sQ + buf * B_BM * 64, q + qoff, i * B_BM, T_, tid);
        load_tile<B_BM, NTHR>(sdO + buf * B_BM * 64, dout + qoff, i * B_BM, T_, tid);
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
            float st[32], dpt[32];
#pragma unroll
            for (int n = 0; n < 32; ++n)
                st[n] = dpt[n] = 0.f;
            reg_fence(st);
            reg_fence(dpt);
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < 4; ++kk)
                wg_rs64<T, 0>(st, kf[kk], desc128(aQ + hh * 64 * 128 + kk * 32), 1);
            wg_commit();
#pragma unroll
            for (int kk = 0; kk < 4; ++kk)
                wg_rs64<T, 0>(dpt, vf[kk], desc128(adO + hh * 64 * 128 + kk * 32), 1);
            wg_commit();
            /* P^T (rows are keys, columns queries), computed while dP^T may still run. */
            wg_wait<1>();
            reg_fence(st);
            if (hh == 1) { /* the dV/dK products of half 0 are done with these now */
                reg_fence(pf[0]);
                reg_fence(sf[0]);
            }
#pragma unroll
            for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int ql = hh * 64 + nt * 8 + t4 * 2 + (e & 1);
                    const float lq = cL[ql] * LOG2E;
                    float p = ex2(fmaf(st[4 * nt + e], scale_log2, -lq));
                    if (diag && key0 + (e >> 1) * 8 > i * B_BM + ql) p = 0.f;
                    st[4 * nt + e] = p;
                }
            }
            wg_wait<0>();
            reg_fence(dpt);
            /* dS^T = P^T ∘ (dP^T − D) */
#pragma unroll
            for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int ql = hh * 64 + nt * 8 + t4 * 2 + (e & 1);
                    dpt[4 * nt + e] = st[4 * nt + e] * (dpt[4 * nt + e] - cD[ql]);
                }
            }
            uint16_t *sS = sdS + hh * B_BN * 64; /* [key][query of this half] */
            const int r = wg * 64 + warp * 16 + g;
#pragma unroll
            for (int kc = 0; kc < 4; ++kc) {
                pf[hh][kc][0] = cvt<T>::pack(st[8 * kc], st[8 * kc + 1]);
                pf[hh][kc][1] = cvt<T>::pack(st[8 * kc + 2], st[8 * kc + 3]);
                pf[hh][kc][2] = cvt<T>::pack(st[8 * kc + 4], st[8 * kc + 5]);
                pf[hh][kc][3] = cvt<T>::pack(st[8 * kc + 6], st[8 * kc + 7]);
                sf[hh][kc][0] = cvt<T>::pack(dpt[8 * kc], dpt[8 * kc + 1]);
                sf[hh][kc][1] = cvt<T>::pack(dpt[8 * kc + 2], dpt[8 * kc + 3]);
                sf[hh][kc][2] = cvt<T>::pack(dpt[8 * kc + 4], dpt[8 * kc + 5]);
                sf[hh][kc][3] = cvt<T>::pack(dpt[8 * kc + 6], dpt[8 * kc + 7]);
                const int c0 = kc * 16 + t4 * 2;
                *reinterpret_cast<uint32_t *>(sS + swz(r, c0)) = sf[hh][kc][0];
                *reinterpret_cast<uint32_t *>(sS + swz(r + 8, c0)) = sf[hh][kc][1];
                *reinterpret_cast<uint32_t *>(sS + swz(r, c0 + 8)) = sf[hh][kc][2];
                *reinterpret_cast<uint32_t *>(sS + swz(r + 8, c0 + 8)) = sf[hh][kc][3];
            }
            reg_fence(dva);
            reg_fence(dka);
            wg_fence();
#pragma unroll
            for (int kc = 0; kc < 4; ++kc)
                wg_rs64<T, 1>(dva, pf[hh][kc], desc128(adO + (hh * 64 + kc * 16) * 128), 1);
#pragma unroll
            for (int kc = 0; kc < 4; ++kc)
                wg_rs64<T, 1>(dka, sf[hh][kc], desc128(aQ + (hh * 64 + kc * 16) * 128), 1);
            wg_commit(); /* left in flight: the next wait covers it */
        }
        fence_proxy_async();
        float *dqb = dqacc + ((size_t)b * Hq + h) * T_ * 64;
        __syncthreads(); /* both halves of dS^T written */

        /* dQ rows i*128 + wg*64 .. +63: dS (64 queries × 128 keys) · K (128 keys × 64). */
        float dq[32];
#pragma unroll
        for (int n = 0; n < 32; ++n)
            dq[n] = 0.f;
        reg_fence(dq);
        wg_fence();
        const uint32_t aS = smem_u32(sdS + wg * B_BN * 64);
#pragma unroll
        for (int kc = 0; kc < 8; ++kc)
            wg_ss64<T, 1, 1>(dq, desc128(aS + kc * 2048), desc128(aK + kc * 2048), 1);
        wg_commit();
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

    /* Epilogue: rows key0, key0 + 8 of this kv head. */
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
        const int c = nt * 8 + t4 * 2;
#pragma unroll
        for (int hlf = 0; hlf < 2; ++hlf) {
            const int key = key0 + hlf * 8;
            if (key >= T_) continue;
            const size_t off = kvoff + (size_t)key * 64 + c;
            const int e = 4 * nt + 2 * hlf;
            if (nsplit == 1) {
                *reinterpret_cast<uint32_t *>(dk + off) =
                    cvt<T>::pack(dka[e] * scale, dka[e + 1] * scale);
                *reinterpret_cast<uint32_t *>(dv + off) = cvt<T>::pack(dva[e], dva[e + 1]);
            } else {
                float *wk = ws_dkv + (size_t)split * kv_elems, *wv = wk + (size_t)nsplit * kv_elems;
                *reinterpret_cast<float2 *>(wk + off) = make_float2(dka[e], dka[e + 1]);
                *reinterpret_cast<float2 *>(wv + off) = make_float2(dva[e], dva[e + 1]);
            }
        }
    }
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
    return g_force_fwd != 0 && supported(Dh, dt);
}
extern "C" int attn_sm90_bwd_ok(int64_t Dh, zr_dtype dt) {
    return g_force_bwd != 0 && supported(Dh, dt);
}

template <typename T>
static void fwd_launch(void *o, float *lse, const void *q, const void *k, const void *v, int64_t B,
                       int64_t Hq, int64_t Hkv, int64_t T_, float scale, cudaStream_t st) {
    const int smem = (F_BM * 64 + 2 * F_ST * F_BN * 64) * 2 + 1024;
    cudaFuncSetAttribute(attn_fwd_sm90_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         smem);
    dim3 grid((unsigned)(B * Hq), (unsigned)((T_ + F_BM - 1) / F_BM));
    attn_fwd_sm90_kernel<T><<<grid, NTHR, smem, st>>>(
        (uint16_t *)o, lse, (const uint16_t *)q, (const uint16_t *)k, (const uint16_t *)v, (int)T_,
        (int)Hq, (int)(Hq / Hkv), scale * LOG2E);
}

extern "C" void attn_sm90_forward(void *o, float *lse, const void *q, const void *k, const void *v,
                                  int64_t B, int64_t Hq, int64_t Hkv, int64_t T, float scale,
                                  zr_dtype dt, cudaStream_t st) {
    if (dt == ZR_BF16)
        fwd_launch<__nv_bfloat16>(o, lse, q, k, v, B, Hq, Hkv, T, scale, st);
    else
        fwd_launch<__half>(o, lse, q, k, v, B, Hq, Hkv, T, scale, st);
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
                       const float *Dd, int64_t B, int64_t Hq, int64_t Hkv, int64_t T_, int ns,
                       int64_t nkv, float scale, cudaStream_t st) {
    const int smem = (2 * B_BN * 64 + 4 * B_BM * 64 + 2 * B_BN * 64) * 2 + 4 * B_BM * 4 + 1024;
    auto kern = attn_bwd_sm90_kernel<T>;
    cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    dim3 grid((unsigned)(B * Hkv * ns), (unsigned)((T_ + B_BN - 1) / B_BN));
    kern<<<grid, NTHR, smem, st>>>((uint16_t *)dk, (uint16_t *)dv, wkv, dqacc,
                                   (const uint16_t *)dout, (const uint16_t *)q, (const uint16_t *)k,
                                   (const uint16_t *)v, lse, Dd, (int)T_, (int)Hq, (int)(Hq / Hkv),
                                   ns, nkv, scale, scale * LOG2E);
}

extern "C" void attn_sm90_backward(void *dk, void *dv, float *wkv, float *dqacc, const void *dout,
                                   const void *q, const void *k, const void *v, const float *lse,
                                   const float *Dd, int64_t B, int64_t Hq, int64_t Hkv, int64_t T,
                                   int ns, int64_t nkv, float scale, zr_dtype dt, cudaStream_t st) {
    if (dt == ZR_BF16)
        bwd_launch<__nv_bfloat16>(dk, dv, wkv, dqacc, dout, q, k, v, lse, Dd, B, Hq, Hkv, T, ns,
                                  nkv, scale, st);
    else
        bwd_launch<__half>(dk, dv, wkv, dqacc, dout, q, k, v, lse, Dd, B, Hq, Hkv, T, ns, nkv,
                           scale, st);
}
