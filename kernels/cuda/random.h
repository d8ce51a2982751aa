/* Philox random fills on CUDA, bit-compatible with the CPU fills in runtime/core/random.c: element
 * i of a fill at generator offset `offset` uses counter offset + i/4, lane i%4 (base/philox.h).
 * kind 0: uniform [a, b); 1: normal(mean a, std b); 2: bernoulli (1 with probability a).
 * dst is contiguous with n elements of dtype dt. Returns 0, or -1 with zr_error set. */
#ifndef ZR_CUDA_RANDOM_H
#define ZR_CUDA_RANDOM_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "../base/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

int random_fill_cuda(void *dst, zr_dtype dt, int64_t n, int kind, double a, double b, uint64_t seed,
                     uint64_t offset, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
