/* CU(x): runs a CUDA runtime call and exits (status 2) with the error, file and line when it
 * fails; for the standalone GPU tests and benchmarks (test_fused_kernels.cu, test_gemm_sm90.cu,
 * bench_fused.cu, bench_gemm_sm90.cu). */
#ifndef ZR_TESTS_CU_CHECK_H
#define ZR_TESTS_CU_CHECK_H

#include <cstdio>
#include <cstdlib>

#define CU(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__);        \
            exit(2);                                                                               \
        }                                                                                          \
    } while (0)

#endif
