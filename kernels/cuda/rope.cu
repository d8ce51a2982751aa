/* Rotary embedding for q and k in one launch (see rope.h). One thread rotates V pairs of one
 * (b, t) position for ROPE_HG heads (cos/sin read once), or of one (b, h, t) row when unaligned;
 * reads and writes go through (b, h, t) strides so the same kernels do the in-place BHTD case and
 * the fused BTHD -> BHTD transpose, and backward with sin negated. */
#include "rope.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

extern "C" {
#include "../base/error.h"
}

#include "fused_common.cuh"

#define ROPE_HG 1 /* heads per thread in the heads kernel: measured on the H200 (B4 T2048 H32/8
                   * Dh64 bf16) 28.1 us with 1, 28.6 with 2, 29.8 with 4, 31.5 with 8: more
                   * threads in flight beat reading cos/sin once for several heads */

/* Strides in elements of one tensor side: x[b, h, t, :] = base + b*sb + h*sh + t*st. */
struct rope_side {
    const void *in;
    void *out;
    int64_t H, in_sb, in_sh, in_st, out_sb, out_sh, out_st;
};

/* One thread per V pairs: grid over B*(Hq+Hkv)*T rows × nch = Dh/2/V chunks; rows
 * [0, B*Hq*T) are q's, the rest k's. 32-bit index math (the host checks the sizes fit). */
template <typename T, int V>
__global__ void rope_kernel(rope_side qs, rope_side ks, const float *__restrict__ cosb,
                            const float *__restrict__ sinb, uint32_t rows_q, uint32_t rows,
                            uint32_t T_, uint32_t nch, int64_t Dh, float sign) {
    const uint32_t idx = blockIdx.x * blockDim.x + threadIdx.x;
    const uint32_t ra = idx / nch;
    if (ra >= rows) return;
    const int64_t half = Dh / 2, c = (int64_t)(idx - ra * nch) * V;
    const bool isq = ra < rows_q;
    const uint32_t r = isq ? ra : ra - rows_q, H = isq ? (uint32_t)qs.H : (uint32_t)ks.H;
    const uint32_t t = r % T_, bh = r / T_, h = bh % H, b = bh / H;
    const T *in;
    T *out;
    if (isq) {
        in = (const T *)qs.in + b * qs.in_sb + h * qs.in_sh + t * qs.in_st;
        out = (T *)qs.out + b * qs.out_sb + h * qs.out_sh + t * qs.out_st;
    } else {
        in = (const T *)ks.in + b * ks.in_sb + h * ks.in_sh + t * ks.in_st;
        out = (T *)ks.out + b * ks.out_sb + h * ks.out_sh + t * ks.out_st;
    }
    float x1[V], x2[V], cs[V], sn[V];
    ldv<T, V>(x1, in + c);
    ldv<T, V>(x2, in + half + c);
#pragma unroll
    for (int k = 0; k < V; ++k) {
        cs[k] = cosb[t * half + c + k];
        sn[k] = sign * sinb[t * half + c + k];
    }
    float o1[V], o2[V];
#pragma unroll
    for (int k = 0; k < V; ++k) {
        o1[k] = x1[k] * cs[k] - x2[k] * sn[k];
        o2[k] = x2[k] * cs[k] + x1[k] * sn[k];
    }
    stv<T, V>(out + c, o1);
    stv<T, V>(out + half + c, o2);
}

/* Heads path: one thread per (head group, b, t, chunk of V pairs): cos/sin are read once and used
 * for the HG heads of its group (q heads in groups of HG, then k heads), whose loads are all issued
 * before any use. Consecutive threads take consecutive chunks, then consecutive t. */
template <typename T, int V, int HG>
__global__ void __launch_bounds__(256)
    rope_heads_kernel(rope_side qs, rope_side ks, const float *__restrict__ cosb,
                      const float *__restrict__ sinb, uint32_t gq, uint32_t n, uint32_t B_,
                      uint32_t T_, uint32_t nch, uint32_t half, float sign) {
    const uint32_t idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= n) return;
    const uint32_t cidx = idx % nch, r = idx / nch, t = r % T_, r2 = r / T_, b = r2 % B_,
                   hg = r2 / B_;
    const bool isq = hg < gq;
    /* fields picked one by one: a reference to either parameter struct would copy it to the stack */
    const uint32_t h0 = (isq ? hg : hg - gq) * HG, H = (uint32_t)(isq ? qs.H : ks.H);
    const int64_t in_sh = isq ? qs.in_sh : ks.in_sh, out_sh = isq ? qs.out_sh : ks.out_sh;
    const uint32_t c = cidx * V;
    float cs[V], sn[V];
    const float4 *cp = reinterpret_cast<const float4 *>(cosb + (size_t)t * half + c);
    const float4 *sp = reinterpret_cast<const float4 *>(sinb + (size_t)t * half + c);
