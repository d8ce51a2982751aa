/* Causal GQA flash attention forward for Hopper (sm_90a) at head_dim 128: attention_fwd_sm90.cu's
 * design (a producer warp loading Q and rings of K and V tiles by TMA, two consumer warpgroups of 64
 * queries each, a persistent schedule of 128 x 128 tiles, heaviest first) with every 128-wide row
 * held as two 64-column atoms of the 128-byte swizzle (two TMA boxes a tile). A consumer step runs
 * S = Q·K^T (eight k = 16 steps) issued with the previous step's O += P·V (two m64n64 products a
 * k-step, one an atom of V), and its softmax run while P·V runs: the head_dim-64 kernel's overlap,
 * S, P and O in registers at once (186 a thread, within the consumers' setmaxnreg 240).
 * K and V have rings of their own, K's slot released as soon as S is done, so each load is
 * issued a step or more before it is needed. Shared memory: two Q tiles (64 KB), two K and two V
 * stages (128 KB). bf16/f16; output and lse as the head_dim-64 kernel's (and the mma.sync
 * backward's) conventions. A narrow head_dim W (attn_sm90_narrow: Phi-3's 96) runs the same tiles:
 * its maps are W wide, so TMA fills the second atom's columns past W with zeros (nothing added to
 * q·k; O's columns past W are P times V's zeros), and the epilogue stores W columns a row. At 96
 * (KS = 6) the products skip those columns: S over six k-steps, P·V's second atom n32. */
#include "attention_sm90.h"

#include <cuda.h>

#include "attention_sm90.cuh"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "attention_fwd_sm90_d128.cu needs -gencode arch=compute_90a,code=sm_90a (wgmma)"
#endif

using namespace sm90;

#define F8_B SM90_FWD_TILE        /* queries and keys a tile */
#define F8_ST 2                   /* K stages, and V stages */
#define F8_CONS 256               /* two consumer warpgroups */
#define F8_THR (F8_CONS + 128)    /* + the producer warpgroup (one warp issues, three idle) */
#define F8_PRODUCER (F8_CONS / 32)
#define F8_LOG2E 1.4426950408889634f

/* Shared memory from a 1024-byte boundary: a 128 x 128 tile is two atoms [2][128 rows][64] (16 KB
 * each); two Q tiles, F8_ST K tiles, F8_ST V tiles, then the mbarriers (qfull[2], qempty[2],
 * kfull[F8_ST], kempty[F8_ST], vfull[F8_ST], vempty[F8_ST]). */
struct f8_smem {
    static constexpr int ATOM = F8_B * 64 * 2, TILE = 2 * ATOM; /* bytes */
    static constexpr int Q = 0, K = Q + 2 * TILE, V = K + F8_ST * TILE, BAR = V + F8_ST * TILE;
    static constexpr int BYTES = BAR + 8 * (4 + 4 * F8_ST);
};
static_assert(f8_smem::BYTES <= 227 * 1024, "shared memory over the 227 KB a block may have");

/* The epilogue, per warp: O = acc / l for this thread's rows wr + g, wr + g + 8 (acc[h]: columns
 * 64h.. of the 64 x 128 accumulator) through rows wr.. of the Q tile st (both atoms; no product reads
 * it any more), release() once the warp is done with st, then 16-byte stores to ob (tile row r is
 * query q0 + r, rows ost elements apart; the W columns of a row) and lse = (m·sl + log2 l)·ln 2 to lrow. */
