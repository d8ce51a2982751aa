/* Device helpers for the Hopper attention kernels (attention_{fwd,bwd}_sm90.cu):
 * wgmma m64nNk16 with f32 accumulators (A from registers or shared memory, B from shared memory),
 * shared-memory matrix descriptors for 128-byte-swizzled tiles of 64 16-bit columns, cp.async,
 * mbarriers, named barriers, TMA loads and reduce-adds, warpgroup register reallocation,
 * the forward's online-softmax step, rescale, P packing and epilogue. Only for translation units built with -gencode
 * arch=compute_90a,code=sm_90a. */
#ifndef ZR_CUDA_ATTENTION_SM90_CUH
#define ZR_CUDA_ATTENTION_SM90_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

#include <type_traits>

#include "ptx_copy.cuh"

namespace sm90 {

using ptx::cp_async_wait;
using ptx::smem_u32;

static __device__ __forceinline__ void cp_async4(void *dst, const void *src, int bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
                 "r"(bytes));
}
/* Makes this thread's generic-proxy shared-memory writes (st.shared, cp.async) visible to the
 * async proxy (wgmma operand reads); a barrier must follow before the wgmma. */
static __device__ __forceinline__ void fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

/* x, the same in every lane of the warp, as the warp's one value (lane 0's): ptxas then keeps what
 * derives from it (a warp's role, its ring position, the shared-memory descriptors of its wgmma)
 * in uniform registers, where each warp computes it once, instead of in every lane and moved to
 * uniform registers (R2UR) before each wgmma (CUTLASS's canonical_warp_idx_sync). Every lane of
 * the warp must call it. */
static __device__ __forceinline__ int warp_uniform(int x) { return __shfl_sync(0xffffffffu, x, 0); }

/* A Hopper kernel's dynamic shared memory, 1024-byte aligned (the 128-byte swizzle's atom, which
 * every TMA tile and wgmma operand needs): declared so, it starts on the boundary and its address
 * is a constant. Aligned at run time instead (up to session 28) it cost ~11 instructions a use,
 * which ptxas recomputed in every main-loop step rather than keep in a register. */
#define ZR_SMEM_1024(name) extern __shared__ __align__(1024) uint8_t name[]

/* Tiles are R rows × 64 columns of 16-bit elements (128 bytes a row), 1024-byte aligned, the
 * 16-byte chunk index of each row XORed with row % 8: the 128-byte swizzle atom of wgmma. */
static __device__ __forceinline__ int swz(int row, int col) {
    return row * 64 + ((((col >> 3) ^ (row & 7))) << 3) + (col & 7);
}

/* Shared-memory matrix descriptor of a 128-byte-swizzled operand, as a base and byte offsets.
 * Stride byte offset 1024 (8 rows of 128 bytes: the distance between 8-row groups, the one stride
 * these operands use, their swizzled extent one atom wide), swizzle mode 1 = 128 bytes: the high
 * word, the same for every operand. Shared addresses are below 2^18 (228 KB a block), so the start
 * address field is a / 16 and a tile's offsets (multiples of 16 bytes) add to it with no carry:
 * made once outside a loop, at(off) is one add where building the descriptor is a mask, a shift
 * and an or per product. */
#define ZR_DESC128_HI ((1024u >> 4) | (1u << (62 - 32))) /* high word: stride offset, swizzle */
struct sdesc {
    uint32_t lo; /* the descriptor's low word: start address / 16 | leading byte offset */
    /* a & 0x3FFFF: in a cluster launch a shared address carries the CTA's rank above bit 24 (the
     * shared::cluster window), which must not reach the offset fields. lbo: the leading byte
     * offset, 1024 as the stride, or for an MN-major operand two 64-wide atoms across the distance
     * between them (PTX ISA, "Leading Dimension Byte Offset": MN-major, swizzled) */
    __device__ __forceinline__ explicit sdesc(uint32_t a, uint32_t lbo = 1024)
        : lo(((a & 0x3FFFF) >> 4) | ((lbo >> 4) << 16)) {}
    __device__ __forceinline__ uint64_t at(uint32_t off) const {
        uint64_t d;
        asm("mov.b64 %0, {%1, %2};\n" : "=l"(d) : "r"(lo + (off >> 4)), "r"(ZR_DESC128_HI));
        return d;
    }
};
/* Orders the computation of 64-bit values (descriptors) before the next asm volatile statement in
 * the PTX (ptxas may still schedule the SASS instructions later). */
