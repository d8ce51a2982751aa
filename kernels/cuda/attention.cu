/* Causal GQA flash attention, forward and backward, for sm_90 with mma.sync m16n8k16 (bf16/f16
 * in, f32 accumulate) and ldmatrix from XOR-swizzled shared memory, cp.async double buffering.
 * Tiles are 64 queries × 64 keys, 4 warps per block, 16 rows per warp. On compute capability 9.0
 * the wgmma kernels (attention_sm90.h) run instead at 64/128; these are the fallback there, and the only
 * kernels at head_dim 256 (Gemma's: the backward's columns split over two blocks). Here too: the backward's
 * prep and last passes, which both families share (a narrow head_dim's, attn_sm90_narrow, with its
 * accumulators 128 wide). Not here: dropout, non-causal masks, Dh other than 64/128/256.
 * See attention.h for the contract; the tiles and device helpers are attention_mma.cuh. */
#include "attention.h"
#include "attention_sm90.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>

extern "C" {
#include "../base/error.h"
}

#include "attention_mma.cuh"

/* ---- forward -------------------------------------------------------------------------------- */

/* grid: x = b*Hq + h, y = query tile counted from the last (heaviest first). VL: packed sequences,
 * lo (B, T) the first token of each token's sequence (zr_attn_layout.seg): the key tiles from the
 * one holding the tile's first row's sequence start, keys before a row's start masked. */
template <typename T, int D, bool VL>
__global__ void __launch_bounds__(ATT_THREADS)
    attn_fwd_kernel(uint16_t *__restrict__ o, float *__restrict__ lse,
                    const uint16_t *__restrict__ q, const uint16_t *__restrict__ k,
                    const uint16_t *__restrict__ v, const int32_t *__restrict__ lo, int T_, int Hq,
                    int G, float scale_log2) {
    typedef mma_t<T> M;
    extern __shared__ __align__(128) uint16_t smem[];
    uint16_t *sQ = smem, *sK = sQ + ATT_BLK * D, *sV = sK + 2 * ATT_BLK * D;
    const int nT = (T_ + ATT_BLK - 1) / ATT_BLK;
    const int qt = nT - 1 - blockIdx.y;
    const int bh = blockIdx.x, b = bh / Hq, h = bh % Hq, Hkv = Hq / G;
    const size_t kvoff = (size_t)(b * Hkv + h / G) * T_ * D;
    const uint16_t *qb = q + (size_t)bh * T_ * D, *kb = k + kvoff, *vb = v + kvoff;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t4 = lane & 3;

    const int j0 = VL ? lo[(size_t)b * T_ + qt * ATT_BLK] / ATT_BLK : 0;
    load_tile<D>(sQ, qb, qt * ATT_BLK, T_, tid);
    load_tile<D>(sK, kb, j0 * ATT_BLK, T_, tid);
    load_tile<D>(sV, vb, j0 * ATT_BLK, T_, tid);
    cp_async_commit();

    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
    float acc[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; ++i)
        acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
    /* Q's fragments stay in registers up to D = 128; at 256 (with the 128 registers of acc) they
     * would spill, so each k-step reads its fragment from sQ again */
    constexpr bool QREG = D <= 128;
    uint32_t qf[QREG ? D / 16 : 1][4];
    const int qrow = qt * ATT_BLK + warp * 16 + g; /* this thread's rows: qrow, qrow + 8 */
    int lo0 = 0, lo1 = 0; /* VL: the first key of each row's sequence (0 past T) */
    if (VL) {
        if (qrow < T_) lo0 = lo[(size_t)b * T_ + qrow];
        if (qrow + 8 < T_) lo1 = lo[(size_t)b * T_ + qrow + 8];
    }
    const int lomax = lo0 > lo1 ? lo0 : lo1;

    for (int j = j0; j <= qt; ++j) {
        const int jb = j - j0; /* the tile's place in the double buffer's order */
        if (j < qt) {
            const int nb = (jb + 1) & 1;
            load_tile<D>(sK + nb * ATT_BLK * D, kb, (j + 1) * ATT_BLK, T_, tid);
            load_tile<D>(sV + nb * ATT_BLK * D, vb, (j + 1) * ATT_BLK, T_, tid);
        }
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        if (QREG && jb == 0) {
#pragma unroll
            for (int kk = 0; kk < D / 16; ++kk)
                lds_a<D>(qf[kk], sQ, warp * 16, kk * 16, lane);
        }
        const uint16_t *cK = sK + (jb & 1) * ATT_BLK * D, *cV = sV + (jb & 1) * ATT_BLK * D;

        float s[8][4];
#pragma unroll
        for (int i = 0; i < 8; ++i)
            s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            const int qk = QREG ? kk : 0;
            if (!QREG) lds_a<D>(qf[0], sQ, warp * 16, kk * 16, lane);
#pragma unroll
            for (int np = 0; np < 4; ++np) {
                uint32_t bf[4];
                lds_b_nk<D>(bf, cK, np * 16, kk * 16, lane);
                M::mma(s[2 * np], qf[qk], bf[0], bf[1]);
                M::mma(s[2 * np + 1], qf[qk], bf[2], bf[3]);
            }
        }
        float mx0 = -INFINITY, mx1 = -INFINITY;
        const bool diag = (j == qt), before = VL && j * ATT_BLK < lomax;
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                float x = s[nt][e] * scale_log2;
                const int key = j * ATT_BLK + nt * 8 + t4 * 2 + (e & 1);
                if (diag && key > qrow + (e >> 1) * 8) x = -INFINITY;
                if (before && key < ((e >> 1) ? lo1 : lo0)) x = -INFINITY;
                s[nt][e] = x;
            }
            mx0 = fmaxf(mx0, fmaxf(s[nt][0], s[nt][1]));
            mx1 = fmaxf(mx1, fmaxf(s[nt][2], s[nt][3]));
        }
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
        const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
        /* VL: a row may have no key in its first tiles (they start before its sequence): its
         * maximum is still -inf there, and everything of the tile counts 0 */
        const float b0 = VL && mn0 == -INFINITY ? 0.f : mn0, b1 = VL && mn1 == -INFINITY ? 0.f : mn1;
        const float al0 = exp2f(m0 - b0), al1 = exp2f(m1 - b1);
        m0 = mn0;
        m1 = mn1;
        float rs0 = 0.f, rs1 = 0.f;
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
            s[nt][0] = exp2f(s[nt][0] - b0);
            s[nt][1] = exp2f(s[nt][1] - b0);
            s[nt][2] = exp2f(s[nt][2] - b1);
            s[nt][3] = exp2f(s[nt][3] - b1);
            rs0 += s[nt][0] + s[nt][1];
            rs1 += s[nt][2] + s[nt][3];
        }
        l0 = l0 * al0 + rs0;
        l1 = l1 * al1 + rs1;
