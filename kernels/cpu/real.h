/* CPU reference kernels are written once over `real` and compiled twice by the Makefile:
 * with -DZR_REAL_F64 (real = double, names end in _f64; used by the float64 finite-difference
 * gradient checks) and without (real = float, names end in _f32). bf16/f16 tensors are widened
 * to f32 by the ops layer before they reach a CPU kernel. K(name) gives the suffixed name. */
#ifndef ZR_REAL_H
#define ZR_REAL_H

#include <math.h>
#include <stdint.h>

#ifdef ZR_REAL_F64
typedef double real;
#define K(name) name##_f64
#define R_EXP exp
#define R_LOG log
#define R_SQRT sqrt
#define R_TANH tanh
#define R_ERF erf
#define R_POW pow
#define R_FABS fabs
#define R_COS cos
#define R_SIN sin
#define REAL_MAX 1.7976931348623157e308
#else
typedef float real;
#define K(name) name##_f32
#define R_EXP expf
#define R_LOG logf
#define R_SQRT sqrtf
#define R_TANH tanhf
#define R_ERF erff
#define R_POW powf
#define R_FABS fabsf
#define R_COS cosf
#define R_SIN sinf
#define REAL_MAX 3.402823466e38f
#endif

/* glibc's vector exp, log, tanh and erf (libmvec: AVX2 lanes, within 4 ulp; tanh and erf since glibc
 * 2.35) for `omp simd` loops that call R_EXP, R_LOG, R_TANH, R_ERF; math.h declares the vector
 * variants only under -ffast-math. */
#pragma omp declare simd notinbranch
float expf(float);
#pragma omp declare simd notinbranch
double exp(double);
#pragma omp declare simd notinbranch
float logf(float);
#pragma omp declare simd notinbranch
double log(double);
#pragma omp declare simd notinbranch
float tanhf(float);
#pragma omp declare simd notinbranch
double tanh(double);
#pragma omp declare simd notinbranch
float erff(float);
#pragma omp declare simd notinbranch
double erf(double);

#endif