template <int N> static __device__ __forceinline__ void reg_fence(uint64_t (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i)
        asm volatile("" : "+l"(d[i])::"memory");
}

/* 2^x on the special-function unit alone (flushes subnormal results to 0; exp2(-inf) = 0). */
static __device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

static __device__ __forceinline__ void wg_fence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
static __device__ __forceinline__ void wg_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N> static __device__ __forceinline__ void wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/* Keeps the compiler from moving accesses of accumulator registers across wgmma boundaries. */
template <int N> static __device__ __forceinline__ void reg_fence(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i)
        asm volatile("" : "+f"(d[i])::"memory");
}
template <int N> static __device__ __forceinline__ void reg_fence(uint32_t (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i)
        asm volatile("" : "+r"(d[i])::"memory");
}
template <int N, int M> static __device__ __forceinline__ void reg_fence(uint32_t (&d)[N][M]) {
#pragma unroll
    for (int i = 0; i < N; ++i)
        reg_fence(d[i]);
}

#define ZR_WG_D32                                                                                  \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "  \
    "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define ZR_WG_OUT32(d)                                                                             \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),            \
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),    \
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), \
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), \
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])

/* d (64×64 per warpgroup, f32) (+)= A (64×16, registers) · B (16×64 from descriptor b).
 * TB = 0: B stored [n][k] (K-major); TB = 1: B stored [k][n] (N-major). acc = 0 overwrites d. */
#define ZR_WG_RS64(TY)                                                                             \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                      \
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " " ZR_WG_D32             \
                 ", {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"                                  \
                 : ZR_WG_OUT32(d)                                                                  \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(acc), "n"(TB))
template <typename T, int TB>
static __device__ __forceinline__ void wg_rs64(float (&d)[32], const uint32_t (&a)[4], uint64_t b,
                                               int acc) {
    if constexpr (std::is_same<T, __nv_bfloat16>::value) ZR_WG_RS64("bf16");
    else ZR_WG_RS64("f16");
}

/* d (64×64) (+)= A (64×16 from descriptor a) · B (16×64 from descriptor b); TA = 1: A stored
 * [k][m] (M-major), TB = 1: B stored [k][n] (N-major). */
#define ZR_WG_SS64(TY)                                                                             \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                      \
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " " ZR_WG_D32             \
                 ", %32, %33, p, 1, 1, %35, %36;\n}\n"                                              \
                 : ZR_WG_OUT32(d)                                                                  \
                 : "l"(a), "l"(b), "r"(acc), "n"(TA), "n"(TB))
template <typename T, int TA, int TB>
static __device__ __forceinline__ void wg_ss64(float (&d)[32], uint64_t a, uint64_t b, int acc) {
    if constexpr (std::is_same<T, __nv_bfloat16>::value) ZR_WG_SS64("bf16");
    else ZR_WG_SS64("f16");
}

/* The m64n32k16 twins of wg_rs64 / wg_ss64 (a narrow head_dim's last atom: 32 of its 64 columns
 * carry data): d's first 16 floats, which are the accumulator layout of a 64×64 tile's first 32
 * columns; d[16..31] are left alone. B's descriptor the same as for n64 (the 128-byte swizzle applies
 * to the addresses, so the atom's first 32 columns are read in place). */
#define ZR_WG_D16                                                                                  \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define ZR_WG_OUT16(d)                                                                             \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),            \
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),    \
        "+f"(d[14]), "+f"(d[15])
#define ZR_WG_RS32(TY)                                                                             \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"                                      \
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32." TY "." TY " " ZR_WG_D16             \
                 ", {%16, %17, %18, %19}, %20, p, 1, 1, %22;\n}\n"                                  \
                 : ZR_WG_OUT16(d)                                                                  \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(acc), "n"(TB))
template <typename T, int TB>
static __device__ __forceinline__ void wg_rs32(float (&d)[32], const uint32_t (&a)[4], uint64_t b,
                                               int acc) {
    if constexpr (std::is_same<T, __nv_bfloat16>::value) ZR_WG_RS32("bf16");
    else ZR_WG_RS32("f16");
}
#define ZR_WG_SS32(TY)                                                                             \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"                                      \
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32." TY "." TY " " ZR_WG_D16             \
                 ", %16, %17, p, 1, 1, %19, %20;\n}\n"                                              \
                 : ZR_WG_OUT16(d)                                                                  \
                 : "l"(a), "l"(b), "r"(acc), "n"(TA), "n"(TB))