#pragma unroll
        for (int i = 0; i < D / 8; ++i) {
            acc[i][0] *= al0;
            acc[i][1] *= al0;
            acc[i][2] *= al1;
            acc[i][3] *= al1;
        }
#pragma unroll
        for (int kc = 0; kc < 4; ++kc) {
            uint32_t pf[4];
            pf[0] = M::pack(s[2 * kc][0], s[2 * kc][1]);
            pf[1] = M::pack(s[2 * kc][2], s[2 * kc][3]);
            pf[2] = M::pack(s[2 * kc + 1][0], s[2 * kc + 1][1]);
            pf[3] = M::pack(s[2 * kc + 1][2], s[2 * kc + 1][3]);
#pragma unroll
            for (int dp = 0; dp < D / 16; ++dp) {
                uint32_t bf[4];
                lds_b_kn<D>(bf, cV, kc * 16, dp * 16, lane);
                M::mma(acc[2 * dp], pf, bf[0], bf[1]);
                M::mma(acc[2 * dp + 1], pf, bf[2], bf[3]);
            }
        }
        __syncthreads();
    }

    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    const float i0 = 1.f / l0, i1 = 1.f / l1;
    /* Stage the warp's 16 output rows in sQ (free now), then store 16-byte chunks. */
    const int r0 = warp * 16 + g;
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt) {
        const int c = nt * 8 + t4 * 2;
        *reinterpret_cast<uint32_t *>(sQ + swz<D>(r0, c)) =
            M::pack(acc[nt][0] * i0, acc[nt][1] * i0);
        *reinterpret_cast<uint32_t *>(sQ + swz<D>(r0 + 8, c)) =
            M::pack(acc[nt][2] * i1, acc[nt][3] * i1);
    }
    if (t4 == 0) {
        if (qrow < T_) lse[(size_t)bh * T_ + qrow] = (m0 + log2f(l0)) * ATT_LN2;
        if (qrow + 8 < T_) lse[(size_t)bh * T_ + qrow + 8] = (m1 + log2f(l1)) * ATT_LN2;
    }
    __syncwarp();
    uint16_t *ob = o + (size_t)bh * T_ * D;
#pragma unroll
    for (int c = lane; c < 16 * D / 8; c += 32) {
        const int row = warp * 16 + c / (D / 8), ch = c % (D / 8);
        const int gr = qt * ATT_BLK + row;
        if (gr < T_)
            *reinterpret_cast<uint4 *>(ob + (size_t)gr * D + ch * 8) =
                *reinterpret_cast<const uint4 *>(sQ + row * D + ((ch ^ (row & 7)) << 3));
    }
}

/* ---- backward ------------------------------------------------------------------------------- */

/* Dd[row] = sum_d dO[row, d] * O[row, d] for every (b, h, t) row (D/8 threads per row), and, when
 * nl2 is given (the Hopper backward's form of lse), nl2[row] = −lse[row]·log2 e; the same threads
 * zero that row of the dq accumulator (instead of a separate memset pass). dO and O rows are W <= D
 * wide (a narrow head_dim: the threads past W read nothing), the accumulator's D. */
template <typename T, int D>
__global__ void attn_bwd_prep_kernel(float *__restrict__ Dd, float *__restrict__ nl2,
                                     float *__restrict__ dqacc, const float *__restrict__ lse,
                                     const uint16_t *__restrict__ dout,
                                     const uint16_t *__restrict__ o, zr_attn_strides sdo,
                                     zr_attn_strides so, int dense, int Hq, int T_, int W,
                                     int64_t rows) {
    typedef mma_t<T> M;
    const int per = D / 8;
    const int64_t row = (int64_t)blockIdx.x * (blockDim.x / per) + threadIdx.x / per;
    const int ch = threadIdx.x % per;
    float s = 0.f;
    if (row < rows) {
        int64_t ad = row * W, ao = row * W; /* dense: (B, Hq, T, W) */
        if (!dense) {
            const int64_t bh = row / T_, t = row % T_, b = bh / Hq, h = bh % Hq;
            ad = b * sdo.sb + h * sdo.sh + t * sdo.st, ao = b * so.sb + h * so.sh + t * so.st;
        }
        if (ch * 8 < W) {
            uint4 a = *reinterpret_cast<const uint4 *>(dout + ad + ch * 8);
            uint4 c = *reinterpret_cast<const uint4 *>(o + ao + ch * 8);
            const uint16_t *pa = reinterpret_cast<const uint16_t *>(&a);
            const uint16_t *pc = reinterpret_cast<const uint16_t *>(&c);
#pragma unroll
            for (int e = 0; e < 8; ++e)
                s += M::to_f(pa[e]) * M::to_f(pc[e]);
        }
        float4 *z = reinterpret_cast<float4 *>(dqacc + row * D + ch * 8);
        z[0] = z[1] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int off = per / 2; off > 0; off >>= 1)
        s += __shfl_xor_sync(0xffffffffu, s, off);
    if (row < rows && ch == 0) {
        Dd[row] = s;
        if (nl2) nl2[row] = -lse[row] * 1.4426950408889634f;
    }
}

/* Row r of a position-major order, (t, b·H + h) with BH = B·H rows a position: its position t,
 * its (b, h) as bh = b·H + h, b and h (rows32: r fits 32 bits, so 32-bit divisions). Both
 * conversion kernels below walk strided destinations this way: a warp's stores are adjacent heads
 * of one position. */
struct pm_row {
    int64_t t, bh, b, h;
};
static __device__ __forceinline__ pm_row pos_major(int64_t r, int64_t BH, int H, int rows32) {
    pm_row o;
    if (rows32) {
        const uint32_t q = (uint32_t)r / (uint32_t)BH;
        o.t = q, o.bh = (uint32_t)r - q * (uint32_t)BH;
    } else {
        o.t = r / BH, o.bh = r - o.t * BH;
    }
    o.b = o.bh / H, o.h = o.bh - o.b * H;
    return o;
}

