/* Host side of the ZeRO engine when the fp32 master partition lives on the CPU (optimizer
 * offload, or any CPU run). The engine (engine.c, engine_step.c) hands it the partition's layout
 * and calls it for
 *   - gradient intake (host-gradient mode): a bucket's reduced segment is added into the host
 *     gradient partition gpart (f32). From a GPU the copy is an async D2H on a copy stream
 *     (ordered after the compute stream by an event, and the compute stream after it) into gpart
 *     itself or a pinned staging buffer, added in only when needed, so it overlaps backward;
 *   - lazy zeroing: after zero_grad, a parameter's first gradient overwrites its range of gpart
 *     instead of adding to zeros; ranges nobody wrote are zeroed at the next sync;
 *   - the optimizer step as a pipeline over chunks of the partition (zr_offload_run).
 *
 * Design of the step (issue 17). Two places for the gradient partition, chosen by the engine:
 *   device mode: the engine accumulates the gradient partition on the GPU exactly as without
 *     offload (fp32 or data_types.grad_accum_dtype), so micro-batches before the boundary ship
 *     nothing and the norm / overflow check run on the GPU; zr_offload_run then fetches it.
 *   host mode: gradients leave bucket by bucket during backward into gpart (above), for when
 *     the device partition does not fit.
 * zr_offload_run walks the partition in chunks of C elements (ZRUN_OFFLOAD_CHUNK, default 16M)
 * through a ring of R pinned slots: D2H of chunk k+R-1 (copy stream) || CPU AdamW of chunk k
 * (OpenMP, one parallel region per chunk; AVX-512/AVX2 clones picked at load time) writing the
 * new 16-bit weights into an out slot with streaming stores (no read-for-ownership) || H2D of
 * chunk k-1 from its out slot into the parameters (upload stream). The compute stream waits for
 * the last upload. Host memory in device mode: fp32 master + optimizer states + the ring (R x C x
 * 4 bytes of in-slots, and R x C x 2 of out-slots where the weights are uploaded); no host
 * gradient partition and no host copy of the 16-bit weights. Host mode adds the gradient
 * partition (4 B/param, or 2 with data_types.grad_accum_dtype bf16/fp16: each addition then rounds
 * to it, as on the device) and gradient staging. On a CPU
 * run the same loop runs with memcpy for the copies, so CI exercises its bookkeeping.
 *
 * Partial offload (offload_optimizer.ratio < 1, engine.c's split): the engine keeps the head of
 * the partition's master and states on the GPU and updates it with the GPU optimizer kernels,
 * queued after zr_offload_mark; the pass then covers only the host part [split, S), with master,
 * m, v holding elements from pass.base = split on. Its gradient copies start at the mark, so the
 * GPU kernel and the host pipeline run at the same time. Device-gradient mode only.
 *
 * ZRUN_OFFLOAD_PROFILE=1 prints one line per optimizer step (stderr): gradient copies, waits,
 * the CPU optimizer, uploads and the step's wall time (the GPU idles for it). Not thread-safe:
 * one engine, one thread. */
#ifndef ZR_ZERO_OFFLOAD_H
#define ZR_ZERO_OFFLOAD_H

#include "core/tensor.h"
#include "kernels/base/adamw.h" /* zr_adamw_config */

typedef struct zr_offload zr_offload;

/* One parameter's chunk: partition[off : off+n] (n may be 0), with its weight decay. Sorted by off. */
typedef struct {
    int64_t off, n;
    double wd;
} zr_offload_segment;

/* S: partition elements. gpart: the host gradient partition, f32, bf16 or f16 (retained; host mode), or NULL
 * (device mode: zr_offload_run reads the gradients it is given). dev, pdt: the parameters'
 * device and dtype. cap: the largest bucket segment that grad_add copies from a GPU (sizes the
 * staging buffer). pinned: page-lock host buffers so copies may run asynchronously.
 * lazy: only grad_add writes gpart (it is not the parameters' .grad), so zeroing may wait.
 * Reads ZRUN_OFFLOAD_CHUNK (elements per pipeline chunk), ZRUN_OFFLOAD_STREAM (1, the default:
 * AdamW writes the new weights with streaming stores, fenced before their upload is enqueued; 0:
 * normal stores, for comparison) and ZRUN_OFFLOAD_PROFILE. */
