/* Hopper (sm_90) synchronisation and bulk-copy PTX shared by the kernels that use it (attention,
 * GEMMs, cross-entropy): mbarriers (CTA and cluster scope), named barriers, the cluster's rank, id
 * and barrier, distributed shared-memory stores (st.async), 1-D bulk copies into shared memory
 * and the bulk-group waits. Needs sm_90, not sm_90a. */
#ifndef ZR_CUDA_SM90_SYNC_CUH
#define ZR_CUDA_SM90_SYNC_CUH

#include <stdint.h>

#include "ptx_copy.cuh"

namespace sm90 {

using ptx::smem_u32;

/* mbarriers (shared memory, CTA scope): arrive has release and wait acquire semantics. */
static __device__ __forceinline__ void mbar_init(uint64_t *b, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(b)), "r"(count)
                 : "memory");
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

/* 1-D bulk copy (no tensor map): bytes (a multiple of 16; src and dst 16-byte aligned) from global
 * src to this CTA's shared memory at dst, completing its bytes on mbarrier bar. */
static __device__ __forceinline__ void bulk_load(void *dst, const void *src, uint32_t bytes,
                                                 uint64_t *bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                 ::"r"(smem_u32(dst)), "l"(src), "r"(bytes), "r"(smem_u32(bar))
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

/* ---- clusters ---- */
static __device__ __forceinline__ uint32_t cluster_rank() { /* this CTA's rank in its cluster */
    uint32_t r;
    asm("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
}
static __device__ __forceinline__ uint32_t cluster_id_x() {
    uint32_t r;
    asm("mov.u32 %0, %%clusterid.x;\n" : "=r"(r));
    return r;
}
static __device__ __forceinline__ uint32_t cluster_count_x() { /* clusters in the grid along x */
    uint32_t r;
    asm("mov.u32 %0, %%nclusterid.x;\n" : "=r"(r));
    return r;
}
/* Every thread of the cluster: arrive (release), then wait (acquire) for the cluster's others. */
static __device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}
/* Arrives (release, cluster scope) on the mbarrier at b's offset in CTA `cta` of the cluster. */
static __device__ __forceinline__ void mbar_arrive_cluster(uint64_t *b, uint32_t cta) {
    asm volatile("{\n.reg .b32 ra;\nmapa.shared::cluster.u32 ra, %0, %1;\n"
                 "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [ra];\n}\n" ::"r"(smem_u32(b)),
                 "r"(cta)
                 : "memory");
}
/* mbar_wait with acquire at cluster scope (for a phase that the other CTA's arrivals complete); the
 * retry loop inside the asm. */
static __device__ __forceinline__ void mbar_wait_cluster(uint64_t *b, uint32_t parity) {
    asm volatile("{\n.reg .pred p;\nGM_WAIT_%=:\n"
                 "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%0], %1;\n"
                 "@!p bra GM_WAIT_%=;\n}\n" ::"r"(smem_u32(b)), "r"(parity)
                 : "memory");
}
/* Stores the pair v at p's offset in CTA `cta`'s shared memory (distributed shared memory) and
 * completes its 8 bytes on the mbarrier at bar's offset there (st.async: the receiver's wait on
 * that mbarrier, acquire at cluster scope, sees the pair). */
static __device__ __forceinline__ void st_async_f2(float2 *p, uint64_t *bar, uint32_t cta,
                                                   float2 v) {
    asm volatile("{\n.reg .b32 ra, rb;\nmapa.shared::cluster.u32 ra, %0, %2;\n"
                 "mapa.shared::cluster.u32 rb, %1, %2;\n"
                 "st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32 [ra], {%3, %4}, [rb];\n}\n"
                 ::"r"(smem_u32(p)), "r"(smem_u32(bar)), "r"(cta), "f"(v.x), "f"(v.y)
                 : "memory");
}

} /* namespace sm90 */

#endif