template <typename T, int TA, int TB>
static __device__ __forceinline__ void wg_ss32(float (&d)[32], uint64_t a, uint64_t b, int acc) {
    if constexpr (std::is_same<T, __nv_bfloat16>::value) ZR_WG_SS32("bf16");
    else ZR_WG_SS32("f16");
}

#define ZR_WG_D64                                                                                  \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "  \
    "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "   \
    "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "   \
    "%56, %57, %58, %59, %60, %61, %62, %63}"
#define ZR_WG_OUT64(d)                                                                             \
    ZR_WG_OUT32(d), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]),  \
        "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), \
        "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), \
        "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), \
        "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])

/* d (64×128, f32) (+)= A (64×16 from descriptor a) · B (16×128 from descriptor b); TA = 0: A
 * stored [m][k] (K-major), 1: [k][m] (M-major); TB = 0: B stored [n][k] (K-major), 1: [k][n]
 * (N-major). acc = 0 overwrites d. */
#define ZR_WG_SS128(TY)                                                                            \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                      \
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " " ZR_WG_D64            \
                 ", %64, %65, p, 1, 1, %67, %68;\n}\n"                                              \
                 : ZR_WG_OUT64(d)                                                                  \
                 : "l"(a), "l"(b), "r"(acc), "n"(TA), "n"(TB))
template <typename T, int TA = 0, int TB = 0>
static __device__ __forceinline__ void wg_ss128(float (&d)[64], uint64_t a, uint64_t b, int acc) {
    if constexpr (std::is_same<T, __nv_bfloat16>::value) ZR_WG_SS128("bf16");
    else ZR_WG_SS128("f16");
}

/* A warpgroup's 64 rows of a [row][64] 16-bit tile in the TMA's 128-byte swizzle (tile 1024-byte
 * aligned) as the register A operands of four k = 16 steps (x[kk]: columns 16kk..16kk + 15), by
 * ldmatrix x4: matrix m = lane / 8 holds rows + 8(m & 1) and the step's 8 columns 16kk + 8(m >> 1),
 * at the addresses swz gives. row0: the warpgroup's first row. */
static __device__ __forceinline__ void a_frags_64(uint32_t (&x)[4][4], const void *tile, int row0,
                                                  int warp, int lane) {
    const int row = row0 + warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
        ptx::ldsm_x4(x[kk], reinterpret_cast<const uint16_t *>(tile) +
                                swz(row, 16 * kk + 8 * (lane >> 4)));
}

/* Hands registers back (producer warpgroups) or takes them (consumer warpgroups): every warp of
 * the warpgroup executes it; the kernel's launch count must cover the producers' share. */
template <int N> static __device__ __forceinline__ void reg_dealloc() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N> static __device__ __forceinline__ void reg_alloc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

/* mbarriers (shared memory, CTA scope): arrive has release and wait acquire semantics. */
static __device__ __forceinline__ void mbar_init(uint64_t *b, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(b)), "r"(count)
                 : "memory");
}
/* n full / empty pairs of a ring: full[i] completed by one arrival (with the bytes its TMA loads
 * announce), empty[i] by `arrivals` (the consumers' warps). */
static __device__ __forceinline__ void mbar_init_ring(uint64_t *full, uint64_t *empty, int n, int arrivals) {
    for (int i = 0; i < n; ++i) {
        mbar_init(&full[i], 1);
        mbar_init(&empty[i], arrivals);
    }
}
/* Makes the initialisations visible to the other threads and to the TMA unit. */
static __device__ __forceinline__ void mbar_init_fence() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
static __device__ __forceinline__ void mbar_arrive(uint64_t *b) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(b)) : "memory");
}
/* Arrives and announces bytes that asynchronous copies will complete on this phase. */
static __device__ __forceinline__ void mbar_expect_tx(uint64_t *b, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(b)),
                 "r"(bytes)
                 : "memory");
}
/* Waits until the phase of the given parity has completed. */
static __device__ __forceinline__ void mbar_wait(uint64_t *b, uint32_t parity) {
    uint32_t done;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(smem_u32(b)), "r"(parity)
                     : "memory");
    } while (!done);
}
/* TMA: the box at coordinates (c0, c1, c2, c3) of the tensor map into shared memory at dst,
 * completing its bytes on mbarrier bar. The map (a __grid_constant__ kernel parameter) fixes the
 * swizzle. */
