// Programmatic dependent launch (sm_90): a kernel started with pdl_launch may be scheduled while
// the kernel before it on the stream still runs, so its launch latency and that kernel's tail
// overlap instead of adding up (~2 us between kernels otherwise, ~3,400 kernels a Llama step).
// The contract: a kernel launched this way calls pdl_enter() (or pdl_wait()) in every block before
// its first global memory access, read or write, and before any early return. pdl_wait returns
// once the kernel before it has completed and its writes are visible (at once after a plain
// launch); pdl_enter then also lets the next dependent launch begin (else it begins where the
// kernel says so, griddepcontrol.launch_dependents, or when it ends). ZRUN_PDL=0 launches every
// kernel plainly.
// CUDA C++ only; each includer gets its own static copies.
#ifndef ZR_CUDA_PDL_CUH
#define ZR_CUDA_PDL_CUH

#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

#include <utility>

static __device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
static __device__ __forceinline__ void pdl_enter() {
    pdl_wait();
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

[[maybe_unused]] static bool pdl_enabled() {
    static int on = -1;
    if (on < 0) {
        const char *e = getenv("ZRUN_PDL");
        on = !(e && strcmp(e, "0") == 0);
    }
    return on;
}

/* k<<<grid, block, smem, st>>>(args...) as a programmatic dependent of the kernel before it on st
 * (a plain launch where the attribute is refused or ZRUN_PDL=0). Launch errors are left for the
 * caller's launch check, as with <<<>>>. */
template <typename... P, typename... A>
static inline void pdl_launch(void (*k)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t st,
                              A &&...args) {
    if (pdl_enabled()) {
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = grid;
        cfg.blockDim = block;
        cfg.dynamicSmemBytes = smem;
        cfg.stream = st;
        cudaLaunchAttribute at[1];
        at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = at;
        cfg.numAttrs = 1;
        if (cudaLaunchKernelEx(&cfg, k, std::forward<A>(args)...) == cudaSuccess) return;
        (void)cudaGetLastError();
    }
    k<<<grid, block, smem, st>>>(std::forward<A>(args)...);
}

#endif