/* Up to three conversions in one launch: dst[i] = T(scale * sum over nsplit partial buffers
 * (spaced split floats apart) of src[i]); src is contiguous (.., H, T, D), dst strided as sd (dense:
 * contiguous too); n4 counts dst's float4s, 0 skips the segment. NW (a narrow head_dim): dst rows
 * are W < D wide (strided, never dense), src's still D. rows32: every row index fits 32 bits
 * (the strided addresses then take 32-bit divisions). A strided dst (the (B, T, H, D) memory of a
 * projection's gradient) is taken position-major, (t, b·H + h, float4), as
 * attn_rope_convert_kernel does: a warp's stores are adjacent heads of one position. */
struct cvt_seg {
    struct {
        uint16_t *dst;
        const float *src;
        int64_t n4, split;
        int nsplit;
        float scale;
        zr_attn_strides sd;
        int H, dense;
    } s[3];
    int T, W, rows32;
};

/* Each thread converts ATT_CVT_U float4s a pass (a grid stride apart: each load still coalesced
 * across the warp), all loads issued before the first store, so that a resident grid keeps enough
 * bytes in flight to run at the memory's rate. */
#define ATT_CVT_U 4
template <typename T, int D, bool NW> __global__ void attn_sum_convert_kernel(cvt_seg segs) {
    typedef mma_t<T> M;
    const int P = NW ? segs.W / 4 : D / 4; /* float4s a dst row */
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
#pragma unroll 1
    for (int k = 0; k < 3; ++k) {
        const auto sg = segs.s[k];
        const int64_t BH = sg.n4 / ((int64_t)segs.T * P);
        for (int64_t i0 = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i0 < sg.n4;
             i0 += ATT_CVT_U * stride) {
            float4 a[ATT_CVT_U];
            uint16_t *dst[ATT_CVT_U];
#pragma unroll
            for (int u = 0; u < ATT_CVT_U; ++u) {
                const int64_t i = i0 + u * stride;
                if (i >= sg.n4) break;
                int64_t e = i * 4; /* src element */
                dst[u] = sg.dst + e;
                if (NW || !sg.dense) {
                    const int col = (int)(i % P) * 4;
                    const pm_row w = pos_major(i / P, BH, sg.H, segs.rows32); /* P: a shift unless NW */
                    e = (w.bh * segs.T + w.t) * D + col;
                    dst[u] = sg.dst + w.b * sg.sd.sb + w.h * sg.sd.sh + w.t * sg.sd.st + col;
                }
                a[u] = *reinterpret_cast<const float4 *>(sg.src + e);
                for (int p = 1; p < sg.nsplit; ++p) {
                    const float4 c = *reinterpret_cast<const float4 *>(sg.src + e + p * sg.split);
                    a[u].x += c.x;
                    a[u].y += c.y;
                    a[u].z += c.z;
                    a[u].w += c.w;
                }
            }
#pragma unroll
            for (int u = 0; u < ATT_CVT_U; ++u) {
                if (i0 + u * stride >= sg.n4) break;
                uint2 r;
                r.x = (uint32_t)M::from_f(a[u].x * sg.scale) |
                      ((uint32_t)M::from_f(a[u].y * sg.scale) << 16);
                r.y = (uint32_t)M::from_f(a[u].z * sg.scale) |
                      ((uint32_t)M::from_f(a[u].w * sg.scale) << 16);
                *reinterpret_cast<uint2 *>(dst[u]) = r;
            }
        }
    }
}

/* The last pass of attention_backward_rope_cuda, in place of attn_sum_convert_kernel: q and k
 * were rotated by a rope before the attention (zr_qkv_rope_sdpa), so dq and dk go out through the
 * transpose of that rotation. Up to three segments (dq, dk, dv), each a list of rows (b, h, t) of
 * D values. A thread takes 8 rotation pairs (i, i + D/2) of a row: it reads them as f32 (src, the
 * contiguous (.., H, T, D) accumulator or nsplit partials spaced split elements apart, times
 * scale) or, with src NULL, as the 16-bit values dst already holds (dk that the attention kernel
 * wrote unsplit, scaled: turned in place), rotates them back or not (rotate 0: dv) and writes
 * them to dst (strided as sd) in 16-byte vectors. cos, sin: (T, W) f32, 16-byte aligned; W = D,
 * or with NW a narrow head_dim's (rows of W values out of src's D, pairs (i, i + W/2)). Items
 * run position-major, (t, b·H + h, chunk): a warp's rows share one or two positions, so their
 * table rows are the same few lines (read once per warp, not once per row), and in a packed
 * gradient (B, T, heads, D) its stores are adjacent heads of one position. */
struct rope_seg {
    uint16_t *dst;
    const float *src;
    int64_t n, split; /* n: items (rows × W/16), 0 skips the segment */
    int nsplit, rotate, H;
    float scale;
    zr_attn_strides sd;
};
struct rope_cvt {
    rope_seg s[3];
    const float *cos, *sin;
    int T, B, W, rows32;
};

