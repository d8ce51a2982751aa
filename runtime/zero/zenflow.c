/* ZenFlow (DeepSpeed >= 0.17, zero_optimization.zenflow): the tensor side of the selective update;
 * lua/zrun/zenflow.lua runs the schedule. What DeepSpeed does (read from deepspeed/runtime/zenflow/
 * engine.py, zenflow_stage_1_and_2.py, zenflow_config.py, ops/adam/zenflow_torch_adam.py), in short:
 *
 * Where it applies. ZeRO stage 1/2 (stage 3 has its own engine_stage3.py, not in zrun) with
 *   offload_optimizer on the CPU ("Zenflow must be used with cpu offload"); the CPU optimizer is
 *   DeepSpeedCPUAdam (Adam/AdamW), the GPU-side one is always torch.optim.AdamW with the optimizer's
 *   lr, betas, eps and (one, global) weight_decay. gradient_allreduce_op "sum" is refused.
 * Steps. Every micro-batch is a ZenFlow step: the engine replaces gradient_accumulation_steps by
 *   update_interval U (so the loss is scaled by 1/U), and t (0-based micro-step) is an accumulation
 *   boundary when t+1 < full_warm_up_rounds W, or (t+1-W) % U == 0, or (t+1) % SI == 0 (SI: the
 *   engine's select interval, 0 = never). The LR scheduler steps at every micro-step.
 * Columns. A 2-D parameter (rows, cols) = torch's (out, in) has cols columns w[:, j] (DeepSpeed
 *   flattens 2-D tensors transposed so that a column is contiguous). Importance of column j = sum
 *   over rows of |g[:, j]| of the current micro-step's reduced gradient; the k = floor(topk_ratio *
 *   cols) largest are selected (indices sorted). 1-D parameters are always "selected" whole.
 * Selection happens at t >= W when t == W or (SI' != 0 and t % SI' == 0) (SI': the optimizer's
 *   interval). There, before backward: the fp32 master is overwritten by the 16-bit parameters
 *   (except at t = 0) and the selected columns' m, v are zeroed (their step counter is not).
 *   select_strategy "step": SI = SI' = select_interval. "epoch" (and "auto" = epoch with interval 1;
 *   an integer select_interval with "auto" is an error): SI = interval * len(training_dataloader)
 *   or 0 without one, SI' = interval * steps_per_epoch (the dataloader's length, else the
 *   config's steps_per_epoch) or 0. Fixed U needs SI >= U unless SI is 0 (and the same for SI').
 * The GPU side, for t >= W: a micro-step that is not a boundary runs AdamW (step counter per
 *   parameter, starting at 1 on its first update) on the selected columns and 1-D parameters with
 *   this micro-step's gradient, unclipped, at once. At a boundary their current values are saved
 *   before the CPU step, written back after it (the CPU result for them is discarded), then the
 *   same AdamW runs on them with this micro-step's gradient.
 * The CPU side accumulates the whole gradient (selected columns included) over the window and at
 *   the boundary clips it by the global norm of that sum (gradient_clipping) and runs Adam on the
 *   whole partition with bias-correction step t+1 (the micro-step count, not the number of CPU
 *   updates); the CPU keeps its own m, v and master for the selected columns, overwritten at the
 *   next selection. During the W warm-up micro-steps every micro-step is a plain offloaded step.
 * overlap_step (ZenFlowZeroOptimizerParallel, zenflow_utils.py, csrc/adam/cpu_adam_impl.cpp's
 *   ZenFlowAdam): the CPU Adam runs in a separate process on its own cores. At a boundary t the
 *   window's accumulated gradient is copied to one of two host buffers, state s = t & 1 in warm-up
 *   (t < W), else (t // U) & 1; step() takes the norm of that window's gradient, then
 *   - t < W: submits (clip by that norm, bias-correction step t+1, moments set s: the process keeps
 *     two sets of m, v and uses set s, so windows of alternate parity have separate moments), waits,
 *     and copies the result ("stale", the master after the step, cast) into the 16-bit parameters,
 *     selected columns included: warm-up is not overlapped;
 *   - t >= W: waits for the last submitted step and copies its result into the parameters, then
 *     submits this window's, which runs while the GPU computes the next window. The first boundary
 *     after warm-up has nothing in flight and skips the wait/copy. So window k's update reaches the
 *     model at window k+1's boundary, computed from window k's gradient at master as of window k.
 *   Then, as without overlap, the selected columns get the values saved before the step back and
 *   their own AdamW with this micro-step's gradient: they never see the host's result. At a
 *   selection (before backward, t > W) the master takes the 16-bit parameters while the step
 *   submitted at the previous boundary may still run; DeepSpeed races there. zrun waits for it
 *   first (the order DeepSpeed has when the process is quicker than one backward), so the master
 *   becomes the 16-bit values and the finished step's result is still applied at the next boundary.
 *   Nothing flushes at the end (the last window's result is never applied) nor at checkpoint save,
 *   where DeepSpeed saves the master as it is and not the process's moments; zrun waits for the
 *   step in flight and saves it all (lua/zrun/zenflow_state.lua). save_16bit_model (and HF's final
 *   save through it) writes DeepSpeed's module state dict: the 16-bit parameters as they are, one
 *   host window behind. zrun's instead joins the step in flight and writes its new weights on the
 *   unselected columns (the selected ones and the 1-D parameters keep theirs: what the next boundary
 *   would make of them), then puts the parameters and the pending update back; training goes on
 *   unchanged. pt_reserved_cores_perc: ceil(perc x n) of the rank's n cores stay with training, the rest run the CPU Adam (both all n when either side would be empty);
 *   zrun gives the background step's OpenMP region n - ceil(perc x n) threads and leaves training's as
 *   they are (without overlap_step the value does nothing, in DeepSpeed too).
 * Several ranks (zenflow_stage_1_and_2.py's average_tensor, update_selected_channels,
 *   _process_selected_fp32_groups_grad; zenflow_torch_adam.py): every micro-step's gradient bucket is
 *   reduced to its owners (the mean over ranks); at a selection each owner ranks the whole columns of
 *   its own partition slice of each weight (DeepSpeed's flat layout is transposed, so a partition
 *   holds a run of columns; a column split between two partitions is never selected) and broadcasts
 *   its top floor(topk_ratio x its columns); the owners then broadcast the selected columns' reduced
 *   gradients (1-D parameters: their whole slice), so every rank runs the same selective AdamW on the
 *   same columns of its full copy of the parameters. At a boundary the selected values are saved,
 *   each rank's host step updates its partition, the 16-bit partitions are all-gathered, and only
 *   then are the saved values written back and stepped: they survive the all-gather. zrun's
 *   partitions are row ranges of each parameter, not column runs, so the selection is made over whole
 *   columns instead: the selection micro-step's local gradients are all-reduced (mean), every rank
 *   ranks the column sums and takes rank 0's indices (one broadcast), so the selection is the
 *   one-rank selection at any world size (in DeepSpeed it depends on the partitioning: per
 *   partition top-k). Every micro-step the selected
 *   columns' local gradients (and the 1-D parameters') are all-reduced (mean) in one flat buffer: the
 *   reduced values DeepSpeed's broadcasts deliver. The rest as above: the host step on the partition,
 *   the all-gather (zr_zero_refresh_params; overlap_step: zr_zero_async_apply), then the selected
 *   values back and their own AdamW.
 * update_interval "auto" (the default; engine.py's is_zenflow_update_boundary and sync/step hooks,
 *   zenflow_stage_1_and_2.py's backward_prologue and _process_selected_fp32_groups_grad, as released
 *   in 0.17.5-0.18.2). gradient_accumulation_steps becomes 0, so the loss is not scaled: a window
 *   sums its micro-batches' gradients. Every 2-D weight with more than one row (rows, cols) keeps two
 *   numbers across micro-steps, avg and non (both start at 0); the optimizer keeps a counter n (the
 *   micro-steps of the current statistic window, 0 at the start) and two verdict slots by micro-step
 *   parity. At micro-step t, before backward: t's slot is cleared; if t-1's verdict is set, n and every
 *   non restart at 0; n += 1. After backward, for t >= W, with g this micro-step's reduced gradient
 *   (selection already made for t) and r = topk_ratio:
 *     crit = sum |g[:, selected]|, total = sum |g|,
 *     avg = (avg * (n - 1) + crit) / n / (10 r),   non += (total - crit) / (10 (1 - r)),
 *   and the weight votes "update" when non >= avg; t's verdict is set when the votes reach
 *   floor(auto_ratio x P), P the number of parameters that are not 1-D (biases and norms count in P
 *   but never vote, so with two weights auto_ratio 0.99 needs one vote). Micro-step t ends a window
 *   (host step) when t < W, or t-1's verdict is set, or (SI != 0 and (t+1) % SI == 0): the verdict
 *   is known before t's backward, which needs it (a boundary keeps the selected columns aside). The
 *   LR scheduler still steps every micro-step; bias correction still takes t+1; with overlap_step the
 *   moment set is (t+1) & 1 after warm-up (zenflow_state, toggled at every backward).
 *   Differences, deliberate: DeepSpeed sums in bf16 (its sum buffer) and keeps avg/non as tensors in
 *   the parameters' dtype; zrun sums in double (zr_zenflow_absdiff_sums: at one rank straight from the
 *   window's running sum and a kept copy of the previous micro-step's, one pass) and runs the rule in double. At several ranks zrun
 *   all-reduces each micro-step's whole gradient of the measured weights for total (DeepSpeed's owners
 *   sum their reduced partition slices) and every rank takes rank 0's verdict (one broadcast).
 *   Later releases broke the rule when the backward hooks moved: 0.18.3-0.19.1 never call ZenFlow's
 *   prologue, and from 0.19.2 the parity is toggled after it instead of before, so the slot read is
 *   the one just cleared and no window ends from the rule (only warm-up and SI end them); from 0.18.3
 *   each gradient is divided by gradient_accumulation_steps = 0. zrun follows 0.17.5-0.18.2. zrun's Trainer counts a step as
 *   gradient_accumulation_steps micro-batches (HF's count over DeepSpeed) and makes the micro-step of
 *   each checkpoint save end a window (ZF:force_boundary; the statistic goes on as at an SI boundary):
 *   a save inside a window would lose its accumulated gradients, as DeepSpeed's does, so zrun's resume
 *   is exact, and a run with other save steps has other windows. Checkpoints carry n, both verdicts
 *   and every avg, non (lua/zrun/zenflow_state.lua).
 * offload (zenflow_torch_adam.py's _step_with_offload / group_step): the selective optimizer's m, v
 *   live in host buffers, copied to the device before each selective step of a bucket of parameters
 *   and back after it; the config needs overlap_comm (DeepSpeed asserts it). The numbers do not
 *   change. zrun keeps them in f32 host tensors and moves one weight's at a time (DeepSpeed keeps
 *   them in the parameters' dtype, offloaded or not, in pinned memory; zrun's are f32 and pageable).
 * zrun implements fixed and "auto" U, with or without overlap_step and offload, at any world size
 *   (lua/zrun/zenflow.lua). The overlapped host step is
 *   zr_zero_step_async (zero/engine.h): a background pthread running the offload pipeline on a
 *   device-side snapshot of the gradient partition (one more gradient partition on the GPU), its
 *   D2H copies on the offload copy stream after the snapshot, the new weights into a host buffer
 *   that zr_zero_async_apply uploads at the next boundary. */