template <typename T, typename F>
static __device__ __forceinline__ void f8_epilogue(const float (&acc)[2][32], float l0, float l1, float m0,
                                                   float m1, float sl, uint16_t *st, int wr, int q0,
                                                   uint16_t *ob, int64_t ost, float *lrow, int T_, int W,
                                                   int lane, F &&release) {
    const int g = lane >> 2, t4 = lane & 3, r0 = wr + g, qrow = q0 + r0;
    quad_sums(l0, l1);
    const float i0 = 1.f / l0, i1 = 1.f / l1;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        uint16_t *sa = st + h * (f8_smem::ATOM / 2);
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
            const int c = nt * 8 + t4 * 2;
            *reinterpret_cast<uint32_t *>(sa + swz(r0, c)) =
                cvt<T>::pack(acc[h][4 * nt] * i0, acc[h][4 * nt + 1] * i0);
            *reinterpret_cast<uint32_t *>(sa + swz(r0 + 8, c)) =
                cvt<T>::pack(acc[h][4 * nt + 2] * i1, acc[h][4 * nt + 3] * i1);
        }
    }
    __syncwarp();
    uint4 v[8]; /* 16 rows x 16 chunks of 16 bytes, 8 a lane */
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int c = lane + 32 * i, row = wr + (c >> 4), ch = c & 15;
        v[i] = *reinterpret_cast<const uint4 *>(st + (ch >> 3) * (f8_smem::ATOM / 2) + row * 64 +
                                                (((ch & 7) ^ (row & 7)) << 3));
    }
    release();
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int c = lane + 32 * i, row = wr + (c >> 4), ch = c & 15, gr = q0 + row;
        if (gr < T_ && ch * 8 < W) /* a narrow head_dim's chunks past W: zeros, never stored */
            asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"l"(ob + gr * ost + ch * 8),
                         "r"(v[i].x), "r"(v[i].y), "r"(v[i].z), "r"(v[i].w)
                         : "memory");
    }
    store_lse(lrow, qrow, T_, t4, m0, m1, l0, l1, sl);
}

/* Roles and counters as attention_fwd_sm90.cu's kernel (its comment): n the block's tile count (Q
 * buffer n % 2), j = kv + it the ring load of key step it (K and V stage j % F8_ST, phase
 * (j / F8_ST) & 1).
 *   producer warp, lane 0, per tile: waits qempty[n % 2] (n >= 2), loads Q (two boxes, qfull);
 *     per key step waits kempty (j >= F8_ST), loads K (kfull), waits vempty, loads V (vfull).
 *   consumer warpgroup w, per tile: waits qfull; per key step waits kfull, S = Q·K^T, releases K
 *     (kempty: one arrival a warp), the softmax (the diagonal first, masked) with O and l
 *     rescaled, P packed, waits vfull, O += P·V, releases V (vempty); the epilogue through the Q
 *     buffer, which goes back to the producer (qempty) before O's global stores.
 * No deadlock: the producer's waits need only releases of loads two or more behind the one it
 * issues, which the consumers make without waiting for anything later in the producer's order. */
/* KS: the k-steps of S = Q·K^T that carry data, ceil(W / 16) (8 at 128; 6 at Phi-3's 96, whose last two
 * k-steps are TMA's zero columns); 16·KS the columns of O that do (P·V's second atom n32 at 96) */
