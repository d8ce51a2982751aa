/* The ZeRO engine: partitions optimizer state (stage 1), gradients (stage 2) and parameters
 * (stage 3) over the ranks of the world, as DeepSpeed does.
 *
 * Layout: every parameter i (n_i elements) is cut into W equal chunks of c_i = ceil(n_i/W)
 * elements (the last padded with zeros); rank r owns chunk r of every parameter. Its partition
 * buffers (fp32 master weights, Adam moments, reduced gradients) are the concatenation of its
 * chunks, S = sum c_i elements. Every collective is then an equal-count reduce-scatter or
 * all-gather over a bucket of parameters. Stage 0 uses W = 1 chunks and all-reduces.
 *
 * Per step: zr_zero_backward_begin (is this micro-step the accumulation boundary?), autograd
 * (leaf hooks feed gradients into buckets at stages 2–3), zr_zero_backward_end (flush), and at
 * the boundary zr_zero_reduce (stages 0–1), zr_zero_grad_norm, zr_zero_step, zr_zero_zero_grad.
 *
 * Passes over the gradients (N parameters, fp32 accumulation; traced on the CPU, issue 18). Folded
 * already: 1/gas rides on the loss (a scalar), 1/world, 1/loss scale and the clip coefficient in
 * the optimizer's one grad_scale (a device scalar read inside the update), zero_grad is lazy
 * (grad_stale: the next gradient overwrites). What remains, direct mode (stage 0, or one rank) on
 * a GPU: per micro-batch none beyond the GEMMs (dW accumulates into the fp32 partition with beta 1;
 * the tied embedding adds its rows); per step the norm (reads 4N bytes) and the fused optimizer
 * (AdamW: reads 16N, writes 14N with the 16-bit weights). On the CPU each micro-batch also adds a
 * separate dW into the partition. Over several ranks: stages 0-1 reduce at the boundary (pack 4N
 * into buckets, reduce, add into the partition) and stage 1 fills the whole .grad at zero_grad;
 * stages 2-3 pack every micro-batch's 16-bit dW (2N read, 2N written) into buckets as backward
 * runs and add the reduced segments into the partition. */
#ifndef ZR_ZERO_H
#define ZR_ZERO_H

#include "core/tensor.h"
#include "kernels/base/adamw.h" /* zr_adamw_config */