#include "zero/zenflow.h"

#include <stdlib.h>

#include "kernels/cpu/zenflow.h"
#include "ops/util.h"
#ifdef ZR_HAVE_CUDA
#include "cuda/device.h"
#include "kernels/cuda/zenflow.h"
#endif

static void shape2(const zr_tensor *t, int64_t *rows, int64_t *cols) {
    if (t->ndim == 2) *rows = t->shape[0], *cols = t->shape[1];
    else *rows = 1, *cols = zr_tensor_numel(t);
}

static zr_status check(const char *op, zr_tensor *a, zr_tensor *b, zr_tensor *idx, int64_t rows, int64_t k) {
    if (!zr_tensor_is_contiguous(a) || !zr_tensor_is_contiguous(b))
        return zr_error("%s: tensors must be contiguous", op);
    if (!zr_device_eq(zr_tensor_device(a), zr_tensor_device(b)))
        return zr_error("%s: tensors must be on one device", op);
    if (idx && (idx->dtype != ZR_I32 || !zr_tensor_is_contiguous(idx) ||
                !zr_device_eq(zr_tensor_device(idx), zr_tensor_device(a))))
        return zr_error("%s: the column indices must be a contiguous i32 tensor on the parameters' device", op);
    if (zr_tensor_numel(b) != rows * k)
        return zr_error("%s: the selection holds %lld elements, expected %lld x %lld", op,
                        (long long)zr_tensor_numel(b), (long long)rows, (long long)k);
    return ZR_OK;
}

