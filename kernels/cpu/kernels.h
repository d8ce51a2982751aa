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

#endif
