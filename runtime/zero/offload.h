/* Host side of the ZeRO engine when the fp32 master partition lives on the CPU (optimizer
 * offload, or any CPU run): zero.c hands it the partition and calls it for
 *   - gradient intake: a bucket's reduced segment is added into the fp32 gradient partition
 *     gpart. From a GPU the copy is an async D2H on a copy stream (ordered after the compute
 *     stream by an event, and the compute stream ordered after it) into gpart itself or a
 *     pinned staging buffer, added in only when needed, so it overlaps the rest of backward;
 *   - lazy zeroing: after zero_grad, a parameter's first gradient overwrites its range of gpart
 *     instead of adding to zeros; ranges nobody wrote are zeroed at the next sync;
 *   - the fused CPU passes (kernels/cpu/offload.h): sum of squares, AdamW with the gradient
 *     scale that also writes the new 16-bit weights;
 *   - weights back: those 16-bit weights sit in one pinned host buffer and go to the device
 *     with async H2D copies on the copy stream that the compute stream waits for.
 * ZRUN_OFFLOAD_PROFILE=1 prints one line per optimizer step (stderr) with where the host time
 * went, as ZRUN_MEM_TRACE does for memory. Not thread-safe: one engine, one thread. */
#ifndef ZR_ZERO_OFFLOAD_H
#define ZR_ZERO_OFFLOAD_H

#include "core/tensor.h"
#include "kernels/base/adamw.h" /* zr_adamw_config */

typedef struct zr_offload zr_offload;

/* One parameter's chunk: gpart[off : off+n] (n may be 0), with its weight decay. Sorted by off. */
typedef struct {
    int64_t off, n;
    double wd;
} zr_offload_segment;

/* gpart: the host f32 gradient partition (retained). dev, pdt: the parameters' device and dtype.
 * cap: the largest bucket segment that grad_add copies from a GPU (sizes the staging buffer).
 * pinned: the partition buffers are page-locked, so copies may run asynchronously.
 * lazy: only grad_add writes gpart (it is not the parameters' .grad), so zeroing may wait. */
zr_offload *zr_offload_new(zr_tensor *gpart, zr_device dev, zr_dtype pdt, int n, const zr_offload_segment *segs,
                           int64_t cap, int pinned, int lazy);
/* Waits for copies in flight, then frees. NULL-safe. */
void zr_offload_free(zr_offload *o);
/* The state whose gradient partition is exactly the tensor gpart, or NULL. */
zr_offload *zr_offload_find(const zr_tensor *gpart);

/* gpart[doff : doff+len] += src (a contiguous 1-D tensor of len f32/bf16/f16 elements on the
 * host or on the GPU of dev). soff: src's offset within its bucket buffer, which names its slot
 * in the staging buffer. The bucket buffer may be overwritten (stream-ordered) after this returns. */
zr_status zr_offload_grad_add(zr_offload *o, int64_t doff, zr_tensor *src, int64_t soff);
/* Waits for the gradient copies and adds them in; zeroes ranges no gradient reached. After it
 * gpart holds the dense accumulated gradients. */
zr_status zr_offload_grad_sync(zr_offload *o);
/* Makes gpart zero: lazily (lazy mode), else with a parallel fill. */
zr_status zr_offload_grad_zero(zr_offload *o);
/* Sum of squares of gpart (synced first), accumulated in double. */
zr_status zr_offload_sumsq(zr_offload *o, double *out);

/* The optimizer c->kind (AdamW, Lion, Adagrad, SGD; Lamb's second pass) on every segment: master, m,
 * v (f32, S; m, v NULL where the optimizer keeps fewer states) updated in place from gpart *
 * grad_scale, segment k with learning rate lr[k] (its parameter group's) and its own weight decay;
 * c: the betas, eps, .... lamb_sums: Lamb's sums of p^2 and u^2 per segment (2 n, all ranks'
 * pieces added up), NULL for the others. When out is not NULL, the new weights are written there as
 * pdt (S elements, partition layout). */
zr_status zr_offload_adamw(zr_offload *o, float *master, float *m, float *v, double grad_scale, int64_t step,
                           const zr_adamw_config *c, const double *lr, const double *lamb_sums, void *out);
/* The same on segments k0 .. k1-1 only (so their new weights can be uploaded while the next
 * segments are updated). */
zr_status zr_offload_adamw_range(zr_offload *o, int k0, int k1, float *master, float *m, float *v, double grad_scale,
                                 int64_t step, const zr_adamw_config *c, const double *lr, const double *lamb_sums,
                                 void *out);
/* Lamb's first pass (lamb_sums_cpu) over the n segments segs (the caller's: each parameter's valid
 * piece, in segment order): m, v updated from gpart * grad_scale, sums (2 n) written. */
zr_status zr_offload_lamb_sums(zr_offload *o, const float *master, float *m, float *v, double grad_scale,
                               const zr_adamw_config *c, const zr_adamw_segment *segs, double *sums);
/* out (pdt, S) = master (f32, S), rounded (after a checkpoint load). */
zr_status zr_offload_cast(zr_offload *o, void *out, const float *master);

/* The host buffer of S pdt elements for the new weights (pinned when the partition is), made on
 * first use; waits until an upload from it has finished. NULL with an error on failure. */
void *zr_offload_weights16(zr_offload *o);
/* dst (contiguous, pdt, on dev or the host)[0 : n] = weights16[hoff : hoff+n]. On a GPU an async
 * H2D on the copy stream; zr_offload_upload_end then makes the compute stream wait for them. */
zr_status zr_offload_upload(zr_offload *o, zr_tensor *dst, int64_t hoff, int64_t n);
zr_status zr_offload_upload_end(zr_offload *o);

/* End of an optimizer step: prints the profile line when ZRUN_OFFLOAD_PROFILE is set. */
void zr_offload_step_end(zr_offload *o);

#endif