static __device__ __forceinline__ void tma_load4(void *dst, const void *map, uint64_t *bar, int c0,
                                                 int c1, int c2, int c3) {
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes "
                 "[%0], [%1, {%3, %4, %5, %6}], [%2];\n" ::"r"(smem_u32(dst)),
                 "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)), "r"(c0), "r"(c1),
                 "r"(c2), "r"(c3)
                 : "memory");
}

/* Arrives on mbarrier b once every earlier cp.async of this thread has completed; the barrier's
 * arrival count must include this arrival (.noinc). */
static __device__ __forceinline__ void cp_async_mbar_arrive(uint64_t *b) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_u32(b))
                 : "memory");
}
/* TMA reduce-add: the f32 box at src (shared memory, laid out as the map's swizzle says) added
 * element-wise into the tensor at coordinates (c0, c1, c2, c3); elements outside the tensor are
 * skipped. Completion through the bulk-group functions below. */
static __device__ __forceinline__ void tma_reduce_add4(const void *map, const void *src, int c0,
                                                       int c1, int c2, int c3) {
    asm volatile("cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group "
                 "[%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(reinterpret_cast<uint64_t>(map)),
                 "r"(smem_u32(src)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
                 : "memory");
}
static __device__ __forceinline__ void bulk_commit() {
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
/* Waits until at most N bulk groups still read their shared-memory source. */
template <int N> static __device__ __forceinline__ void bulk_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
/* Waits until at most N bulk groups are still incomplete (their global writes included). */
template <int N> static __device__ __forceinline__ void bulk_wait() {
    asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}
/* Named barrier id (1..15) over the first n threads that reach it (a multiple of 32). */
static __device__ __forceinline__ void bar_sync(int id, int n) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
/* Arrives on named barrier id without waiting (counts towards the n of a bar_sync elsewhere). */
static __device__ __forceinline__ void bar_arrive(int id, int n) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}

/* The forwards' tiles (attention_fwd_sm90.cu, head_dim 64; attention_fwd_sm90_d128.cu, 128): 128
 * queries by 128 keys. Work tile t (0 .. B·Hq·nQt − 1), numbered heaviest first: bh = b·Hq + h =
 * t % BH, query tile qt = nQt − 1 − t / BH (every head's last tile before any shorter one). */
#define SM90_FWD_TILE 128
struct fwd_tile {
    int qt, b, h;
    __device__ __forceinline__ fwd_tile(int t, int BH, int nQt, int Hq)
        : qt(nQt - 1 - t / BH), b(t % BH / Hq), h(t % BH % Hq) {}
};
/* The work tile a block runs n-th: round n of gridDim.x tiles, dealt in block order in even rounds
 * and in reverse in odd ones. Past the last tile once past B·Hq·nQt (later rounds only grow). */
static __device__ __forceinline__ int fwd_tile_id(int n) {
    const int g = gridDim.x, i = blockIdx.x;
    return n * g + ((n & 1) ? g - 1 - i : i);
}
/* Packed sequences (seg: lo of each token, zr_attn_layout): the first key tile query tile qt of
 * row b needs, the one holding the start of its first query's sequence (the earliest of its rows':
 * lo never decreases along a row), from that query q0 or from query tile qt's first. */
static __device__ __forceinline__ int fwd_first_key_tile_at(const int32_t *seg, int b, int q0, int T_) {
    return seg[(size_t)b * T_ + q0] / SM90_FWD_TILE;
}
static __device__ __forceinline__ int fwd_first_key_tile(const int32_t *seg, int b, int qt, int T_) {
    return fwd_first_key_tile_at(seg, b, qt * SM90_FWD_TILE, T_);
}
/* The last key tile a tile of bm queries from q0 needs: the one holding its last row before T. */
static __device__ __forceinline__ int fwd_last_key_tile(int q0, int bm, int T_) {
    return ((q0 + bm < T_ ? q0 + bm : T_) - 1) / SM90_FWD_TILE;
}

/* Packed sequences: the first key of the sequence of each of this thread's rows qrow, qrow + 8 of
 * batch row b (0 past T; seg: lo of each token). */
static __device__ __forceinline__ void rows_lo(const int32_t *seg, int b, int qrow, int T_, int &lo0, int &lo1) {
    const int32_t *lr = seg + (size_t)b * T_;
    lo0 = qrow < T_ ? lr[qrow] : 0;
    lo1 = qrow + 8 < T_ ? lr[qrow + 8] : 0;
}

/* Packed sequences: masks the raw scores (layout as softmax_step's) of keys before each row's
 * sequence, lo0 for row qrow and lo1 for row qrow + 8 (keys key0 + 8·nt + {0, 1}). */
template <int NT>
static __device__ __forceinline__ void mask_before(float (&s)[4 * NT], int key0, int lo0, int lo1) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            if (key0 + nt * 8 + (e & 1) < ((e >> 1) ? lo1 : lo0)) s[4 * nt + e] = -INFINITY;
}