template <typename T, int D, bool NW> __global__ void attn_rope_convert_kernel(rope_cvt a) {
    typedef mma_t<T> M;
    const int W = NW ? a.W : D, HALF = W / 2, PER = HALF / 8; /* items per row */
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
#pragma unroll 1
    for (int k = 0; k < 3; ++k) {
        const rope_seg sg = a.s[k];
        for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < sg.n; i += stride) {
            const int col = (int)(i % PER) * 8;
            const pm_row w = pos_major(i / PER, (int64_t)a.B * sg.H, sg.H, a.rows32); /* PER: a shift unless NW */
            const int64_t t = w.t, row = w.bh * a.T + t;
            uint16_t *dst = sg.dst + w.b * sg.sd.sb + w.h * sg.sd.sh + t * sg.sd.st + col;
            float x1[8], x2[8];
            if (sg.src) {
                const float *s = sg.src + row * D + col;
#pragma unroll
                for (int e = 0; e < 8; ++e) x1[e] = x2[e] = 0.f;
                for (int p = 0; p < sg.nsplit; ++p, s += sg.split) {
#pragma unroll
                    for (int v = 0; v < 2; ++v) {
                        const float4 c = *reinterpret_cast<const float4 *>(s + 4 * v);
                        const float4 d = *reinterpret_cast<const float4 *>(s + HALF + 4 * v);
                        x1[4 * v] += c.x, x1[4 * v + 1] += c.y, x1[4 * v + 2] += c.z, x1[4 * v + 3] += c.w;
                        x2[4 * v] += d.x, x2[4 * v + 1] += d.y, x2[4 * v + 2] += d.z, x2[4 * v + 3] += d.w;
                    }
                }
#pragma unroll
                for (int e = 0; e < 8; ++e) x1[e] *= sg.scale, x2[e] *= sg.scale;
            } else {
                const uint4 c = *reinterpret_cast<const uint4 *>(dst);
                const uint4 d = *reinterpret_cast<const uint4 *>(dst + HALF);
                const uint16_t *pc = reinterpret_cast<const uint16_t *>(&c);
                const uint16_t *pd = reinterpret_cast<const uint16_t *>(&d);
#pragma unroll
                for (int e = 0; e < 8; ++e) x1[e] = M::to_f(pc[e]), x2[e] = M::to_f(pd[e]);
            }
            uint4 o1, o2;
            uint32_t *w1 = reinterpret_cast<uint32_t *>(&o1), *w2 = reinterpret_cast<uint32_t *>(&o2);
            if (sg.rotate) { /* the transpose of y1 = x1 c1 - x2 s1, y2 = x2 c2 + x1 s2 */
                const float *cs = a.cos + t * W + col, *sn = a.sin + t * W + col;
                float c1[8], c2[8], s1[8], s2[8];
#pragma unroll
                for (int v = 0; v < 2; ++v) {
                    *reinterpret_cast<float4 *>(c1 + 4 * v) = __ldg(reinterpret_cast<const float4 *>(cs + 4 * v));
                    *reinterpret_cast<float4 *>(c2 + 4 * v) =
                        __ldg(reinterpret_cast<const float4 *>(cs + HALF + 4 * v));
                    *reinterpret_cast<float4 *>(s1 + 4 * v) = __ldg(reinterpret_cast<const float4 *>(sn + 4 * v));
                    *reinterpret_cast<float4 *>(s2 + 4 * v) =
                        __ldg(reinterpret_cast<const float4 *>(sn + HALF + 4 * v));
                }
#pragma unroll
                for (int e = 0; e < 8; e += 2) {
                    w1[e / 2] = (uint32_t)M::from_f(x1[e] * c1[e] + x2[e] * s2[e]) |
                                ((uint32_t)M::from_f(x1[e + 1] * c1[e + 1] + x2[e + 1] * s2[e + 1]) << 16);
                    w2[e / 2] = (uint32_t)M::from_f(x2[e] * c2[e] - x1[e] * s1[e]) |
                                ((uint32_t)M::from_f(x2[e + 1] * c2[e + 1] - x1[e + 1] * s1[e + 1]) << 16);
                }
            } else {
#pragma unroll
                for (int e = 0; e < 8; e += 2) {
                    w1[e / 2] = (uint32_t)M::from_f(x1[e]) | ((uint32_t)M::from_f(x1[e + 1]) << 16);
                    w2[e / 2] = (uint32_t)M::from_f(x2[e]) | ((uint32_t)M::from_f(x2[e + 1]) << 16);
                }
            }
            *reinterpret_cast<uint4 *>(dst) = o1;
            *reinterpret_cast<uint4 *>(dst + HALF) = o2;
        }
    }
}

/* grid: x = (b*Hkv + hk)*nsplit + split, y = kv tile j, z = column slice. Each block owns 64 keys of
 * one kv head and loops over its share of the query group's heads and over query tiles i >= j; warp
 * w owns keys w*16..w*16+15 and accumulates their dK, dV in registers. dQ goes out through f32
 * atomics. With nsplit > 1, dk/dv partials (f32, unscaled) go to ws_dkv for attn_sum_convert_kernel.
 * D = 256: the dK, dV and dQ accumulators of a whole row would not fit in registers, so each block
 * owns DC = 128 of the columns (blockIdx.z the slice): the scores and dP over all D are computed by
 * both slices' blocks (7 products' work where one block would do 5), the rest for its columns. */
