/* Private to the ZeRO engine's files: the engine's struct and the helpers they share. engine.c holds
 * the layout, set-up, gradient buckets and stage 3; engine_step.c the optimizer step and the weights'
 * refresh; engine_async.c ZenFlow's background host step. Nothing else includes this. */
#ifndef ZR_ZERO_ENGINE_INTERNAL_H
#define ZR_ZERO_ENGINE_INTERNAL_H

#include <stdint.h>

#include "zero/comm.h"
#include "zero/engine.h"
#include "zero/offload.h"

typedef struct {
    zr_tensor *p;   /* the parameter (retained) */
    /* its elements; its chunk on each rank (ceil(numel / chunks)); the chunk's offset in the
     * partition */
    int64_t numel, chunk, offset;
    int ndim;
    int64_t shape[ZR_MAX_DIMS];
    double wd;
    int gathered;   /* stage 3 */
    int persistent; /* stage 3: below stage3_param_persistence_threshold, never released */
    zr_tensor *g_out; /* stage 3: an all-gather in flight (prefetch): its chunks and handle */
    zr_comm_handle *g_h;
    int packed;   /* gradient already in a bucket this backward */
} zparam;

struct zr_zero {
    zr_zero_config cfg;
    int chunks; /* chunks per parameter: world size, or 1 at stage 0 */
    int nparams;
    zparam *params;
    int64_t part_numel, max_chunk; /* elements of this rank's partition; the largest chunk */
    zr_device dev, opt_dev;
    /* the parameters; the gradient buckets and their reduction; the gradient partition */
    zr_dtype param_dtype, comm_dtype, grad_dtype;
    zr_dtype master_dtype, state_dtype; /* of master (dmaster) and of the optimizer's states: f32 or bf16 */
    zr_tensor *master, *m, *v, *gpart, *pshard; /* m, v: NULL where the optimizer keeps fewer states */
    struct zasync *async; /* ZenFlow's overlap_step: the host step on a background thread, or NULL */
    zr_tensor *lamb_sums; /* Lamb: f64 (2 nparams) on opt_dev, each parameter's sums of p^2 and u^2 */
    /* Partial offload (offload_optimizer.ratio < 1): partition elements [0, split) keep their master
     * and states on the parameters' device (dmaster, dm, dv: split elements, updated there by the
     * optimizer kernels), [split, S) on the host (master, m, v: S - split elements, through the
     * offload pipeline). The gradient partition stays whole on the device. split 0: no device part. */
    int64_t split;
    zr_tensor *dmaster, *dm, *dv;
    int nstates;        /* zr_optim_states(cfg.optimizer, cfg.momentum) */
    /* gradient bucket: `chunks` segments of bucket_cap elements each, filled to bucket_fill */
    int64_t bucket_cap, bucket_fill;
    int64_t gather_cap; /* stages 1-2: the new weights' all-gather, per rank (allgather_bucket_size / chunks) */
    /* the bucket's pieces: parameter, offset in its chunk, length, place in the bucket */
    int *bucket_param;
    int64_t *bucket_off, *bucket_len, *bucket_place;
    int bucket_pieces;
    zr_tensor *send, *compact, *recv;
    int boundary;
    /* One chunk per parameter (stage 0, or world size 1) with the partition on the parameters'
     * device: gradients are views into gpart (fp32) and parameters views into one flat buffer, so
     * no bucket copies are needed and the CUDA AdamW writes the 16-bit weights directly. */
    int direct;
    zr_tensor *pflat;
    int pinned; /* the host gradient partition is page-locked (host-gradient mode with pin_memory) */
    /* offload_param with param_pin_memory on a GPU: pshard is page-locked; the event follows the last
     * upload from it (the step waits for it before writing the shard) */
    int pshard_pinned;
    void *pshard_ev;
    zr_offload *host; /* master on the host: gradient intake, the step's chunk pipeline */
    /* optimizer offload with the gradient partition on the parameters' device (offload.h's device
     * mode): gpart is reduced into as without offload and zr_offload_run fetches it chunk by chunk */
    int grads_dev;
    /* overlap_comm (chunks > 1, bucketed modes): a second buffer set, and the bucket whose
     * reduce-scatter is in flight (its parameters, where its result lands, its handle) */
    zr_tensor *send2, *compact2, *recv2;
    int *pending_param;
    int64_t *pending_off, *pending_len, *pending_place;
    int pending_pieces;
    zr_tensor *pending_result;
    zr_comm_handle *pending_handle;
    int64_t live; /* stage 3: elements of non-persistent parameters gathered or in flight */
    char **names; /* parameter names for collective messages (cfg->names copied), or NULL */
};

/* Elements of chunk r (chunk size c) that lie inside a parameter of n elements. */
static inline int64_t valid_len(int64_t n, int64_t c, int r) {
    int64_t lo = (int64_t)r * c, hi = lo + c < n ? lo + c : n;
    return hi > lo ? hi - lo : 0;
}

/* 1-D view of elements [start, start+len) of a contiguous tensor. */
static inline zr_tensor *flat_range(zr_tensor *t, int64_t start, int64_t len) {
    int64_t st = 1;
    return zr_tensor_as_strided(t, 1, &len, &st, t->offset + start);
}

static inline zr_tensor *new_buf(zr_dtype dt, zr_device dev, int64_t n, zr_mem_category cat) {
    return zr_tensor_new_cat(dt, dev, 1, &n, cat, 1);
}

/* An optimizer state's data, or NULL where the optimizer does not keep that state. */
static inline float *state_data(zr_tensor *t) {
    return t ? (float *)zr_tensor_data(t) : NULL;
}

/* The flat buffer in partition layout that holds the 16-bit weights, if there is one: the
 * parameters' own (direct mode: each a view at its partition offset) or the stage-3 shard. */
static inline zr_tensor *flat_weights(const zr_zero *z) {
    return z->direct ? z->pflat : z->cfg.stage == 3 ? z->pshard : NULL;
}

/* engine.c */
int zero_param_at(const zr_zero *z, int64_t off);
void zero_label_params(const zr_zero *z, const char *what, int a, int b);
/* offload_param: returns once no upload still reads the host parameter shard (before it is rewritten). */
zr_status zero_shard_idle(zr_zero *z);
zr_status zero_copy_range(zr_tensor *dst, int64_t doff, zr_tensor *src, int64_t soff, int64_t len);
zr_status zero_state_get(zr_zero *z, int st, zr_tensor *dst, int64_t doff, int64_t off, int64_t len);
zr_status zero_flush_stale(zr_zero *z);
/* engine_step.c */
zr_status zero_allgather_weights(zr_zero *z, zr_tensor *w);
/* engine_async.c: joins the background step and frees its buffers (zr_zero_free) */
void zero_async_free(zr_zero *z);

#endif