/* Online-softmax step on a warpgroup's 64×(8·NT) tile of raw scores s (accumulator layout: this
 * thread's rows qrow, qrow + 8; columns key0 + 8*nt + {0, 1}): masks keys after the row when diag,
 * raises the running maxima m0, m1 (raw units), turns s into P = 2^((s − m)·sl) and returns the
 * factors al that rescale the old O and l, and the tile's partial row sums rs. */
template <int NT>
static __device__ __forceinline__ void softmax_step(float (&s)[4 * NT], float &m0, float &m1,
                                                    float &al0, float &al1, float &rs0, float &rs1,
                                                    bool diag, int key0, int qrow, float sl) {
    if (diag) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                if (key0 + nt * 8 + (e & 1) > qrow + (e >> 1) * 8) s[4 * nt + e] = -INFINITY;
    }
    /* the row maxima as balanced trees (log2(2·NT) dependent steps instead of 2·NT: the
     * exponentials wait for them, and the other warpgroup's products only cover so much) */
    float m2[2 * NT];
#pragma unroll
    for (int i = 0; i < NT; ++i) {
        m2[i] = fmaxf(s[4 * i], s[4 * i + 1]);
        m2[NT + i] = fmaxf(s[4 * i + 2], s[4 * i + 3]);
    }
    static_assert(NT == 16, "the tree below halves 16 partial maxima four times");
#define ZR_MAX_LEVEL(W)                                                                            \
    _Pragma("unroll") for (int i = 0; i < (W); ++i) {                                              \
        m2[i] = fmaxf(m2[i], m2[i + (W)]);                                                         \
        m2[NT + i] = fmaxf(m2[NT + i], m2[NT + i + (W)]);                                          \
    }
    ZR_MAX_LEVEL(8)
    ZR_MAX_LEVEL(4)
    ZR_MAX_LEVEL(2)
    ZR_MAX_LEVEL(1)
#undef ZR_MAX_LEVEL
    float mx0 = m2[0], mx1 = m2[NT];
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    /* finite: the first key of every processed tile is <= each row of the warpgroup (with packed
     * sequences a tile may mask all of a row's keys, but the diagonal tile, processed first, holds
     * the row's own key, so m0, m1 are finite from then on) */
    const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
    al0 = ex2((m0 - mn0) * sl);
    al1 = ex2((m1 - mn1) * sl);
    m0 = mn0;
    m1 = mn1;
    const float b0 = mn0 * sl, b1 = mn1 * sl;
    rs0 = rs1 = 0.f;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        s[4 * nt] = ex2(fmaf(s[4 * nt], sl, -b0));
        s[4 * nt + 1] = ex2(fmaf(s[4 * nt + 1], sl, -b0));
        s[4 * nt + 2] = ex2(fmaf(s[4 * nt + 2], sl, -b1));
        s[4 * nt + 3] = ex2(fmaf(s[4 * nt + 3], sl, -b1));
        rs0 += s[4 * nt] + s[4 * nt + 1];
        rs1 += s[4 * nt + 2] + s[4 * nt + 3];
    }
}

template <typename T> struct cvt;
template <> struct cvt<__nv_bfloat16> {
    static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
        __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
        return *reinterpret_cast<uint32_t *>(&v);
    }
};
template <> struct cvt<__half> {
    static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
        __half2 v = __floats2half2_rn(lo, hi);
        return *reinterpret_cast<uint32_t *>(&v);
    }
};

/* After a tile's softmax_step: l = l·al + rs and O = O·al for this thread's two rows. */
static __device__ __forceinline__ void fwd_rescale(float (&acc)[32], float &l0, float &l1,
                                                   float al0, float al1, float rs0, float rs1) {
    l0 = l0 * al0 + rs0;
    l1 = l1 * al1 + rs1;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        acc[4 * i] *= al0;
        acc[4 * i + 1] *= al0;
        acc[4 * i + 2] *= al1;
        acc[4 * i + 3] *= al1;
    }
}

