/* CPU reference for rotary position embeddings (Hugging Face rotate_half layout) and for the
 * cos/sin tables, including the llama3 frequency rule. fp32 or fp64 per real.h; in fp32 the
 * tables are computed in float like transformers does, so they match it bit for bit up to libm. */
#include "kernels.h" /* first: it defines and undefines real/K for declarations */
#include "real.h"

void K(rope_forward_cpu)(real *y, const real *x, const real *cos, const real *sin, int64_t BH,
                         int64_t T, int64_t Dh, int64_t R) {
    int64_t h = R / 2;
    _Pragma("omp parallel for schedule(static) if (BH * T * Dh > 32768)")
    for (int64_t bt = 0; bt < BH * T; bt++) {
        int64_t t = bt % T;
        const real *xr = x + bt * Dh, *c = cos + t * R, *s = sin + t * R;
        real *yr = y + bt * Dh;
        for (int64_t i = 0; i < h; i++) {
            yr[i] = xr[i] * c[i] - xr[i + h] * s[i];
            yr[i + h] = xr[i + h] * c[i + h] + xr[i] * s[i + h];
        }
        for (int64_t i = R; i < Dh; i++) yr[i] = xr[i]; /* not rotated (partial rotary) */
    }
}

void K(rope_backward_cpu)(real *dx, const real *dy, const real *cos, const real *sin, int64_t BH,
                          int64_t T, int64_t Dh, int64_t R) {
    int64_t h = R / 2;
    _Pragma("omp parallel for schedule(static) if (BH * T * Dh > 32768)")
    for (int64_t bt = 0; bt < BH * T; bt++) {
        int64_t t = bt % T;
        const real *g = dy + bt * Dh, *c = cos + t * R, *s = sin + t * R;
        real *d = dx + bt * Dh;
        for (int64_t i = 0; i < h; i++) {
            d[i] = g[i] * c[i] + g[i + h] * s[i + h];
            d[i + h] = g[i + h] * c[i + h] - g[i] * s[i];
        }
        for (int64_t i = R; i < Dh; i++) d[i] = g[i];
    }
}

void K(rope_inv_freq_cpu)(real *inv_freq, int64_t Dh, double theta, int llama3, double factor,
                          double low_freq_factor, double high_freq_factor, double original_max_pos,
                          const double *ext, int yarn, double yarn_low, double yarn_high) {
    int64_t h = Dh / 2;
    for (int64_t i = 0; i < h; i++) {
        /* transformers: 1.0 / (base ** (arange(0, dim, 2).float() / dim)); longrope:
         * 1.0 / (ext_factors * base ** (...)), the product rounded to float first */
        real p = R_POW((real)theta, (real)(2 * i) / (real)Dh);
        real f = ext ? (real)1 / ((real)ext[i] * p) : (real)1 / p;
        if (yarn) {
            /* transformers, in float32: ramp = clamp((i - low) / (high - low), 0, 1) (high - low
             * a Python float), e = 1 - ramp, inv = 1 / (factor · p) · (1 − e) + 1 / p · e */
            real ramp = ((real)i - (real)yarn_low) / (real)(yarn_high - yarn_low);
            ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
            const real e = (real)1 - ramp;
            /* each product rounded apart, as torch's separate ops (no fused multiply-add) */
            volatile real a = (real)1 / ((real)factor * p) * ((real)1 - e), b = f * e;
            f = a + b;
        }
        if (llama3) {
            /* transformers _compute_llama3_parameters: long wavelengths are divided by factor,
             * short ones kept, and the band in between interpolated smoothly. */
            real old = (real)original_max_pos, fac = (real)factor;
            real lo = (real)low_freq_factor, hi = (real)high_freq_factor;
            real low_wavelen = (real)(original_max_pos / low_freq_factor);
            real high_wavelen = (real)(original_max_pos / high_freq_factor);
            real wavelen = (real)(2 * M_PI) / f;
            real fl = wavelen > low_wavelen ? f / fac : f;
            if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen)) {
                real smooth = (old / wavelen - lo) / (hi - lo);
                fl = ((real)1 - smooth) * fl / fac + smooth * fl;
            }
            f = fl;
        }
        inv_freq[i] = f;
    }
}

void K(rope_tables_cpu)(real *cos_t, real *sin_t, const real *inv_freq, int64_t T, int64_t Dh,
                        int64_t offset, double attention_scale) {
    int64_t h = Dh / 2;
    real sc = (real)attention_scale;
    _Pragma("omp parallel for schedule(static) if (T * Dh > 32768)")
    for (int64_t t = 0; t < T; t++) {
        real pos = (real)(offset + t);
        for (int64_t i = 0; i < h; i++) {
            real a = pos * inv_freq[i]; /* emb = cat(freqs, freqs) */
            real c = R_COS(a) * sc, s = R_SIN(a) * sc;
            cos_t[t * Dh + i] = cos_t[t * Dh + i + h] = c;
            sin_t[t * Dh + i] = sin_t[t * Dh + i + h] = s;
        }
    }
}