zr_offload *zr_offload_new(int64_t S, zr_tensor *gpart, zr_device dev, zr_dtype pdt, int n,
                           const zr_offload_segment *segs, int64_t cap, int pinned, int lazy);
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
/* Sum of squares of a contiguous f32/bf16/f16 host tensor, accumulated in double. */
zr_status zr_offload_sumsq_tensor(zr_tensor *t, double *out);

/* Enqueues dst (contiguous, pdt, on the GPU or the host)[0 : n] = src[0 : n] (host, pdt). On a
 * GPU an async H2D on the upload stream: src must stay untouched until the upload has run
 * (the ring's out slots are; zr_offload_run's end makes the compute stream wait). */
typedef zr_status (*zr_offload_sink)(void *ctx, zr_offload *o, int64_t off, int64_t n, const void *src);
zr_status zr_offload_put(zr_offload *o, zr_tensor *dst, const void *src, int64_t n);

/* One pass over the partition range [lo, hi) (segments cut anywhere), chunk by chunk. */
typedef struct {
    /* The gradient partition (S elements, f32/bf16/f16): a GPU tensor (device mode), a host
     * tensor (copied through the ring all the same), or NULL: the host partition gpart. */
    zr_tensor *grads;
    /* f32, host, from partition element `base` on (master[0] is element base: 0, or the start of
     * the host part with offload_optimizer.ratio < 1); m, v NULL where the optimizer keeps fewer states */
    float *master, *m, *v;
    int64_t base;
    double grad_scale;
    int64_t step;
    const zr_adamw_config *c; /* NULL: no optimizer, only the new weights from master (cast) */
    const double *lr;         /* one per segment */
    void *out;                /* host pdt (S) the new weights go to in place, or NULL */
    zr_offload_sink sink;     /* else, if set: called per chunk with its new weights (out slot) */
    void *ctx;
    int64_t lo, hi;
    /* Lamb (c->kind ZR_OPTIM_LAMB) runs as two passes over the same range: lamb 1 reads the
     * gradients, updates the moments and adds each parameter's sums of p^2 and u^2 into
     * lamb_sums (2 per parameter; zeroed by the caller, then all-reduced over ranks); lamb 2 reads
     * no gradients and applies the update with those sums, writing the new weights as above.
     * lamb_segs: each parameter's valid piece of the partition (padding never counts in a norm). */
    int lamb;
    double *lamb_sums;
    const zr_adamw_segment *lamb_segs;
    /* bf16_master_weights_and_grads / bf16_optimizer_states (AdamW only): the dtypes master and
     * m, v really hold (ZR_F32: as declared above; ZR_BF16: the pointers hold bf16 bit patterns) */
    zr_dtype master_dt, state_dt;
} zr_offload_pass;
zr_status zr_offload_run(zr_offload *o, const zr_offload_pass *p);
/* Allocates the ring's gradient slots now (a pass on another thread then allocates nothing). */
zr_status zr_offload_prepare(zr_offload *o);
/* Marks the point of the compute stream after which the next zr_offload_run's copies may start
 * (default: everything queued when it runs). Partial offload marks before it launches the device
 * part's optimizer kernel, so that the host part's gradients leave while that kernel runs. No-op
 * without a GPU. */
zr_status zr_offload_mark(zr_offload *o);

/* The optimizer (c->kind) on n contiguous host elements: master, m, v (f32; m, v NULL where the
 * optimizer keeps fewer states), gradients g (g_dt) times grad_scale, one segment's lr and weight
 * decay; the new weights into w (w_dt) when w is not NULL. The pipeline's update, also the CPU
 * twin of the device part's kernels on a CPU run. */
void zr_offload_update(float *master, float *m, float *v, const void *g, zr_dtype g_dt, int64_t n, void *w,
                       zr_dtype w_dt, const zr_adamw_config *c, double lr, double wd, double grad_scale, int64_t step);

/* Which gradient mode the engine chose ("device" or "host"), for the profile line. */
void zr_offload_set_mode(zr_offload *o, const char *mode);
/* End of an optimizer step: prints the profile line when ZRUN_OFFLOAD_PROFILE is set. */
void zr_offload_step_end(zr_offload *o);

#endif