/* An f32 accumulator (8·KC values per thread: 64 rows × 16·KC columns per warpgroup) as the register
 * A operands of KC k = 16 steps, in 16-bit pairs: the forward's P for P·V (KC 8), the backward's P^T
 * and dS^T for dV and dK (KC 4). */
template <typename T, int KC>
static __device__ __forceinline__ void pack_a(uint32_t (&pf)[KC][4], const float (&s)[8 * KC]) {
#pragma unroll
    for (int kc = 0; kc < KC; ++kc) {
        pf[kc][0] = cvt<T>::pack(s[8 * kc], s[8 * kc + 1]);
        pf[kc][1] = cvt<T>::pack(s[8 * kc + 2], s[8 * kc + 3]);
        pf[kc][2] = cvt<T>::pack(s[8 * kc + 4], s[8 * kc + 5]);
        pf[kc][3] = cvt<T>::pack(s[8 * kc + 6], s[8 * kc + 7]);
    }
}

/* The forwards' epilogue, per warp: completes the row sums l0, l1 over the quad, writes O = acc / l
 * (64×64 accumulator layout: this thread's tile rows wr + g, wr + g + 8, wr the warp's first row)
 * through rows wr.. of the swizzled tile st (the Q tile, once no product reads it) and stores those
 * before T with 16-byte stores to ob (tile row r is query q0 + r, rows ost elements apart), and
 * lse = (m·sl + log2 l)·ln 2 to lrow (the head's T values). Calls release() once the warp no
 * longer touches st (its last reads are in registers), before the global stores of O. */
/* The forwards' row sums of this thread's rows completed over the quad (the row's four lanes). */
static __device__ __forceinline__ void quad_sums(float &l0, float &l1) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
}
/* lse = (m·sl + log2 l)·ln 2 of rows qrow and qrow + 8 (those before T), from the quad's first lane. */
static __device__ __forceinline__ void store_lse(float *lrow, int qrow, int T_, int t4, float m0, float m1,
                                                 float l0, float l1, float sl) {
    const float ln2 = 0.6931471805599453f;
    if (t4 == 0) {
        if (qrow < T_) lrow[qrow] = (m0 * sl + log2f(l0)) * ln2;
        if (qrow + 8 < T_) lrow[qrow + 8] = (m1 * sl + log2f(l1)) * ln2;
    }
}

template <typename T, typename F>
static __device__ __forceinline__ void fwd_epilogue(const float (&acc)[32], float l0, float l1,
                                                    float m0, float m1, float sl, uint16_t *st,
                                                    int wr, int q0, uint16_t *ob, int64_t ost,
                                                    float *lrow, int T_, int lane, F &&release) {
    const int g = lane >> 2, t4 = lane & 3, r0 = wr + g, qrow = q0 + r0;
    quad_sums(l0, l1);
    const float i0 = 1.f / l0, i1 = 1.f / l1;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
        const int c = nt * 8 + t4 * 2;
        *reinterpret_cast<uint32_t *>(st + swz(r0, c)) =
            cvt<T>::pack(acc[4 * nt] * i0, acc[4 * nt + 1] * i0);
        *reinterpret_cast<uint32_t *>(st + swz(r0 + 8, c)) =
            cvt<T>::pack(acc[4 * nt + 2] * i1, acc[4 * nt + 3] * i1);
    }
    __syncwarp();
    uint4 v[4]; /* 16 rows × 8 chunks of 16 bytes, 4 a lane */
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int c = lane + 32 * i, row = wr + (c >> 3), ch = c & 7;
        v[i] = *reinterpret_cast<const uint4 *>(st + row * 64 + ((ch ^ (row & 7)) << 3));
    }
    release();
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int c = lane + 32 * i, row = wr + (c >> 3), ch = c & 7, gr = q0 + row;
        if (gr < T_) /* one 16-byte store (a plain uint4 assignment here comes out as four) */
            asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"l"(ob + gr * ost + ch * 8),
                         "r"(v[i].x), "r"(v[i].y), "r"(v[i].z), "r"(v[i].w)
                         : "memory");
    }
    store_lse(lrow, qrow, T_, t4, m0, m1, l0, l1, sl);
}

} /* namespace sm90 */

#endif