zr_status zr_zenflow_colsum(zr_tensor *out, zr_tensor *g) {
    int64_t rows, cols;
    shape2(g, &rows, &cols);
    if (out->dtype != ZR_F32 || g->dtype != ZR_F32) return zr_error("zenflow_colsum: f32 tensors only");
    ZR_CHECK(check("zenflow_colsum", g, out, NULL, 1, cols));
#ifdef ZR_HAVE_CUDA
    if (!zr_is_cpu(g))
        return zenflow_colsum_cuda(zr_tensor_data(out), zr_tensor_data(g), rows, cols,
                                   zr_cuda_stream(zr_tensor_device(g)));
#endif
    zenflow_colsum_cpu(zr_tensor_data(out), zr_tensor_data(g), rows, cols);
    return ZR_OK;
}

static zr_status check_absdiff(const char *op, zr_tensor *sums, const zr_zenflow_absdiff *e, int64_t i,
                               char *taken) {
    if (!e->a) return zr_error("%s: entry %lld (0-based) has no tensor to sum", op, (long long)i);
    const int64_t ns = zr_tensor_numel(sums), n = zr_tensor_numel(e->a);
    if (e->a->dtype != ZR_F32 || (e->prev && e->prev->dtype != ZR_F32))
        return zr_error("%s: entry %lld (0-based): f32 tensors only", op, (long long)i);
    if (!e->prev && (e->have_prev || e->keep))
        return zr_error("%s: entry %lld (0-based) has no previous sum to read or keep (pass prev, or have_prev "
                        "and keep false)", op, (long long)i);
    if (e->slot < 0 || e->slot >= ns)
        return zr_error("%s: entry %lld (0-based): slot %lld outside the %lld sums (0-based)", op, (long long)i,
                        (long long)e->slot, (long long)ns);
    if (taken[e->slot])
        return zr_error("%s: entry %lld (0-based): slot %lld (0-based) is an earlier entry's; give each entry "
                        "its own slot", op, (long long)i, (long long)e->slot);
    taken[e->slot] = 1;
    if (e->prev && zr_tensor_numel(e->prev) != n)
        return zr_error("%s: entry %lld (0-based): the previous sum holds %lld elements, the gradient %lld", op,
                        (long long)i, (long long)zr_tensor_numel(e->prev), (long long)n);
    ZR_CHECK(check(op, e->a, e->prev ? e->prev : e->a, NULL, 1, n));
    return check(op, e->a, sums, NULL, 1, ns);
}