#pragma unroll
    for (int q = 0; q < V / 4; ++q) {
        const float4 a = __ldg(cp + q), bb = __ldg(sp + q);
        cs[4 * q] = a.x, cs[4 * q + 1] = a.y, cs[4 * q + 2] = a.z, cs[4 * q + 3] = a.w;
        sn[4 * q] = sign * bb.x, sn[4 * q + 1] = sign * bb.y, sn[4 * q + 2] = sign * bb.z,
               sn[4 * q + 3] = sign * bb.w;
    }
    const T *in = (const T *)(isq ? qs.in : ks.in) + b * (isq ? qs.in_sb : ks.in_sb) +
                  t * (isq ? qs.in_st : ks.in_st) + c;
    T *out = (T *)(isq ? qs.out : ks.out) + b * (isq ? qs.out_sb : ks.out_sb) +
             t * (isq ? qs.out_st : ks.out_st) + c;
    uint4 r1[HG], r2v[HG];
#pragma unroll
    for (int j = 0; j < HG; ++j)
        if (h0 + j < H) {
            const T *p = in + (int64_t)(h0 + j) * in_sh;
            r1[j] = *reinterpret_cast<const uint4 *>(p);
            r2v[j] = *reinterpret_cast<const uint4 *>(p + half);
        }
#pragma unroll
    for (int j = 0; j < HG; ++j)
        if (h0 + j < H) {
            const T *e1 = reinterpret_cast<const T *>(&r1[j]);
            const T *e2 = reinterpret_cast<const T *>(&r2v[j]);
            float o1[V], o2[V];
#pragma unroll
            for (int k = 0; k < V; ++k) {
                const float x1 = tof<T>(e1[k]), x2 = tof<T>(e2[k]);
                o1[k] = x1 * cs[k] - x2 * sn[k];
                o2[k] = x2 * cs[k] + x1 * sn[k];
            }
            T *po = out + (int64_t)(h0 + j) * out_sh;
            stv<T, V>(po, o1);
            stv<T, V>(po + half, o2);
        }
}

static rope_side make_side(const void *x, void *bhtd, int64_t H, int64_t T, int64_t Dh, int layout,
                           bool fwd) {
    /* x side strides by layout; the other side is always (B, H, T, Dh). */
    int64_t xb = H * T * Dh, xh = layout == ZR_ROPE_BTHD ? Dh : T * Dh,
            xt = layout == ZR_ROPE_BTHD ? H * Dh : Dh;
    int64_t yb = H * T * Dh, yh = T * Dh, yt = Dh;
    rope_side s;
    s.H = H;
    if (fwd) {
        s.in = x;
        s.out = bhtd;
        s.in_sb = xb, s.in_sh = xh, s.in_st = xt, s.out_sb = yb, s.out_sh = yh, s.out_st = yt;
    } else {
        s.in = bhtd;
        s.out = (void *)x;
        s.in_sb = yb, s.in_sh = yh, s.in_st = yt, s.out_sb = xb, s.out_sh = xh, s.out_st = xt;
    }
    return s;
}