template <int D> struct bwd_cols {
    static constexpr int DC = D > 128 ? 128 : D;
};
template <typename T, int D, bool VL>
__global__ void __launch_bounds__(ATT_THREADS)
    attn_bwd_kernel(uint16_t *__restrict__ dk, uint16_t *__restrict__ dv,
                    float *__restrict__ ws_dkv, float *__restrict__ dqacc,
                    const uint16_t *__restrict__ dout, const uint16_t *__restrict__ q,
                    const uint16_t *__restrict__ k, const uint16_t *__restrict__ v,
                    const float *__restrict__ lse, const float *__restrict__ Dd,
                    const int32_t *__restrict__ hi, int T_, int Hq, int G, int nsplit,
                    int64_t kv_elems, float scale, float scale_log2) {
    typedef mma_t<T> M;
    extern __shared__ __align__(128) uint16_t smem[];
    uint16_t *sK = smem, *sV = sK + ATT_BLK * D, *sQ = sV + ATT_BLK * D;
    uint16_t *sdO = sQ + 2 * ATT_BLK * D, *sdS = sdO + 2 * ATT_BLK * D;
    float *sL = reinterpret_cast<float *>(sdS + ATT_BLK * ATT_BLK), *sDd = sL + 2 * ATT_BLK;

    const int nT = (T_ + ATT_BLK - 1) / ATT_BLK;
    const int j = blockIdx.y;
    const int split = blockIdx.x % nsplit, bhk = blockIdx.x / nsplit;
    const int Hkv = Hq / G, b = bhk / Hkv, hk = bhk % Hkv;
    const int Gs = G / nsplit, h0 = hk * G + split * Gs;
    /* VL (packed sequences; hi: one past the last token of each token's sequence): the query tiles
     * up to the end of the last key's sequence */
    int nq = nT - j;
    if (VL) {
        const int last = (j + 1) * ATT_BLK < T_ ? (j + 1) * ATT_BLK - 1 : T_ - 1;
        const int qe = (hi[(size_t)b * T_ + last] + ATT_BLK - 1) / ATT_BLK;
        if (qe - j < nq) nq = qe - j;
    }
    const int niter = Gs * nq;
    constexpr int DC = bwd_cols<D>::DC;
    const int col0 = blockIdx.z * DC; /* this block's columns of dK, dV, dQ: col0 .. col0 + DC - 1 */
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t4 = lane & 3;

    const size_t kvoff = (size_t)bhk * T_ * D;
    load_tile<D>(sK, k + kvoff, j * ATT_BLK, T_, tid);
    load_tile<D>(sV, v + kvoff, j * ATT_BLK, T_, tid);

    /* Issues the loads of iteration it into buffer it & 1. */
    auto prefetch = [&](int it) {
        const int h = h0 + it / nq, i = j + it % nq, buf = it & 1;
        const size_t qoff = ((size_t)b * Hq + h) * T_ * D;
        load_tile<D>(sQ + buf * ATT_BLK * D, q + qoff, i * ATT_BLK, T_, tid);
        load_tile<D>(sdO + buf * ATT_BLK * D, dout + qoff, i * ATT_BLK, T_, tid);
        const size_t roff = ((size_t)b * Hq + h) * T_;
        const int r = i * ATT_BLK + (tid & 63);
        if (tid < 64)
            sL[buf * ATT_BLK + tid] = r < T_ ? lse[roff + r] * ATT_LOG2E : INFINITY;
        else
            sDd[buf * ATT_BLK + (tid & 63)] = r < T_ ? Dd[roff + r] : 0.f;
    };
    prefetch(0);
    cp_async_commit();

    float dka[DC / 8][4], dva[DC / 8][4];
#pragma unroll
    for (int i = 0; i < DC / 8; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            dka[i][e] = dva[i][e] = 0.f;
    const int key0 = j * ATT_BLK + warp * 16 + g; /* this thread's keys: key0, key0 + 8 */
    int hi0 = T_, hi1 = T_; /* VL: one past the last query of each key's sequence (none past T) */
    if (VL) {
        if (key0 < T_) hi0 = hi[(size_t)b * T_ + key0];
        if (key0 + 8 < T_) hi1 = hi[(size_t)b * T_ + key0 + 8];
    }

    for (int it = 0; it < niter; ++it) {
        if (it + 1 < niter) prefetch(it + 1);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        const int buf = it & 1, h = h0 + it / nq, i = j + it % nq;
        const uint16_t *cQ = sQ + buf * ATT_BLK * D, *cdO = sdO + buf * ATT_BLK * D;
        const float *cL = sL + buf * ATT_BLK, *cD = sDd + buf * ATT_BLK;

        /* S^T = K_w Q^T and dP^T = V_w dO^T, 16 keys × 64 queries each. */
        float st[8][4], dpt[8][4];
#pragma unroll
        for (int n = 0; n < 8; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                st[n][e] = dpt[n][e] = 0.f;
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            uint32_t kf[4], vf[4];
            lds_a<D>(kf, sK, warp * 16, kk * 16, lane);
            lds_a<D>(vf, sV, warp * 16, kk * 16, lane);
#pragma unroll
            for (int qp = 0; qp < 4; ++qp) {
                uint32_t bq[4], bo[4];
                lds_b_nk<D>(bq, cQ, qp * 16, kk * 16, lane);
                lds_b_nk<D>(bo, cdO, qp * 16, kk * 16, lane);
                M::mma(st[2 * qp], kf, bq[0], bq[1]);
                M::mma(st[2 * qp + 1], kf, bq[2], bq[3]);
                M::mma(dpt[2 * qp], vf, bo[0], bo[1]);
                M::mma(dpt[2 * qp + 1], vf, bo[2], bo[3]);
            }
        }
        /* P^T and dS^T = P^T ∘ (dP^T − D). */
        const bool diag = (i == j);
#pragma unroll
        for (int n = 0; n < 8; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int ql = n * 8 + t4 * 2 + (e & 1);
                float p = exp2f(st[n][e] * scale_log2 - cL[ql]);
                if (diag && key0 + (e >> 1) * 8 > i * ATT_BLK + ql) p = 0.f;
                if (VL && i * ATT_BLK + ql >= ((e >> 1) ? hi1 : hi0)) p = 0.f;
                st[n][e] = p;
                dpt[n][e] = p * (dpt[n][e] - cD[ql]);
            }
        }
        /* dV += P^T dO and dK += dS^T Q, over 4 chunks of 16 queries. */
#pragma unroll
        for (int kc = 0; kc < 4; ++kc) {
            uint32_t pf[4], sf[4];
            pf[0] = M::pack(st[2 * kc][0], st[2 * kc][1]);
            pf[1] = M::pack(st[2 * kc][2], st[2 * kc][3]);
            pf[2] = M::pack(st[2 * kc + 1][0], st[2 * kc + 1][1]);
            pf[3] = M::pack(st[2 * kc + 1][2], st[2 * kc + 1][3]);
            sf[0] = M::pack(dpt[2 * kc][0], dpt[2 * kc][1]);
            sf[1] = M::pack(dpt[2 * kc][2], dpt[2 * kc][3]);
            sf[2] = M::pack(dpt[2 * kc + 1][0], dpt[2 * kc + 1][1]);
            sf[3] = M::pack(dpt[2 * kc + 1][2], dpt[2 * kc + 1][3]);
            /* dS^T to shared memory, [key][query], for the dQ product below. */
            const int r = warp * 16 + g, c0 = kc * 16 + t4 * 2;
            *reinterpret_cast<uint32_t *>(sdS + swz<ATT_BLK>(r, c0)) = sf[0];
            *reinterpret_cast<uint32_t *>(sdS + swz<ATT_BLK>(r + 8, c0)) = sf[1];
            *reinterpret_cast<uint32_t *>(sdS + swz<ATT_BLK>(r, c0 + 8)) = sf[2];
            *reinterpret_cast<uint32_t *>(sdS + swz<ATT_BLK>(r + 8, c0 + 8)) = sf[3];
#pragma unroll
            for (int dp = 0; dp < DC / 16; ++dp) {
                uint32_t bo[4], bq[4];
                lds_b_kn<D>(bo, cdO, kc * 16, col0 + dp * 16, lane);
                lds_b_kn<D>(bq, cQ, kc * 16, col0 + dp * 16, lane);
                M::mma(dva[2 * dp], pf, bo[0], bo[1]);
                M::mma(dva[2 * dp + 1], pf, bo[2], bo[3]);
                M::mma(dka[2 * dp], sf, bq[0], bq[1]);
                M::mma(dka[2 * dp + 1], sf, bq[2], bq[3]);
            }
        }
        __syncthreads();
        /* dQ rows warp*16.. of this query tile = dS (16 × 64 keys) K (64 × D). */
        float dq[DC / 8][4];
#pragma unroll
        for (int n = 0; n < DC / 8; ++n)
            dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.f;
#pragma unroll
        for (int kc = 0; kc < 4; ++kc) {
            uint32_t af[4];
            const int mi = lane >> 3;
            ldsm_x4_t(af, sdS + swz<ATT_BLK>(kc * 16 + (lane & 7) + (mi >> 1) * 8,
                                             warp * 16 + (mi & 1) * 8));
#pragma unroll
            for (int dp = 0; dp < DC / 16; ++dp) {
                uint32_t bk[4];
                lds_b_kn<D>(bk, sK, kc * 16, col0 + dp * 16, lane);
                M::mma(dq[2 * dp], af, bk[0], bk[1]);
                M::mma(dq[2 * dp + 1], af, bk[2], bk[3]);
            }
        }
        const int qr = i * ATT_BLK + warp * 16 + g;
        float *dqb = dqacc + ((size_t)b * Hq + h) * T_ * D;
#pragma unroll
        for (int n = 0; n < DC / 8; ++n) {
            const int c = col0 + n * 8 + t4 * 2;
            if (qr < T_)
                atomicAdd(reinterpret_cast<float2 *>(dqb + (size_t)qr * D + c),
                          make_float2(dq[n][0], dq[n][1]));
            if (qr + 8 < T_)
                atomicAdd(reinterpret_cast<float2 *>(dqb + (size_t)(qr + 8) * D + c),
                          make_float2(dq[n][2], dq[n][3]));
        }
        __syncthreads();
    }

    /* Epilogue: rows key0, key0 + 8 of this kv head. */
#pragma unroll
    for (int n = 0; n < DC / 8; ++n) {
        const int c = col0 + n * 8 + t4 * 2;
#pragma unroll
        for (int hlf = 0; hlf < 2; ++hlf) {
            const int key = key0 + hlf * 8;
            if (key >= T_) continue;
            const size_t off = kvoff + (size_t)key * D + c;
            if (nsplit == 1) {
                *reinterpret_cast<uint32_t *>(dk + off) =
                    M::pack(dka[n][2 * hlf] * scale, dka[n][2 * hlf + 1] * scale);
                *reinterpret_cast<uint32_t *>(dv + off) =
                    M::pack(dva[n][2 * hlf], dva[n][2 * hlf + 1]);
            } else {
                float *wk = ws_dkv + (size_t)split * kv_elems, *wv = wk + (size_t)nsplit * kv_elems;
                *reinterpret_cast<float2 *>(wk + off) =
                    make_float2(dka[n][2 * hlf], dka[n][2 * hlf + 1]);
                *reinterpret_cast<float2 *>(wv + off) =
                    make_float2(dva[n][2 * hlf], dva[n][2 * hlf + 1]);
            }
        }
    }
}

