/* CUDA twins of kernels/cpu/zenflow.h (ZenFlow's selective column update): the same arguments
 * plus a stream; parameters f32 or bf16, everything else f32, idx int32 on the device. */
#ifndef ZR_CUDA_ZENFLOW_H
#define ZR_CUDA_ZENFLOW_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "../base/dtype.h"

int zenflow_colsum_cuda(float *out, const float *g, int64_t rows, int64_t cols, cudaStream_t stream);
/* update_interval "auto"'s sums, many at once (zenflow_absdiff_sums_cuda): entry e asks for
 * sums[slot] = sum over its n elements of |a - prev| (prev read as zeros without ZENFLOW_HAVE_PREV;
 * ZENFLOW_KEEP: prev takes a's values in the same pass), the CPU twin's zenflow_absdiff_sum_cpu.
 * Each entry is cut into chunks of ZENFLOW_ABSDIFF_CHUNK elements; first is its first chunk's number,
 * the chunks of the entries before it (an entry of n = 0 has none). A chunk's partial sum is a double
 * summed by one block in a fixed order, an entry's sum the fixed-order sum of its partials, rounded to
 * f32: the result depends on the data and the pointers' 16-byte alignment only, not on the GPU or on
 * the other entries. A kept prev shares no memory with any a or other prev (runtime/zero/zenflow.c checks). */
#define ZENFLOW_ABSDIFF_CHUNK 16384
#define ZENFLOW_HAVE_PREV 1
#define ZENFLOW_KEEP 2
typedef struct {
    const float *a; /* (n) */
    float *prev;    /* (n), or NULL when flags is 0 */
    int64_t n, first;
    int32_t slot, flags;
} zenflow_absdiff_entry;
static inline int64_t zenflow_absdiff_chunks(int64_t n) {
    return (n + ZENFLOW_ABSDIFF_CHUNK - 1) / ZENFLOW_ABSDIFF_CHUNK;
}
/* tab: nent entries in device memory, ordered by first; part: nchunks doubles of workspace (nchunks:
 * the chunks of all entries, < 2^31); sums: f32 on the device. Two launches: the chunks' partials, then
 * one block per entry that totals them. */
int zenflow_absdiff_sums_cuda(float *sums, const zenflow_absdiff_entry *tab, int64_t nent, double *part,
                              int64_t nchunks, cudaStream_t stream);
int zenflow_gather_cuda(void *out, const void *src, int esz, int64_t rows, int64_t cols, const int32_t *idx, int64_t k,
                        cudaStream_t stream);
int zenflow_scatter_cuda(void *dst, const void *src, int esz, int64_t rows, int64_t cols, const int32_t *idx,
                         int64_t k, cudaStream_t stream);
int zenflow_adamw_cuda(void *p, zr_dtype pdt, const float *g, int g_sel, float *m, float *v, int64_t rows,
                       int64_t cols, const int32_t *idx, int64_t k, double lr, double b1, double b2, double eps,
                       double wd, int64_t step, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
