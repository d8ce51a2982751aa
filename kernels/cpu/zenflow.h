/* CPU kernels for ZenFlow's selective update (runtime/zero/zenflow.c): per-column gradient
 * importance, gathering/scattering a weight's selected columns, and AdamW on those columns only.
 * A weight is (rows, cols) row-major; a "column" is w[:, j] (the input feature j of a Linear).
 * idx: k sorted column indices (int32), or NULL for every column (k = cols; 1-D parameters). */
#ifndef ZR_KERNELS_CPU_ZENFLOW_H
#define ZR_KERNELS_CPU_ZENFLOW_H

#include <stdint.h>

#include "../base/dtype.h"

/* out[j] = sum_i |g[i, j]| (f32 accumulation), g (rows, cols) f32. */
void zenflow_colsum_cpu(float *out, const float *g, int64_t rows, int64_t cols);
/* sum_i |a[i] - prev[i]| in double, in index order (prev read as zeros when !have_prev); keep:
 * prev[i] = a[i] afterwards (the next micro-step's "previous" sum, one pass over both). update_interval
 * "auto"'s mass of one micro-step's gradient, told apart from the window's running sum a. */
double zenflow_absdiff_sum_cpu(const float *a, float *prev, int64_t n, int have_prev, int keep);
/* out (rows, k) = src[:, idx] (dt: element bytes esz, 2 or 4). */
void zenflow_gather_cpu(void *out, const void *src, int esz, int64_t rows, int64_t cols, const int32_t *idx, int64_t k);
/* dst[:, idx] = src (rows, k). */
void zenflow_scatter_cpu(void *dst, const void *src, int esz, int64_t rows, int64_t cols, const int32_t *idx, int64_t k);
/* torch.optim.AdamW step t on the selected columns of p (rows, cols; pdt f32 or bf16), with the
 * gradient g[:, idx] (g (rows, cols) f32), or with g itself when g_sel (g (rows, k) f32: the selected
 * columns' gradient, gathered); m, v (rows, k) f32:
 *   p *= 1 - lr*wd;  m += (1-b1)(g-m);  v = b2 v + (1-b2) g^2;
 *   p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps)      (scalars in double, once) */
void zenflow_adamw_cpu(void *p, zr_dtype pdt, const float *g, int g_sel, float *m, float *v, int64_t rows,
                       int64_t cols, const int32_t *idx, int64_t k, double lr, double b1, double b2, double eps,
                       double wd, int64_t step);

#endif