typedef struct {
    int stage;                  /* 0..3 */
    int64_t reduce_bucket_size; /* elements per reduce bucket (all ranks' segments together) */
    int64_t allgather_bucket_size;
    int offload_optimizer; /* master weights, moments and reduced grads on the host */
    int offload_param;     /* stage 3: parameter partitions on the host */
    int offload_grads_on_device; /* offload_optimizer: the gradient partition stays on the parameters'
                                  * device until the step (zero/offload.h's device mode), else on the host */
    double offload_ratio; /* offload_optimizer: the share of the partition whose master and optimizer
                           * states live on the host (DeepSpeed's offload_optimizer.ratio, 0..1; 1: all).
                           * Below 1 the head of the partition keeps them on the parameters' device
                           * and is updated there (needs offload_grads_on_device); see zr_zero_new */
    int64_t persistence_threshold; /* stage 3: parameters smaller than this stay whole */
    int64_t max_live_parameters;   /* stage 3: prefetching stops at this many gathered elements (0: no bound) */
    int pin_memory;        /* what DMA touches on the host in page-locked memory: the offload ring and
                            * staging, a host gradient partition (CUDA builds) */
    int param_pin_memory;  /* offload_param.pin_memory: the host parameter shard page-locked (CUDA builds),
                            * each gathered slice uploaded by DMA on the comm stream */
    int overlap_comm;      /* a bucket's reduce-scatter runs while the next bucket fills */
    int keep_grads; /* stage 2 over several ranks (ZenFlow, lua/zrun/zenflow.lua): a gradient stays on its
                     * parameter after its bucket copy, until the next backward_begin drops it, so that
                     * the micro-step's own (unreduced) gradient can be read after backward */
    int comm_dtype; /* dtype of the gradient buckets and their reduction (a zr_dtype), or -1: the
                     * parameters' dtype (DeepSpeed's communication_data_type default); fp32
                     * buckets in a single process, where nothing is communicated */
    int grad_dtype; /* dtype of the gradient partition (a zr_dtype; DeepSpeed's
                     * data_types.grad_accum_dtype), or -1: fp32. 16-bit needs the optimizer on a GPU */
    int optimizer;         /* zr_optim_kind: which states the partition keeps (zr_optim_states) */
    /* DeepSpeed's bf16.bf16_master_weights_and_grads (master_dtype ZR_BF16: the master partition in
     * bf16, which the parameters must be) and bf16.bf16_optimizer_states (state_dtype ZR_BF16: AdamW's
     * moments in bf16). Zero-initialised: ZR_F32. AdamW only, and no offload_optimizer.ratio < 1.
     *
     * What DeepSpeed does (read at edaa72212: runtime/config.py, base_optimizer.py
     * _configure_master_weights, zero/stage_1_and_2.py, zero/stage3.py, ops/adam, csrc/adam): both keys
     * need ZeRO stage 1-3; bf16_optimizer_states needs bf16_master_weights_and_grads; a bf16 master
     * with fp32 moments needs offload_optimizer (DeepSpeedCPUAdam keeps them fp32 on the host), bf16
     * moments run on the GPU (FusedAdam) or offloaded (DeepSpeedCPUAdam, fp32_optimizer_states=False).
     * The master partition and its gradient partition are bf16; the gradients are reduced in
     * communication_data_type (bf16 by default) and the clip coefficient multiplies the bf16 gradient
     * partition in place (rounded to bf16). Each AdamW element is widened to f32, updated in f32
     * (m = b1 m + (1-b1) g; v = b2 v + (1-b2) g g; p -= lr ((m/bc1) / (sqrt(v/bc2) + eps) + wd p)),
     * and each state rounded to bf16 once when stored; the checkpoint holds the bf16 tensors.
     *
     * zrun: the same (offload_adamw_lp_pieces_cpu, adamw_lp_step_cuda), op by op as FusedAdam's kernel
     * and never contracted into FMAs, so the host, the CPU and a GPU give the same bits. Deliberate
     * differences: nvcc contracts FusedAdam into FMAs and DeepSpeedCPUAdam orders its operations its own
     * way, so either may land one bf16 ulp away where a value is within an f32 ulp of a tie; the ranks'
     * average rides in the gradient scale (rounded to bf16 with the clip coefficient) instead of the
     * reduction; refused where DeepSpeed would silently do something else or zrun has no twin:
     * grad_accum_dtype fp32 (DeepSpeed's BF16_Optimizer at stage 1 ignores both keys), torch_adam and
     * other optimizers (rounded per torch op), ZenFlow (DeepSpeed asserts), offload ratio < 1. */
    int master_dtype, state_dtype;
    double momentum;       /* SGD: 0 keeps no momentum buffer */
    double initial_accumulator_value; /* Adagrad: the state's starting value */
    int world_size, rank;  /* from comm; world_size 1 for a single process */
    const char *const *names; /* n parameter names for collective messages, or NULL (copied) */
} zr_zero_config;

typedef struct zr_zero zr_zero;

/* params: leaf tensors on one device (retained by the engine). weight_decay: per parameter. */
zr_zero *zr_zero_new(const zr_zero_config *cfg, int n, zr_tensor *const *params,
                     const double *weight_decay);
void zr_zero_free(zr_zero *z);

/* Partition size S (elements) and parameter i's chunk offset/size within it. */
int64_t zr_zero_partition_numel(const zr_zero *z);
void zr_zero_param_layout(const zr_zero *z, int i, int64_t *offset, int64_t *chunk);
/* Partition tensors (S) for checkpoints: 0 master, 1 exp_avg, 2 exp_avg_sq, 3 reduced grads (f32, or
 * the config's master_dtype / state_dtype / grad_dtype). The
 * one-state optimizers keep theirs as 1 (Lion exp_avg, Adagrad sum, SGD momentum_buffer); a state
 * the optimizer does not keep is NULL without an error (zr_zero_num_states says how many).
 * With partial offload (zr_zero_split > 0) states 0-2 are split between the device and the host:
 * the result is then a new host tensor holding both parts (the same S elements as at any ratio),
 * and writing into it changes nothing until zr_zero_set_state. */
zr_tensor *zr_zero_state(zr_zero *z, int which);
/* Copies t (S f32 elements, any device) into state `which` (0-2), both parts; a no-op when t is
 * the state tensor itself (what zr_zero_state returns without a split). */
zr_status zr_zero_set_state(zr_zero *z, int which, zr_tensor *t);
/* Partial offload: partition elements [0, split) keep master and states on the parameters' device;
 * 0 when everything is on one side. */
int64_t zr_zero_split(const zr_zero *z);
int zr_zero_num_states(const zr_zero *z);

