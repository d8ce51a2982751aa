/* CPU kernels for ZenFlow's selective column update (see zenflow.h). f32 arithmetic, bf16
 * parameters widened and rounded to nearest even; OpenMP over rows. */
#include "zenflow.h"

#include <math.h>
#include <string.h>

void zenflow_colsum_cpu(float *out, const float *g, int64_t rows, int64_t cols) {
    memset(out, 0, sizeof(float) * (size_t)cols);
    for (int64_t i = 0; i < rows; i++) { /* row by row: contiguous reads, the same order as a loop */
        const float *r = g + i * cols;
        for (int64_t j = 0; j < cols; j++) out[j] += fabsf(r[j]);
    }
}

double zenflow_absdiff_sum_cpu(const float *a, float *prev, int64_t n, int have_prev, int keep) {
    double acc = 0;
    for (int64_t i = 0; i < n; i++) {
        const float x = a[i];
        acc += fabs((double)x - (have_prev ? (double)prev[i] : 0.0));
        if (keep) prev[i] = x;
    }
    return acc;
}

void zenflow_gather_cpu(void *out, const void *src, int esz, int64_t rows, int64_t cols, const int32_t *idx, int64_t k) {
#pragma omp parallel for if (rows * k > 65536)
    for (int64_t i = 0; i < rows; i++) {
        const char *s = (const char *)src + (size_t)(i * cols) * (size_t)esz;
        char *o = (char *)out + (size_t)(i * k) * (size_t)esz;
        if (!idx) memcpy(o, s, (size_t)(k * esz));
        else
            for (int64_t c = 0; c < k; c++) memcpy(o + c * esz, s + (int64_t)idx[c] * esz, (size_t)esz);
    }
}

void zenflow_scatter_cpu(void *dst, const void *src, int esz, int64_t rows, int64_t cols, const int32_t *idx, int64_t k) {
#pragma omp parallel for if (rows * k > 65536)
    for (int64_t i = 0; i < rows; i++) {
        char *d = (char *)dst + (size_t)(i * cols) * (size_t)esz;
        const char *s = (const char *)src + (size_t)(i * k) * (size_t)esz;
        if (!idx) memcpy(d, s, (size_t)(k * esz));
        else
            for (int64_t c = 0; c < k; c++) memcpy(d + (int64_t)idx[c] * esz, s + c * esz, (size_t)esz);
    }
}

void zenflow_adamw_cpu(void *p, zr_dtype pdt, const float *g, int g_sel, float *m, float *v, int64_t rows,
                       int64_t cols, const int32_t *idx, int64_t k, double lr, double b1, double b2, double eps,
                       double wd, int64_t step) {
    const float decay = (float)(1.0 - lr * wd), a1 = (float)(1.0 - b1), fb2 = (float)b2, a2 = (float)(1.0 - b2);
    const float step_size = (float)(lr / (1.0 - pow(b1, (double)step)));
    const float bc2s = (float)sqrt(1.0 - pow(b2, (double)step)), feps = (float)eps;
#pragma omp parallel for if (rows * k > 65536)
    for (int64_t i = 0; i < rows; i++) {
        for (int64_t c = 0; c < k; c++) {
            int64_t j = i * cols + (idx ? idx[c] : c), s = i * k + c;
            float gr = g[g_sel ? s : j];
            float w = pdt == ZR_BF16 ? zr_bf16_to_f32(((uint16_t *)p)[j]) : ((float *)p)[j];
            w *= decay;
            m[s] += a1 * (gr - m[s]);
            v[s] = fb2 * v[s] + a2 * gr * gr;
            w -= step_size * m[s] / (sqrtf(v[s]) / bc2s + feps);
            if (pdt == ZR_BF16) ((uint16_t *)p)[j] = zr_f32_to_bf16(w);
            else ((float *)p)[j] = w;
        }
    }
}