#ifdef ZR_HAVE_CUDA
/* The entries' table and the chunks' partials in one workspace; the table reaches it by zr_cuda_upload. */
static zr_status absdiff_sums_cuda(zr_tensor *sums, const zr_zenflow_absdiff *e, int64_t n) {
    const char *op = "zenflow_absdiff_sums";
    zr_device dev = zr_tensor_device(sums);
    if (zr_tensor_numel(sums) > INT32_MAX) /* the table's slots are int32 */
        return zr_error("%s: %lld sums on CUDA, at most 2^31 - 1", op, (long long)zr_tensor_numel(sums));
    zenflow_absdiff_entry *tab = malloc(sizeof *tab * (size_t)n);
    if (!tab) return zr_error("%s: out of host memory for %lld entries", op, (long long)n);
    int64_t chunks = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t len = zr_tensor_numel(e[i].a);
        tab[i] = (zenflow_absdiff_entry){zr_tensor_data(e[i].a), e[i].prev ? zr_tensor_data(e[i].prev) : NULL, len,
                                         chunks, (int32_t)e[i].slot,
                                         (e[i].have_prev ? ZENFLOW_HAVE_PREV : 0) | (e[i].keep ? ZENFLOW_KEEP : 0)};
        chunks += zenflow_absdiff_chunks(len);
    }
    const int64_t tab_bytes = (int64_t)(sizeof *tab) * n; /* a multiple of 8: the partials stay aligned */
    zr_tensor *ws = zr_tensor_new_cat(ZR_F32, dev, 1, (int64_t[]){(tab_bytes + 8 * chunks) / 4}, ZR_MEM_WORKSPACE, 0);
    zr_status st = ws ? ZR_OK : ZR_ERR;
    if (!st) {
        cudaStream_t s = zr_cuda_stream(dev);
        char *w = zr_tensor_data(ws);
        st = zr_cuda_upload(dev, w, tab, (size_t)tab_bytes, s);
        if (!st)
            st = zenflow_absdiff_sums_cuda(zr_tensor_data(sums), (const zenflow_absdiff_entry *)w, n,
                                           (double *)(w + tab_bytes), chunks, s);
    }
    zr_tensor_release(ws); /* the caching allocator hands it out again in stream order only */
    free(tab);
    return st;
}
#endif