template <typename T, bool VL, int KS>
__global__ void __launch_bounds__(F8_THR, 1)
    attn_fwd_sm90_d128_kernel(uint16_t *__restrict__ o, float *__restrict__ lse,
                              const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
                              const __grid_constant__ CUtensorMap tv, zr_attn_strides so,
                              const int32_t *__restrict__ seg, int T_, int B, int Hq, int G, int W,
                              float scale_log2) {
    static_assert(KS == 8 || KS == 6, "head_dim 128, or 96's six k-steps");
    constexpr int N2 = 16 * KS - 64; /* the columns of V's second atom that carry data */
    ZR_SMEM_1024(base);
    constexpr int AE = f8_smem::ATOM / 2, TE = f8_smem::TILE / 2; /* elements of an atom, a tile */
    uint16_t *sQ = reinterpret_cast<uint16_t *>(base + f8_smem::Q);
    uint16_t *sK = reinterpret_cast<uint16_t *>(base + f8_smem::K);
    uint16_t *sV = reinterpret_cast<uint16_t *>(base + f8_smem::V);
    uint64_t *qfull = reinterpret_cast<uint64_t *>(base + f8_smem::BAR);
    uint64_t *qempty = qfull + 2, *kfull = qempty + 2, *kempty = kfull + F8_ST;
    uint64_t *vfull = kempty + F8_ST, *vempty = vfull + F8_ST;

    const int nQt = (T_ + F8_B - 1) / F8_B, BH = B * Hq, ntiles = BH * nQt;
    const int tid = threadIdx.x, warp_id = tid >> 5, lane = tid & 31;
    if ((int)blockIdx.x >= ntiles) return;
    if (tid == 0) {
        mbar_init_ring(qfull, qempty, 2, F8_CONS / 32);
        mbar_init_ring(kfull, kempty, F8_ST, F8_CONS / 32);
        mbar_init_ring(vfull, vempty, F8_ST, F8_CONS / 32);
        mbar_init_fence();
    }
    __syncthreads();

    if (warp_id >= F8_PRODUCER) {
        reg_dealloc<24>();
        if (warp_id == F8_PRODUCER && lane == 0) {
            unsigned j = 0;
            for (int n = 0, t = fwd_tile_id(0); t < ntiles; t = fwd_tile_id(++n)) {
                const fwd_tile w(t, BH, nQt, Hq);
                const unsigned qb = n & 1;
                if (n >= 2) mbar_wait(&qempty[qb], ((n >> 1) - 1) & 1);
                mbar_expect_tx(&qfull[qb], f8_smem::TILE);
                for (int h = 0; h < 2; ++h)
                    tma_load4(sQ + qb * TE + h * AE, &tq, &qfull[qb], 64 * h, w.qt * F8_B, w.h, w.b);
                const int kt0 = VL ? fwd_first_key_tile(seg, w.b, w.qt, T_) : 0;
                for (int kt = w.qt; kt >= kt0; --kt, ++j) {
                    const unsigned s = j % F8_ST, ph = ((j / F8_ST) - 1) & 1;
                    if (j >= F8_ST) mbar_wait(&kempty[s], ph);
                    mbar_expect_tx(&kfull[s], f8_smem::TILE);
                    for (int h = 0; h < 2; ++h)
                        tma_load4(sK + s * TE + h * AE, &tk, &kfull[s], 64 * h, kt * F8_B, w.h / G, w.b);
                    if (j >= F8_ST) mbar_wait(&vempty[s], ph);
                    mbar_expect_tx(&vfull[s], f8_smem::TILE);
                    for (int h = 0; h < 2; ++h)
                        tma_load4(sV + s * TE + h * AE, &tv, &vfull[s], 64 * h, kt * F8_B, w.h / G, w.b);
                }
            }
        }
        return;
    }
    reg_alloc<240>();

    const int wg = warp_id >> 2, warp = warp_id & 3, g = lane >> 2, t4 = lane & 3;
    unsigned kv = 0;
    for (int n = 0, t = fwd_tile_id(0); t < ntiles; t = fwd_tile_id(++n)) {
        const fwd_tile w(t, BH, nQt, Hq);
        const int qt = w.qt, q0 = qt * F8_B;
        const int nkv = qt + 1 - (VL ? fwd_first_key_tile(seg, w.b, qt, T_) : 0);
        uint16_t *sQb = sQ + (n & 1) * TE;
        const int qrow = q0 + wg * 64 + warp * 16 + g;
        int lo0 = 0, lo1 = 0;
        if (VL) rows_lo(seg, w.b, qrow, T_, lo0, lo1);
        const int lomax = lo0 > lo1 ? lo0 : lo1;
        /* this warpgroup's 64 rows of each Q atom */
        const sdesc dq0(smem_u32(sQb + wg * 64 * 64));
        float m0 = -INFINITY, m1 = -INFINITY, l0, l1, al0, al1, rs0, rs1;
        float acc[2][32], sc[64];
        uint32_t pf[8][4];
#pragma unroll
        for (int i = 0; i < 32; ++i) acc[0][i] = acc[1][i] = 0.f;
        auto issue_s = [&](unsigned st_) { /* sc = Q·K^T over the KS k-steps, K of stage st_ */
            const sdesc dk0(smem_u32(sK + st_ * TE));
#pragma unroll
            for (int kk = 0; kk < KS; ++kk) { /* k-step kk: columns 16kk.. of Q and K, atom kk / 4 */
                const uint32_t off = (kk >> 2) * f8_smem::ATOM + (kk & 3) * 32;
                wg_ss128<T>(sc, dq0.at(off), dk0.at(off), kk);
            }
            wg_commit();
        };
        auto issue_pv = [&](unsigned st_) { /* acc += P·V, V of stage st_: each atom's 64 columns
                                              * (the second's first N2) */
            const sdesc dv0(smem_u32(sV + st_ * TE));
#pragma unroll
            for (int kc = 0; kc < 8; ++kc) {
                wg_rs64<T, 1>(acc[0], pf[kc], dv0.at(kc * 2048), 1);
                if constexpr (N2 == 64) wg_rs64<T, 1>(acc[1], pf[kc], dv0.at(f8_smem::ATOM + kc * 2048), 1);
                else wg_rs32<T, 1>(acc[1], pf[kc], dv0.at(f8_smem::ATOM + kc * 2048), 1);
            }
            wg_commit();
        };
        auto rescale = [&]() { /* O and l by the step's factors, then l += the step's row sums */
            fwd_rescale(acc[0], l0, l1, al0, al1, rs0, rs1);
#pragma unroll
            for (int i = 0; i < N2 / 8; ++i) { /* past N2: zeros */
                acc[1][4 * i] *= al0;
                acc[1][4 * i + 1] *= al0;
                acc[1][4 * i + 2] *= al1;
                acc[1][4 * i + 3] *= al1;
            }
        };
        mbar_wait(&qfull[n & 1], (n >> 1) & 1);
        { /* step 0: the diagonal tile (load kv) */
            const unsigned s0 = kv % F8_ST;
            mbar_wait(&kfull[s0], (kv / F8_ST) & 1);
            wg_fence();
            issue_s(s0);
            wg_wait<0>();
            reg_fence(sc);
            if (lane == 0) mbar_arrive(&kempty[s0]);
            if (VL && qt * F8_B < lomax) mask_before<16>(sc, qt * F8_B + t4 * 2, lo0, lo1);
            softmax_step<16>(sc, m0, m1, al0, al1, rs0, rs1, true, qt * F8_B + t4 * 2, qrow, scale_log2);
            l0 = rs0;
            l1 = rs1;
            pack_a<T, 8>(pf, sc);
        }
        /* step it: S of load j = kv + it under the previous load's P·V, its softmax while P·V runs */
        for (int it = 1; it < nkv; ++it) {
            const unsigned j = kv + it, s = j % F8_ST, sp = (j - 1) % F8_ST;
            mbar_wait(&kfull[s], (j / F8_ST) & 1);
            mbar_wait(&vfull[sp], ((j - 1) / F8_ST) & 1);
            reg_fence(acc[0]);
            reg_fence(acc[1]);
            reg_fence(pf);
            wg_fence();
            issue_s(s);
            issue_pv(sp);
            wg_wait<1>(); /* S done; P·V may still run */
            reg_fence(sc);
            if (lane == 0) mbar_arrive(&kempty[s]);
            const int key0 = (qt - it) * F8_B;
            if (VL && key0 < lomax) mask_before<16>(sc, key0 + t4 * 2, lo0, lo1);
            softmax_step<16>(sc, m0, m1, al0, al1, rs0, rs1, false, 0, qrow, scale_log2);
            /* the head_dim-64 kernel's pin (the softmax before the P·V wait: row sums are never negative),
             * with a sleep in place of its trap: a trap's exit block made ptxas spill 200 bytes and serialise
             * the wgmma here (C7512), the sleep neither (186 registers under setmaxnreg 240) */
            if ((__float_as_uint(rs0) | __float_as_uint(rs1)) >> 31) asm volatile("nanosleep.u32 0;");
            wg_wait<0>();
            reg_fence(acc[0]);
            reg_fence(acc[1]);
            reg_fence(pf);
            if (lane == 0) mbar_arrive(&vempty[sp]);
            rescale();
            pack_a<T, 8>(pf, sc);
        }
        { /* P·V of the last load */
            const unsigned jl = kv + nkv - 1, sl = jl % F8_ST;
            mbar_wait(&vfull[sl], (jl / F8_ST) & 1);
            reg_fence(acc[0]);
            reg_fence(acc[1]);
            reg_fence(pf);
            wg_fence();
            issue_pv(sl);
            wg_wait<0>();
            reg_fence(acc[0]);
            reg_fence(acc[1]);
            if (lane == 0) mbar_arrive(&vempty[sl]);
        }
        f8_epilogue<T>(acc, l0, l1, m0, m1, scale_log2, sQb, wg * 64 + warp * 16, q0,
                       o + w.b * so.sb + w.h * so.sh, so.st, lse + ((size_t)w.b * Hq + w.h) * T_, T_, W, lane,
                       [&]() {
                           fence_proxy_async();
                           __syncwarp();
                           if (lane == 0) mbar_arrive(&qempty[n & 1]);
                       });
        kv += nkv;
    }
}

