/* ZenFlow's selective column update on tensors (zero_optimization.zenflow; the schedule lives in
 * lua/zrun/zenflow.lua, DeepSpeed's semantics are written down in zenflow.c). A weight w is seen as
 * (rows, cols) = its 2-D shape, a 1-D parameter as (1, n); idx: a contiguous i32 tensor of k
 * column indices on w's device, or NULL for every column. */
#ifndef ZR_ZERO_ZENFLOW_H
#define ZR_ZERO_ZENFLOW_H

#include "core/tensor.h"

/* out (cols, f32) = sum over rows of |g| per column; g (rows, cols) f32, contiguous. */
zr_status zr_zenflow_colsum(zr_tensor *out, zr_tensor *g);
/* One sum of zr_zenflow_absdiff_sums: sums[slot] (0-based) = sum |a - prev| in double, rounded to f32
 * (prev: NULL or !have_prev reads zeros); keep: prev takes a's values in the same pass. a, prev: f32,
 * contiguous, the same numel, on the sums' device. */
typedef struct {
    int64_t slot;
    zr_tensor *a, *prev;
    int have_prev, keep;
} zr_zenflow_absdiff;
/* update_interval "auto": the masses of one micro-step's gradients (each from the window's running sum
 * and a kept copy of the previous micro-step's, one pass) and of its selected columns', n sums at once:
 * on CUDA one launch over every entry's chunks and one that totals them, with one workspace and the
 * entries' table copied to the device without waiting for the GPU (each entry's sum deterministic, in
 * a fixed order: kernels/cuda/zenflow.h); on the CPU each in index order. Refused: two entries with one
 * slot, a kept prev that shares memory with any a or other prev (the entries run in any order). */
zr_status zr_zenflow_absdiff_sums(zr_tensor *sums, const zr_zenflow_absdiff *e, int64_t n);
/* out (rows, k) = src[:, idx]; src contiguous (rows, cols), out contiguous, same dtype and device. */
zr_status zr_zenflow_gather(zr_tensor *out, zr_tensor *src, zr_tensor *idx);
/* dst[:, idx] = src (rows, k). */
zr_status zr_zenflow_scatter(zr_tensor *dst, zr_tensor *src, zr_tensor *idx);
/* torch.optim.AdamW step `step` on p[:, idx] (f32 or bf16) with the gradient g[:, idx] (g f32 (rows,
 * cols)) or g itself (f32 (rows, k): the selected columns' gradient, gathered), moments m, v f32 (rows, k). */
zr_status zr_zenflow_adamw(zr_tensor *p, zr_tensor *g, zr_tensor *idx, zr_tensor *m, zr_tensor *v,
                           double lr, double beta1, double beta2, double eps, double wd, int64_t step);

#endif