/* The bytes an entry reads (a, prev) or writes (a kept prev), for the overlap check. */
typedef struct {
    uintptr_t lo, hi;
    int64_t entry;
    int written;
} span;
static int span_cmp(const void *x, const void *y) {
    const span *a = x, *b = y;
    return a->lo < b->lo ? -1 : a->lo > b->lo;
}

/* Entries run in any order on CUDA: a kept prev must share no byte with any a or other prev. One
 * sweep over the spans by start: a span that starts before the furthest end so far of the earlier
 * written spans (or, written itself, of any earlier span) overlaps one. */
static zr_status check_overlap(const char *op, const zr_zenflow_absdiff *e, int64_t n) {
    span *sp = malloc(sizeof *sp * (size_t)(2 * n));
    if (!sp) return zr_error("%s: out of host memory", op);
    int64_t m = 0;
    for (int64_t i = 0; i < n; i++) {
        uintptr_t bytes = (uintptr_t)zr_tensor_numel(e[i].a) * 4;
        if (bytes == 0) continue;
        uintptr_t a = (uintptr_t)zr_tensor_data(e[i].a);
        sp[m++] = (span){a, a + bytes, i, 0};
        if (e[i].prev && (e[i].have_prev || e[i].keep)) {
            uintptr_t p = (uintptr_t)zr_tensor_data(e[i].prev);
            sp[m++] = (span){p, p + bytes, i, e[i].keep};
        }
    }
    qsort(sp, (size_t)m, sizeof *sp, span_cmp);
    uintptr_t end_any = 0, end_written = 0;
    int64_t who_any = -1, who_written = -1;
    zr_status st = ZR_OK;
    for (int64_t k = 0; k < m && !st; k++) {
        int64_t other = sp[k].lo < end_written ? who_written : sp[k].written && sp[k].lo < end_any ? who_any : -1;
        int64_t i = sp[k].entry;
        if (other == i)
            st = zr_error("%s: entry %lld (0-based) keeps its prev in memory its a shares; give the kept prev a "
                          "buffer of its own", op, (long long)i);
        else if (other >= 0)
            st = zr_error("%s: entries %lld and %lld (0-based) share memory where one keeps its prev; give each "
                          "kept prev a buffer of its own", op, (long long)(other < i ? other : i),
                          (long long)(other < i ? i : other));
        if (sp[k].hi > end_any) end_any = sp[k].hi, who_any = sp[k].entry;
        if (sp[k].written && sp[k].hi > end_written) end_written = sp[k].hi, who_written = sp[k].entry;
    }
    free(sp);
    return st;
}

zr_status zr_zenflow_absdiff_sums(zr_tensor *sums, const zr_zenflow_absdiff *e, int64_t n) {
    const char *op = "zenflow_absdiff_sums";
    if (sums->dtype != ZR_F32 || !zr_tensor_is_contiguous(sums))
        return zr_error("%s: the sums must be a contiguous f32 tensor", op);
    char *taken = calloc((size_t)zr_tensor_numel(sums) + 1, 1);
    if (!taken) return zr_error("%s: out of host memory", op);
    zr_status st = ZR_OK;
    for (int64_t i = 0; i < n && !st; i++) st = check_absdiff(op, sums, &e[i], i, taken);
    free(taken);
    if (!st && n > 0) st = check_overlap(op, e, n);
    if (st || n == 0) return st;
#ifdef ZR_HAVE_CUDA
    if (!zr_is_cpu(sums)) return absdiff_sums_cuda(sums, e, n);
#endif
    float *out = zr_tensor_data(sums);
    for (int64_t i = 0; i < n; i++) {
        float *prev = e[i].prev ? zr_tensor_data(e[i].prev) : NULL;
        out[e[i].slot] =
            (float)zenflow_absdiff_sum_cpu(zr_tensor_data(e[i].a), prev, zr_tensor_numel(e[i].a), e[i].have_prev,
                                           e[i].keep);
    }
    return ZR_OK;
}