/* ---- host side ------------------------------------------------------------------------------ */

/* Splits of the query group per kv head in backward: more blocks when B*Hkv*tiles is small. */
static int bwd_nsplit(int64_t B, int64_t Hkv, int64_t G, int64_t T) {
    const int64_t blocks = B * Hkv * ((T + ATT_BLK - 1) / ATT_BLK);
    int ns = 1;
    while (G % (ns * 2) == 0 && blocks * ns < 512)
        ns *= 2;
    return ns;
}

static size_t align16(size_t n) {
    return (n + 15) & ~(size_t)15;
}

extern "C" size_t attention_backward_workspace_size(int64_t B, int64_t Hq, int64_t Hkv, int64_t T,
                                                    int64_t Dh) {
    if (B <= 0 || Hq <= 0 || Hkv <= 0 || T <= 0 || Dh <= 0 || Hq % Hkv) return 0;
    const int ns0 = bwd_nsplit(B, Hkv, Hq / Hkv, T);
    const int ns1 = attn_sm90_bwd_nsplit(B, Hkv, Hq / Hkv, T);
    const int ns = ns0 > ns1 ? ns0 : ns1; /* enough for either kernel */
    /* the accumulators' width: 128 at a narrow head_dim, 256 at 256 (the mma.sync kernels only) */
    const int64_t Dc = Dh == 256 ? 256 : attn_sm90_width(Dh);
    size_t n = align16((size_t)(B * Hq * T * Dc) * 4) + 2 * align16((size_t)(B * Hq * T) * 4);
    if (ns > 1) n += (size_t)2 * ns * B * Hkv * T * Dc * 4;
    return n;
}

static int check_args(const char *fn, int64_t B, int64_t Hq, int64_t Hkv, int64_t T, int64_t Dh,
                      zr_dtype dt) {
    if (dt != ZR_BF16 && dt != ZR_F16)
        return zr_error("%s: dtype %s not supported (bf16 or f16 expected)", fn, zr_dtype_name(dt));
    if (Dh != 64 && Dh != 128 && Dh != 256 && !(attn_sm90_narrow(Dh) && attention_strided_ok(Dh, dt)))
        return zr_error("%s: head_dim %lld not supported (64, 128 or 256; 80, 96 or 112 on the Hopper kernels, "
                        "compute capability 9.0: attention_strided_ok)",
                        fn, (long long)Dh);
    if (B < 0 || T < 0 || Hq <= 0 || Hkv <= 0 || Hq % Hkv)
        return zr_error("%s: bad shape B=%lld Hq=%lld Hkv=%lld T=%lld (Hq must be a multiple of "
                        "Hkv)",
                        fn, (long long)B, (long long)Hq, (long long)Hkv, (long long)T);
    if (T > (int64_t)1 << 30 || B * Hq > (int64_t)1 << 30)
        return zr_error("%s: shape too large B=%lld Hq=%lld T=%lld", fn, (long long)B,
                        (long long)Hq, (long long)T);
    return 0;
}

[[maybe_unused]] static int launch_check(const char *fn) {
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return zr_error("%s: CUDA launch failed: %s", fn, cudaGetErrorString(e));
    return 0;
}

template <typename T, int D>
static void fwd_launch(void *o, float *lse, const void *q, const void *k, const void *v,
                       const int32_t *seg, int64_t B, int64_t Hq, int64_t Hkv, int64_t T_,
                       float scale, cudaStream_t st) {
    const int smem = 5 * ATT_BLK * D * 2;
    auto kern = seg ? attn_fwd_kernel<T, D, true> : attn_fwd_kernel<T, D, false>;
    cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    dim3 grid((unsigned)(B * Hq), (unsigned)((T_ + ATT_BLK - 1) / ATT_BLK));
    kern<<<grid, ATT_THREADS, smem, st>>>((uint16_t *)o, lse, (const uint16_t *)q,
                                          (const uint16_t *)k, (const uint16_t *)v, seg, (int)T_,
                                          (int)Hq, (int)(Hq / Hkv), scale * ATT_LOG2E);
}

/* The mma.sync forward at head_dim 64, 128 or 256. */
template <typename T>
static void fwd_any(void *o, float *lse, const void *q, const void *k, const void *v, const int32_t *seg,
                    int64_t B, int64_t Hq, int64_t Hkv, int64_t T_, int64_t Dh, float scale, cudaStream_t st) {
    auto f = Dh == 64 ? fwd_launch<T, 64> : Dh == 128 ? fwd_launch<T, 128> : fwd_launch<T, 256>;
    f(o, lse, q, k, v, seg, B, Hq, Hkv, T_, scale, st);
}

