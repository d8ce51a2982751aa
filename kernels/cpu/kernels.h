/* Declarations of every CPU kernel in both precisions: each family header declares its kernels
 * over `real`/K() and is included here once per precision. Family headers have no guards. */
#ifndef ZR_KERNELS_CPU_H
#define ZR_KERNELS_CPU_H

#include <stdint.h>

#include "../base/qkv_layout.h"

#define ZR_KERNELS_DECLARE
#define real float
#define K(name) name##_f32
#include "elementwise.h"
#include "reduce.h"
#include "matmul.h"
#include "softmax.h"
#include "cross_entropy.h"
#include "norm.h"
#include "embedding.h"
#include "rope.h"
#include "qkv_rope.h"
#include "attention.h"
#include "compare.h"
#include "dropout.h"
#include "optim.h"
#include "swiglu.h"
#undef real
#undef K
#define real double
#define K(name) name##_f64
#include "elementwise.h"
#include "reduce.h"
#include "matmul.h"
#include "softmax.h"
#include "cross_entropy.h"
#include "norm.h"
#include "embedding.h"
#include "rope.h"
#include "qkv_rope.h"
#include "attention.h"
#include "compare.h"
#include "dropout.h"
#include "optim.h"
#include "swiglu.h"
#undef real
#undef K
#undef ZR_KERNELS_DECLARE

/* OpenBLAS's kernels for this CPU, chosen once (by gemm_cpu's first call, or `zrun report`'s): where
 * OpenBLAS's DYNAMIC_ARCH fell back to kernels without AVX because it did not know the CPU's model (Debian's
 * 0.3.21 on Sapphire Rapids; a virtual machine's generic model) and OPENBLAS_CORETYPE is unset, the kernels
 * the CPU's features allow (SkylakeX for AVX-512, Haswell for AVX2 + FMA, Sandybridge for AVX). Returns a
 * note saying so, or NULL when OpenBLAS's own choice stands. */
const char *zr_blas_core(void);

#endif