static zr_status move(const char *op, zr_tensor *full, zr_tensor *sel, zr_tensor *idx, int scatter) {
    int64_t rows, cols, k = idx ? zr_tensor_numel(idx) : 0;
    shape2(full, &rows, &cols);
    if (!idx) k = cols;
    if (full->dtype != sel->dtype) return zr_error("%s: dtypes differ", op);
    int esz = (int)zr_dtype_size(full->dtype);
    ZR_CHECK(check(op, full, sel, idx, rows, k));
    const int32_t *ix = idx ? zr_tensor_data(idx) : NULL;
#ifdef ZR_HAVE_CUDA
    if (!zr_is_cpu(full)) {
        cudaStream_t s = zr_cuda_stream(zr_tensor_device(full));
        return scatter ? zenflow_scatter_cuda(zr_tensor_data(full), zr_tensor_data(sel), esz, rows, cols, ix, k, s)
                       : zenflow_gather_cuda(zr_tensor_data(sel), zr_tensor_data(full), esz, rows, cols, ix, k, s);
    }
#endif
    if (scatter) zenflow_scatter_cpu(zr_tensor_data(full), zr_tensor_data(sel), esz, rows, cols, ix, k);
    else zenflow_gather_cpu(zr_tensor_data(sel), zr_tensor_data(full), esz, rows, cols, ix, k);
    return ZR_OK;
}

zr_status zr_zenflow_gather(zr_tensor *out, zr_tensor *src, zr_tensor *idx) {
    return move("zenflow_gather", src, out, idx, 0);
}
zr_status zr_zenflow_scatter(zr_tensor *dst, zr_tensor *src, zr_tensor *idx) {
    return move("zenflow_scatter", dst, src, idx, 1);
}

zr_status zr_zenflow_adamw(zr_tensor *p, zr_tensor *g, zr_tensor *idx, zr_tensor *m, zr_tensor *v,
                           double lr, double beta1, double beta2, double eps, double wd, int64_t step) {
    int64_t rows, cols, k;
    shape2(p, &rows, &cols);
    k = idx ? zr_tensor_numel(idx) : cols;
    if (p->dtype != ZR_F32 && p->dtype != ZR_BF16)
        return zr_error("zenflow_adamw: parameters must be f32 or bf16, got %s", zr_dtype_name(p->dtype));
    if (g->dtype != ZR_F32 || m->dtype != ZR_F32 || v->dtype != ZR_F32)
        return zr_error("zenflow_adamw: gradients and moments must be f32 (data_types.grad_accum_dtype fp32)");
    /* (k == cols: idx is every column in order, so both readings agree) */
    int g_sel = zr_tensor_numel(g) != rows * cols;
    if (g_sel && zr_tensor_numel(g) != rows * k)
        return zr_error("zenflow_adamw: the gradient holds %lld elements, expected %lld x %lld (the parameter's) or "
                        "%lld x %lld (its selected columns')", (long long)zr_tensor_numel(g), (long long)rows,
                        (long long)cols, (long long)rows, (long long)k);
    ZR_CHECK(check("zenflow_adamw", p, m, idx, rows, k));
    ZR_CHECK(check("zenflow_adamw", g, v, idx, rows, k));
    if (step < 1) return zr_error("zenflow_adamw: step must be >= 1, got %lld", (long long)step);
    const int32_t *ix = idx ? zr_tensor_data(idx) : NULL;
#ifdef ZR_HAVE_CUDA
    if (!zr_is_cpu(p))
        return zenflow_adamw_cuda(zr_tensor_data(p), p->dtype, zr_tensor_data(g), g_sel, zr_tensor_data(m),
                                  zr_tensor_data(v), rows, cols, ix, k, lr, beta1, beta2, eps, wd, step,
                                  zr_cuda_stream(zr_tensor_device(p)));
#endif
    zenflow_adamw_cpu(zr_tensor_data(p), p->dtype, zr_tensor_data(g), g_sel, zr_tensor_data(m), zr_tensor_data(v), rows,
                      cols, ix, k, lr, beta1, beta2, eps, wd, step);
    return ZR_OK;
}