/* (B, H, T, Dh) contiguous */
static zr_attn_strides dense(int64_t H, int64_t T, int64_t Dh) {
    return zr_attn_strides{H * T * Dh, T * Dh, Dh};
}
static bool same(const zr_attn_strides &a, const zr_attn_strides &b) {
    return a.sb == b.sb && a.sh == b.sh && a.st == b.st;
}
/* L, or the contiguous layout when NULL; *dense_all tells whether every operand the call reads or
 * writes is contiguous (fwd: q, k, v, o only; a forward's layout leaves the gradients' unset). */
static zr_attn_layout resolve(const zr_attn_layout *L, int64_t Hq, int64_t Hkv, int64_t T,
                              int64_t Dh, bool fwd, bool *dense_all) {
    const zr_attn_strides a = dense(Hq, T, Dh), c = dense(Hkv, T, Dh);
    const zr_attn_layout d = {a, c, c, a, a, a, c, c};
    if (!L) {
        *dense_all = true;
        return d;
    }
    *dense_all = same(L->q, a) && same(L->k, c) && same(L->v, c) && same(L->o, a) &&
                 (fwd || (same(L->dout, a) && same(L->dq, a) && same(L->dk, c) && same(L->dv, c)));
    return *L;
}

extern "C" int attention_strided_ok(int64_t Dh, zr_dtype dtype) {
    return attn_sm90_fwd_ok(Dh, dtype) && attn_sm90_bwd_ok(Dh, dtype);
}

extern "C" int attention_varlen_ok(int64_t Dh, zr_dtype dtype) {
    if (attn_sm90_narrow(Dh)) return attention_strided_ok(Dh, dtype); /* the Hopper kernels only */
    if (!((Dh == 64 || Dh == 128 || Dh == 256) && (dtype == ZR_BF16 || dtype == ZR_F16))) return 0;
    int dev = 0, major = 0; /* a device the sm_90 code runs on */
    const int ok = cudaGetDevice(&dev) == cudaSuccess &&
                   cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
                   major >= 9;
    if (!ok) cudaGetLastError(); /* no device: an answer, not an error left behind */
    return ok;
}

#define TMA_STRIDES                                                                                \
    "TMA cannot address these strided operands (each base and stride must be a multiple of 16 "   \
    "bytes); make q/k/v/o and the gradients contiguous"

extern "C" int attention_forward_cuda(void *o, float *lse, const void *q, const void *k,
                                      const void *v, const zr_attn_layout *L, int64_t B,
                                      int64_t Hq, int64_t Hkv, int64_t T, int64_t Dh, float scale,
                                      zr_dtype dtype, cudaStream_t stream) {
    const char *fn = "attention_forward_cuda";
    if (check_args(fn, B, Hq, Hkv, T, Dh, dtype)) return ZR_ERR;
    if (B == 0 || T == 0) return 0;
    if (scale <= 0.f) scale = 1.f / sqrtf((float)Dh);
    bool dense_all;
    const zr_attn_layout lay = resolve(L, Hq, Hkv, T, Dh, true, &dense_all);
    if (attn_sm90_fwd_ok(Dh, dtype)) {
        if ((Dh == 64 ? attn_sm90_forward(o, lse, q, k, v, &lay, B, Hq, Hkv, T, scale, dtype, stream)
                      : attn_sm90_forward128(o, lse, q, k, v, &lay, B, Hq, Hkv, T, Dh, scale, dtype, stream)) == 0)
            return launch_check(fn);
        if (!dense_all || attn_sm90_narrow(Dh)) return zr_error("%s: %s", fn, TMA_STRIDES);
    }
    if (!dense_all)
        return zr_error("%s: strided q/k/v/o need the Hopper kernels (see attention_strided_ok)",
                        fn);
    if (dtype == ZR_BF16)
        fwd_any<__nv_bfloat16>(o, lse, q, k, v, lay.seg, B, Hq, Hkv, T, Dh, scale, stream);
    else
        fwd_any<__half>(o, lse, q, k, v, lay.seg, B, Hq, Hkv, T, Dh, scale, stream);
    return launch_check(fn);
}

/* The Hopper kernel where it runs and TMA can address the operands, else the mma.sync one (dense
 * operands only). Returns -1, nothing launched, when neither can take the call. */