/* ---- host side ------------------------------------------------------------------------------ */

template <typename T>
static int fwd128_launch(void *o, float *lse, const void *q, const void *k, const void *v, const zr_attn_layout &L,
                         int64_t B, int64_t Hq, int64_t Hkv, int64_t T_, int64_t Dh, float scale, zr_dtype dt,
                         cudaStream_t st) {
    CUtensorMap mq, mk, mv; /* Dh wide: a narrow head_dim's second box zero-filled past Dh */
    if (attn_sm90_head_map(&mq, q, &L.q, B, Hq, T_, Dh, F8_B, dt) ||
        attn_sm90_head_map(&mk, k, &L.k, B, Hkv, T_, Dh, F8_B, dt) ||
        attn_sm90_head_map(&mv, v, &L.v, B, Hkv, T_, Dh, F8_B, dt))
        return -1;
    auto kern = Dh == 96 ? (L.seg ? attn_fwd_sm90_d128_kernel<T, true, 6> : attn_fwd_sm90_d128_kernel<T, false, 6>)
                         : (L.seg ? attn_fwd_sm90_d128_kernel<T, true, 8> : attn_fwd_sm90_d128_kernel<T, false, 8>);
    cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, f8_smem::BYTES);
    const int grid = attn_sm90_blocks(0, B * Hq * ((T_ + F8_B - 1) / F8_B));
    kern<<<grid, F8_THR, f8_smem::BYTES, st>>>((uint16_t *)o, lse, mq, mk, mv, L.o, L.seg, (int)T_, (int)B, (int)Hq,
                                               (int)(Hq / Hkv), (int)Dh, scale * F8_LOG2E);
    return 0;
}

extern "C" int attn_sm90_forward128(void *o, float *lse, const void *q, const void *k, const void *v,
                                    const zr_attn_layout *L, int64_t B, int64_t Hq, int64_t Hkv, int64_t T,
                                    int64_t Dh, float scale, zr_dtype dt, cudaStream_t st) {
    if (!attn_sm90_tma_ready()) return -1;
    if (dt == ZR_BF16) return fwd128_launch<__nv_bfloat16>(o, lse, q, k, v, *L, B, Hq, Hkv, T, Dh, scale, dt, st);
    return fwd128_launch<__half>(o, lse, q, k, v, *L, B, Hq, Hkv, T, Dh, scale, dt, st);
}