zr_status zr_zero_backward_begin(zr_zero *z, int is_boundary);
zr_status zr_zero_backward_end(zr_zero *z);
/* Reduces the accumulated gradients into the partition (stages 0–1; no-op at 2–3). */
zr_status zr_zero_reduce(zr_zero *z);
/* Global L2 norm of the averaged gradients over all ranks (inf/nan when they overflowed). */
zr_status zr_zero_grad_norm(zr_zero *z, double scale, double *norm);
/* The optimizer (c->kind, which must be the engine's cfg.optimizer) on the partition with grads multiplied by grad_scale (1/world, 1/loss scale, clip),
 * then parameters refreshed (all-gather at stages 1–2). c: the betas and eps; lr: one learning
 * rate per parameter (its group's, as the scheduler left it), zr_zero_num_params values; each
 * parameter's weight decay (decoupled or L2, as the optimizer defines it) is the one it was added with. */
zr_status zr_zero_step(zr_zero *z, double grad_scale, int64_t step, const zr_adamw_config *c,
                       const double *lr);
/* ZenFlow's overlap_step (lua/zrun/zenflow.lua): the AdamW step of zr_zero_step on a background
 * host thread, against a snapshot of the gradient partition taken now (one more partition of
 * gpart's dtype on its device; queued on the compute stream, the thread's D2H copies start after
 * it on the offload copy stream). The master is updated in place; the new weights go to a host
 * buffer, not the parameters, until zr_zero_async_apply. set: which of two moment sets (DeepSpeed
 * alternates them by window parity; set 1 is allocated, zero, on first use). threads: the thread's
 * OpenMP threads (0: the default). One step at a time: it first waits for the last one, and
 * refuses while that one's weights are unapplied. */
zr_status zr_zero_step_async(zr_zero *z, double grad_scale, int64_t step, const zr_adamw_config *c, const double *lr,
                             int set, int threads);
/* Joins the background step (nothing when none runs); its error, if it had one. */
zr_status zr_zero_async_wait(zr_zero *z);
/* Joins, then copies its new weights into the parameters (nothing when none are pending); over
 * several ranks each rank's new partition is all-gathered into them, as zr_zero_refresh_params does. */
zr_status zr_zero_async_apply(zr_zero *z);
/* Checkpoints of overlap_step (lua/zrun/zenflow_state.lua): joins the step in flight, then returns
 * (retained, in *out) which = 0 the new weights (param dtype, the partition's S elements, host), 1 and 2
 * the second moment set (exp_avg, exp_avg_sq; f32, S); *out NULL when not allocated yet, unless create
 * (then allocated: the moments zero). Writing into them is writing the engine's own. */
zr_status zr_zero_async_state(zr_zero *z, int which, int create, zr_tensor **out);
/* 1 when the new weights are not yet in the parameters (zr_zero_async_apply copies them); set_pending
 * marks them so after a load (joins first; on needs them allocated). */
int zr_zero_async_pending(const zr_zero *z);
zr_status zr_zero_async_set_pending(zr_zero *z, int on);
/* 1 while a background step has not finished (never blocks). */
int zr_zero_async_busy(zr_zero *z);
/* Test hook: while on, a background step waits after its update, before it counts as finished. */
void zr_zero_async_hold(int on);
int zr_zero_num_params(const zr_zero *z);
zr_status zr_zero_zero_grad(zr_zero *z);
/* Writes the partition's master weights back into the parameters (after loading a checkpoint). */
zr_status zr_zero_refresh_params(zr_zero *z);

/* Stage 3: gathers / releases whole parameters (by index). Released parameters have shape (0). */
zr_status zr_zero_gather(zr_zero *z, int n, const int *idx);
/* Stage 3: starts the all-gathers of the listed parameters (in order) without waiting while the
 * elements started so far are below `budget` and below max_live_parameters minus the live total
 * (DeepSpeed's rule: the parameter that crosses the bound starts too); a later zr_zero_gather of
 * them completes them. Every rank must prefetch the same list. */
zr_status zr_zero_prefetch(zr_zero *z, int n, const int *idx, int64_t budget);
/* Stage 3: elements of (non-persistent) parameters gathered or being gathered now. */
int64_t zr_zero_live_numel(const zr_zero *z);
zr_status zr_zero_release(zr_zero *z, int n, const int *idx);
zr_status zr_zero_release_all(zr_zero *z);
/* 1 when stage 3 runs with every parameter resident (one process, parameters on their device:
 * nothing to gather); gather/prefetch/release are then no-ops. */
int zr_zero_is_resident(const zr_zero *z);
/* offload_param: whether the host parameter shard is page-locked (offload_param.pin_memory on a GPU). */
int zr_zero_shard_pinned(const zr_zero *z);
int zr_zero_is_gathered(const zr_zero *z, int i);

#endif