template <typename T, int D>
static int bwd_launch(void *dq, void *dk, void *dv, const void *dout, const void *q, const void *k,
                      const void *v, const void *o, const float *lse, void *ws,
                      const zr_attn_layout &L, bool dense_all, int64_t B, int64_t Hq, int64_t Hkv,
                      int64_t T_, int W, float scale, const float *cos, const float *sin,
                      cudaStream_t st) {
    /* D: the kernels' width (their accumulators'); W <= D: the operands' (a narrow head_dim's) */
    const int64_t rows = B * Hq * T_, nq = rows * D, nkv = B * Hkv * T_ * D;
    float *dqacc = (float *)ws;
    float *Dd = (float *)((char *)ws + align16((size_t)nq * 4));
    float *nl2 = (float *)((char *)Dd + align16((size_t)rows * 4));
    float *wkv = (float *)((char *)nl2 + align16((size_t)rows * 4));
    const int G = (int)(Hq / Hkv);
    attn_sm90_bwd_maps maps;
    const bool hopper = attn_sm90_bwd_ok(D, mma_dtype<T>::value) &&
                        attn_sm90_backward_maps(&maps, dqacc, dout, q, k, v, &L, B, Hq, Hkv, T_, W,
                                                mma_dtype<T>::value) == 0;
    if (!hopper && (!dense_all || W != D))
        return -1;
    const int ns = hopper ? attn_sm90_bwd_nsplit(B, Hkv, G, T_) : bwd_nsplit(B, Hkv, G, T_);
    const int per = D / 8, rpb = 256 / per;
    attn_bwd_prep_kernel<T, D><<<(unsigned)((rows + rpb - 1) / rpb), 256, 0, st>>>(
        Dd, hopper ? nl2 : nullptr, dqacc, lse, (const uint16_t *)dout, (const uint16_t *)o, L.dout, L.o,
        same(L.dout, dense(Hq, T_, W)) && same(L.o, dense(Hq, T_, W)), (int)Hq, (int)T_, W, rows);
    if (hopper) {
        attn_sm90_backward(&maps, dk, dv, wkv, nl2, Dd, &L, B, Hq, Hkv, T_, W, ns, nkv, scale,
                           mma_dtype<T>::value, st);
    } else {
        const int smem = (ATT_BLK * D * 6 + ATT_BLK * ATT_BLK) * 2 + 4 * ATT_BLK * 4;
        auto kern = L.seg ? attn_bwd_kernel<T, D, true> : attn_bwd_kernel<T, D, false>;
        cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
        dim3 grid((unsigned)(B * Hkv * ns), (unsigned)((T_ + ATT_BLK - 1) / ATT_BLK), D / bwd_cols<D>::DC);
        kern<<<grid, ATT_THREADS, smem, st>>>(
            (uint16_t *)dk, (uint16_t *)dv, wkv, dqacc, (const uint16_t *)dout, (const uint16_t *)q,
            (const uint16_t *)k, (const uint16_t *)v, lse, Dd, L.seg ? L.seg + B * T_ : nullptr,
            (int)T_, (int)Hq, G, ns, nkv, scale, scale * ATT_LOG2E);
    }
    const int rows32 = rows < ((int64_t)1 << 31);
    const bool nw = W != D;
    if (cos) { /* one launch: dq and dk rotated back (dk in place when unsplit), dv when split */
        const int64_t per = W / 16;
        rope_cvt a = {{{(uint16_t *)dq, dqacc, rows * per, 0, 1, 1, (int)Hq, scale, L.dq},
                       {(uint16_t *)dk, ns > 1 ? wkv : nullptr, B * Hkv * T_ * per, nkv, ns, 1,
                        (int)Hkv, scale, L.dk},
                       {(uint16_t *)dv, wkv + (size_t)ns * nkv, ns > 1 ? B * Hkv * T_ * per : 0, nkv,
                        ns, 0, (int)Hkv, 1.f, L.dv}},
                      cos,
                      sin,
                      (int)T_,
                      (int)B,
                      W,
                      rows32};
        (nw ? attn_rope_convert_kernel<T, D, true> : attn_rope_convert_kernel<T, D, false>)<<<132 * 8, 256, 0, st>>>(a);
        return 0;
    }
    /* one launch converts dq, and dk/dv when they were split (n4: float4s of the W-wide outputs) */
    const zr_attn_strides dq_ = dense(Hq, T_, W), dkv = dense(Hkv, T_, W);
    const int64_t q4 = rows * W / 4, kv4 = B * Hkv * T_ * W / 4;
    cvt_seg segs = {{{(uint16_t *)dq, dqacc, q4, nq, 1, scale, L.dq, (int)Hq, same(L.dq, dq_)},
                     {(uint16_t *)dk, wkv, ns > 1 ? kv4 : 0, nkv, ns, scale, L.dk, (int)Hkv, same(L.dk, dkv)},
                     {(uint16_t *)dv, wkv + (size_t)ns * nkv, ns > 1 ? kv4 : 0, nkv, ns, 1.f, L.dv, (int)Hkv,
                      same(L.dv, dkv)}},
                    (int)T_,
                    W,
                    rows32};
    (nw ? attn_sum_convert_kernel<T, D, true> : attn_sum_convert_kernel<T, D, false>)<<<132 * 8, 256, 0, st>>>(segs);
    return 0;
}

/* attention_backward_cuda's body; cos, sin non-NULL: attention_backward_rope_cuda's last pass. */
static int backward(const char *fn, void *dq, void *dk, void *dv, const void *dout, const void *q,
                    const void *k, const void *v, const void *o, const float *lse, void *workspace,
                    const zr_attn_layout *L, int64_t B, int64_t Hq, int64_t Hkv, int64_t T,
                    int64_t Dh, float scale, const float *cos, const float *sin, zr_dtype dtype,
                    cudaStream_t stream) {
    if (check_args(fn, B, Hq, Hkv, T, Dh, dtype)) return ZR_ERR;
    if (B == 0 || T == 0) return 0;
    if (!workspace) return zr_error("%s: workspace is NULL", fn);
    if (scale <= 0.f) scale = 1.f / sqrtf((float)Dh);
    bool dense_all;
    const zr_attn_layout lay = resolve(L, Hq, Hkv, T, Dh, false, &dense_all);
    if (!dense_all && !attn_sm90_bwd_ok(Dh, dtype))
        return zr_error("%s: strided operands need the Hopper kernels (see attention_strided_ok)",
                        fn);
    const int W = (int)Dh;
    auto b16 = Dh == 64 ? bwd_launch<__nv_bfloat16, 64>
                        : Dh == 256 ? bwd_launch<__nv_bfloat16, 256> : bwd_launch<__nv_bfloat16, 128>;
    auto f16 = Dh == 64 ? bwd_launch<__half, 64> : Dh == 256 ? bwd_launch<__half, 256> : bwd_launch<__half, 128>;
    const int rc = (dtype == ZR_BF16 ? b16 : f16)(dq, dk, dv, dout, q, k, v, o, lse, workspace, lay, dense_all, B,
                                                  Hq, Hkv, T, W, scale, cos, sin, stream);
    if (rc)
        return zr_error("%s: %s", fn, TMA_STRIDES);
    return launch_check(fn);
}

extern "C" int attention_backward_cuda(void *dq, void *dk, void *dv, const void *dout,
                                       const void *q, const void *k, const void *v, const void *o,
                                       const float *lse, void *workspace, const zr_attn_layout *L,
                                       int64_t B, int64_t Hq, int64_t Hkv, int64_t T, int64_t Dh,
                                       float scale, zr_dtype dtype, cudaStream_t stream) {
    return backward("attention_backward_cuda", dq, dk, dv, dout, q, k, v, o, lse, workspace, L, B,
                    Hq, Hkv, T, Dh, scale, nullptr, nullptr, dtype, stream);
}

extern "C" int attention_backward_rope_cuda(void *dq, void *dk, void *dv, const void *dout,
                                            const void *q, const void *k, const void *v,
                                            const void *o, const float *lse, void *workspace,
                                            const zr_attn_layout *L, int64_t B, int64_t Hq,
                                            int64_t Hkv, int64_t T, int64_t Dh, float scale,
                                            const float *cos, const float *sin, zr_dtype dtype,
                                            cudaStream_t stream) {
    const char *fn = "attention_backward_rope_cuda";
    if (!cos || !sin || (((uintptr_t)cos | (uintptr_t)sin) & 15))
        return zr_error("%s: cos and sin must be 16-byte aligned (T, head_dim) f32 tables", fn);
    return backward(fn, dq, dk, dv, dout, q, k, v, o, lse, workspace, L, B, Hq, Hkv, T, Dh, scale,
                    cos, sin, dtype, stream);
}