static int rope_run(const char *fn, const void *xq, void *yq, const void *xk, void *yk,
                    const float *cosb, const float *sinb, int64_t B, int64_t Hq, int64_t Hkv,
                    int64_t Tn, int64_t Dh, int layout, zr_dtype dtype, cudaStream_t st, bool fwd) {
    if (B < 0 || Hq < 0 || Hkv < 0 || Tn < 0 || Dh <= 0 || Dh % 2)
        return zr_error("%s: bad shape B=%lld Hq=%lld Hkv=%lld T=%lld Dh=%lld (Dh must be even)",
                        fn, (long long)B, (long long)Hq, (long long)Hkv, (long long)Tn,
                        (long long)Dh);
    if (layout != ZR_ROPE_BHTD && layout != ZR_ROPE_BTHD)
        return zr_error("%s: layout %d unknown (ZR_ROPE_BHTD or ZR_ROPE_BTHD)", fn, layout);
    if (layout == ZR_ROPE_BTHD && (xq == yq || xk == yk) && B * Tn > 1 && (Hq > 1 || Hkv > 1))
        return zr_error("%s: the BTHD layout cannot run in place", fn);
    if (B * Tn * (Hq + Hkv) == 0) return 0;
    rope_side qs = make_side(xq, yq, Hq, Tn, Dh, layout, fwd);
    rope_side ks = make_side(xk, yk, Hkv, Tn, Dh, layout, fwd);
    const float sign = fwd ? 1.f : -1.f;
    ZR_FUSED_DISPATCH(fn, dtype, {
        const int V = 16 / sizeof(T);
        const bool vec = (Dh / 2) % V == 0 && al16(xq) && al16(yq) && al16(xk) && al16(yk);
        const int64_t rows = B * (Hq + Hkv) * Tn, nch = vec ? Dh / 2 / V : Dh / 2;
        const int64_t n = rows * nch;
        if (n >= ((int64_t)1 << 31))
            return zr_error("%s: %lld rows x %lld pairs too large for one launch", fn,
                            (long long)rows, (long long)(Dh / 2));
        const unsigned grid = (unsigned)((n + 255) / 256);
        if (vec && al16(cosb) && al16(sinb)) {
            const uint32_t gq = (uint32_t)((Hq + ROPE_HG - 1) / ROPE_HG),
                           gk = (uint32_t)((Hkv + ROPE_HG - 1) / ROPE_HG);
            const int64_t nh = (int64_t)(gq + gk) * B * Tn * nch;
            rope_heads_kernel<T, 16 / sizeof(T), ROPE_HG><<<(unsigned)((nh + 255) / 256), 256, 0, st>>>(
                qs, ks, cosb, sinb, gq, (uint32_t)nh, (uint32_t)B, (uint32_t)Tn, (uint32_t)nch,
                (uint32_t)(Dh / 2), sign);
        } else if (vec)
            rope_kernel<T, 16 / sizeof(T)><<<grid, 256, 0, st>>>(
                qs, ks, cosb, sinb, (uint32_t)(B * Hq * Tn), (uint32_t)rows, (uint32_t)Tn,
                (uint32_t)nch, Dh, sign);
        else
            rope_kernel<T, 1><<<grid, 256, 0, st>>>(qs, ks, cosb, sinb, (uint32_t)(B * Hq * Tn),
                                                    (uint32_t)rows, (uint32_t)Tn, (uint32_t)nch,
                                                    Dh, sign);
    });
    return launch_check(fn);
}

extern "C" int rope_forward_cuda(void *q_out, void *k_out, const void *q, const void *k,
                                 const float *cos, const float *sin, int64_t B, int64_t Hq,
                                 int64_t Hkv, int64_t T, int64_t Dh, int layout, zr_dtype dtype,
                                 cudaStream_t stream) {
    return rope_run("rope_forward_cuda", q, q_out, k, k_out, cos, sin, B, Hq, Hkv, T, Dh, layout,
                    dtype, stream, true);
}

extern "C" int rope_backward_cuda(void *dq, void *dk, const void *dq_out, const void *dk_out,
                                  const float *cos, const float *sin, int64_t B, int64_t Hq,
                                  int64_t Hkv, int64_t T, int64_t Dh, int layout, zr_dtype dtype,
                                  cudaStream_t stream) {
    /* The x side is dq/dk (written), the BHTD side dq_out/dk_out (read). */
    return rope_run("rope_backward_cuda", dq, (void *)dq_out, dk, (void *)dk_out, cos, sin, B, Hq,
                    Hkv, T, Dh, layout, dtype, stream, false);
}

/* One thread per (row, pair i < R/2) of x (BH, T, Dh), in place: channels R..Dh-1 untouched. */
template <typename T>
__global__ void rope_partial_kernel(T *x, const float *__restrict__ cosb,
                                    const float *__restrict__ sinb, int64_t n, int64_t T_,
                                    int64_t Dh, int64_t half, float sign) {
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= n) return;
    const int64_t row = idx / half, i = idx - row * half, t = row % T_;
    T *p = x + row * Dh;
    const float c = cosb[t * half + i], sn = sign * sinb[t * half + i];
    const float x1 = tof<T>(p[i]), x2 = tof<T>(p[i + half]);
    p[i] = fromf<T>(x1 * c - x2 * sn);
    p[i + half] = fromf<T>(x2 * c + x1 * sn);
}

extern "C" int rope_partial_cuda(void *x, const float *cos, const float *sin, int64_t BH,
                                 int64_t Tn, int64_t Dh, int64_t R, int backward, zr_dtype dtype,
                                 cudaStream_t stream) {
    const char *fn = "rope_partial_cuda";
    if (BH < 0 || Tn < 0 || Dh <= 0 || R <= 0 || R % 2 || R > Dh)
        return zr_error("%s: bad shape BH=%lld T=%lld Dh=%lld R=%lld (R even, 0 < R <= Dh)", fn,
                        (long long)BH, (long long)Tn, (long long)Dh, (long long)R);
    const int64_t n = BH * Tn * (R / 2);
    if (n == 0) return 0;
    const float sign = backward ? -1.f : 1.f;
    const unsigned grid = (unsigned)((n + 255) / 256);
    ZR_FUSED_DISPATCH(fn, dtype, {
        rope_partial_kernel<T><<<grid, 256, 0, stream>>>((T *)x, cos, sin, n, Tn, Dh, R / 2, sign);
    });
    return launch_check(fn);
}
