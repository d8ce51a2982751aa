/* ZenFlow's overlap_step (zero/engine.h): one window's host AdamW on a background thread, its new
 * weights held until zr_zero_async_apply, a second set of moments, and the test hook that holds it. */
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/util.h"
#include "zero/engine_internal.h"
#ifdef ZR_HAVE_CUDA
#include "cuda/device.h"
#endif

struct zasync {
    pthread_t th;
    int running;    /* a thread was started and not joined yet */
    int finished;   /* it left its step (under hold_mu) */
    int freeing;    /* the engine is being freed: a held step goes on (under hold_mu) */
    int pending;    /* w holds new weights not yet in the parameters */
    zr_tensor *grads;     /* the window's gradient partition, snapshot (gpart's device and dtype) */
    zr_tensor *w;         /* new weights, host, param dtype, partition layout */
    zr_tensor *m2, *v2;   /* the second set of moments (host f32), lazily zero */
    zr_adamw_config c;
    double *lr, grad_scale;
    int64_t step;
    int set, threads;
    int w_pinned;
#ifdef ZR_HAVE_CUDA
    cudaEvent_t applied; /* after the last upload of w (compute stream): w is written again only then */
    int applied_rec;
#endif
    zr_zero *z;
    zr_status st;
    char msg[2048];
};

/* the test hook: while held, a background step waits after its update (zr_zero_async_hold) */
static pthread_mutex_t hold_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t hold_cv = PTHREAD_COND_INITIALIZER;
static int hold_on;

void zr_zero_async_hold(int on) {
    pthread_mutex_lock(&hold_mu);
    hold_on = on;
    pthread_cond_broadcast(&hold_cv);
    pthread_mutex_unlock(&hold_mu);
}

static void *async_main(void *arg) {
    struct zasync *a = arg;
    zr_zero *z = a->z;
#ifdef ZR_HAVE_CUDA
    if (z->dev.type == ZR_CUDA) a->st = zr_cuda_set_device(z->dev.index); /* the current device is per thread */
    if (!a->st && a->applied_rec) a->st = zr_cuda_event_sync(a->applied); /* w's last upload has read it */
#endif
    if (a->threads > 0) omp_set_num_threads(a->threads); /* this thread's parallel regions only */
    zr_offload_pass pass = {a->grads, zr_tensor_data(z->master), state_data(a->set ? a->m2 : z->m),
                            state_data(a->set ? a->v2 : z->v), 0, a->grad_scale, a->step, &a->c, a->lr,
                            zr_tensor_data(a->w), NULL, NULL, 0, z->part_numel, 0, NULL, NULL, ZR_F32, ZR_F32};
    if (!a->st) a->st = zr_offload_run(z->host, &pass);
    if (a->st) snprintf(a->msg, sizeof a->msg, "%s", zr_last_error_message());
    pthread_mutex_lock(&hold_mu);
    while (hold_on && !a->freeing) pthread_cond_wait(&hold_cv, &hold_mu);
    a->finished = 1;
    pthread_mutex_unlock(&hold_mu);
    return NULL;
}

static zr_tensor *host_zeros(zr_dtype dt, int64_t n, zr_mem_category cat) {
    zr_tensor *t = new_buf(dt, zr_cpu(), n, cat);
    if (t && zr_tensor_fill_(t, 0)) {
        zr_tensor_release(t);
        return NULL;
    }
    return t;
}

/* z's background-step record, allocated (with its upload event on a GPU) on first use */
static struct zasync *async_get(zr_zero *z) {
    struct zasync *a = z->async;
    if (!a && !(a = z->async = calloc(1, sizeof *a))) {
        zr_error("out of host memory");
        return NULL;
    }
    a->z = z;
#ifdef ZR_HAVE_CUDA
    if (z->dev.type == ZR_CUDA && !a->applied && !(a->applied = zr_cuda_event_new(0))) return NULL;
#endif
    return a;
}

zr_status zr_zero_step_async(zr_zero *z, double grad_scale, int64_t step, const zr_adamw_config *c, const double *lr,
                             int set, int threads) {
    if (!z->host || z->split || !z->m || !z->v || c->kind != ZR_OPTIM_ADAMW || (z->cfg.stage == 3 && z->chunks != 1) ||
        (z->param_dtype != ZR_F32 && z->param_dtype != ZR_BF16 && z->param_dtype != ZR_F16) ||
        z->master_dtype != ZR_F32 || z->state_dtype != ZR_F32)
        return zr_error("ZeRO: a background host step needs AdamW with its whole master on the host (offload_optimizer "
                        "cpu, ratio 1, f32 master and moments), stages 1-2 (stage 3 at one rank) and f32/bf16/f16 weights");
    if (set != 0 && set != 1) return zr_error("ZeRO: the background step's moment set must be 0 or 1, got %d", set);
    ZR_CHECK(zr_zero_async_wait(z)); /* its moments and master must be current */
    if (z->async && z->async->pending)
        return zr_error("ZeRO: the last background step's weights were never applied (zr_zero_async_apply first)");
    ZR_CHECK(zero_flush_stale(z));
    struct zasync *a = async_get(z);
    if (!a) return ZR_ERR;
    if (!a->grads && !(a->grads = new_buf(z->gpart->dtype, zr_tensor_device(z->gpart), z->part_numel, ZR_MEM_GRADS)))
        return ZR_ERR;
    if (!a->w && !(a->w = new_buf(z->param_dtype, zr_cpu(), z->part_numel, ZR_MEM_PARAMS))) return ZR_ERR;
#ifdef ZR_HAVE_CUDA
    if (z->dev.type == ZR_CUDA && z->cfg.pin_memory && !a->w_pinned) { /* so that its upload is a DMA */
        ZR_CHECK(zr_cuda_page_lock(zr_tensor_data(a->w), (size_t)z->part_numel * zr_dtype_size(z->param_dtype),
                                   "offload_optimizer.pin_memory", "zenflow overlap_step's new weights"));
        a->w_pinned = 1;
    }
#endif
    if (set && !a->m2 && !(a->m2 = host_zeros(ZR_F32, z->part_numel, ZR_MEM_OPTIMIZER))) return ZR_ERR;
    if (set && !a->v2 && !(a->v2 = host_zeros(ZR_F32, z->part_numel, ZR_MEM_OPTIMIZER))) return ZR_ERR;
    double *l = realloc(a->lr, sizeof(double) * (size_t)(z->nparams ? z->nparams : 1));
    if (!l) return zr_error("out of host memory");
    a->lr = l;
    memcpy(a->lr, lr, sizeof(double) * (size_t)z->nparams);
    if (!z->grads_dev) ZR_CHECK(zr_offload_grad_sync(z->host)); /* host gradients: every copy added in */
    /* the snapshot: queued on the compute stream (device) before the next window's kernels; the
     * thread's gradient copies start at the mark, after it */
    ZR_CHECK(zr_tensor_copy_(a->grads, z->gpart));
    if (z->grads_dev) ZR_CHECK(zr_offload_mark(z->host));
    ZR_CHECK(zr_offload_prepare(z->host)); /* the ring is allocated here, not on the thread */
    a->c = *c, a->grad_scale = grad_scale, a->step = step, a->set = set, a->threads = threads;
    a->st = ZR_OK, a->msg[0] = 0, a->finished = 0;
    if (pthread_create(&a->th, NULL, async_main, a)) return zr_error("ZeRO: could not start the background host step");
    a->running = 1;
    return ZR_OK;
}

int zr_zero_async_busy(zr_zero *z) {
    struct zasync *a = z->async;
    if (!a || !a->running) return 0;
    pthread_mutex_lock(&hold_mu);
    int busy = !a->finished;
    pthread_mutex_unlock(&hold_mu);
    return busy;
}

zr_status zr_zero_async_wait(zr_zero *z) {
    struct zasync *a = z->async;
    if (!a || !a->running) return ZR_OK;
    pthread_mutex_lock(&hold_mu);
    int held = hold_on && !a->finished;
    pthread_mutex_unlock(&hold_mu);
    if (held) /* joining would wait forever: the test that holds it expected no join here */
        return zr_error("ZeRO: the background host step is held by zenflow_hold (a test hook); release it first");
    pthread_join(a->th, NULL);
    a->running = 0;
    zr_offload_step_end(z->host);
    if (a->st) return zr_error("ZeRO background host step: %s", a->msg);
    a->pending = 1;
    return ZR_OK;
}

zr_status zr_zero_async_apply(zr_zero *z) {
    ZR_CHECK(zr_zero_async_wait(z));
    struct zasync *a = z->async;
    if (!a || !a->pending) return ZR_OK;
    if (z->chunks > 1) { /* each rank holds its partition's new weights: gathered into every rank's */
        a->pending = 0;
        ZR_CHECK(zero_allgather_weights(z, a->w));
#ifdef ZR_HAVE_CUDA
        if (z->dev.type == ZR_CUDA) { /* the next background step waits until w's copies have read it */
            ZR_CHECK(zr_cuda_event_record(a->applied, zr_cuda_stream(z->dev)));
            a->applied_rec = 1;
        }
#endif
        return ZR_OK;
    }
    zr_tensor *flat = flat_weights(z);
#ifdef ZR_HAVE_CUDA
    if (z->dev.type == ZR_CUDA) { /* async uploads on the compute stream (w pinned: DMAs; pageable: staged by
                                   * the driver); the next background step waits for them before writing w */
        cudaStream_t s = zr_cuda_stream(z->dev);
        size_t es = zr_dtype_size(z->param_dtype);
        const char *w = zr_tensor_data(a->w);
        for (int i = 0; i < (flat ? 1 : z->nparams); i++) {
            zr_tensor *p = flat ? flat : z->params[i].p;
            int64_t off = flat ? 0 : z->params[i].offset, n = flat ? z->part_numel : z->params[i].numel;
            if (p->dtype != z->param_dtype || !zr_tensor_is_contiguous(p) || zr_tensor_numel(p) < n)
                return zr_error("ZeRO: the background step's weights do not match parameter %d's layout", i);
            ZR_CHECK(ZR_CUDA_CHECK(cudaMemcpyAsync(zr_tensor_data(p), w + (size_t)off * es, (size_t)n * es,
                                                   cudaMemcpyHostToDevice, s),
                                   "ZeRO background step: weights upload"));
        }
        ZR_CHECK(zr_cuda_event_record(a->applied, s));
        a->applied_rec = 1;
        a->pending = 0;
        return ZR_OK;
    }
#endif
    if (flat) ZR_CHECK(zero_copy_range(flat, 0, a->w, 0, z->part_numel));
    else
        for (int i = 0; i < z->nparams; i++)
            ZR_CHECK(zero_copy_range(z->params[i].p, 0, a->w, z->params[i].offset, z->params[i].numel));
    a->pending = 0;
    return ZR_OK;
}

zr_status zr_zero_async_state(zr_zero *z, int which, int create, zr_tensor **out) {
    *out = NULL;
    if (which < 0 || which > 2)
        return zr_error("ZeRO async_state: which must be 0 (pending weights), 1 or 2 (second moments), got %d", which);
    ZR_CHECK(zr_zero_async_wait(z)); /* the step in flight writes w and one moment set */
    struct zasync *a = create ? async_get(z) : z->async;
    if (!a) return create ? ZR_ERR : ZR_OK;
#ifdef ZR_HAVE_CUDA
    if (a->applied_rec) ZR_CHECK(zr_cuda_event_sync(a->applied)); /* the caller may write w: its upload is done */
#endif
    zr_tensor **t = which == 0 ? &a->w : which == 1 ? &a->m2 : &a->v2;
    if (!*t && create &&
        !(*t = which == 0 ? new_buf(z->param_dtype, zr_cpu(), z->part_numel, ZR_MEM_PARAMS)
                          : host_zeros(ZR_F32, z->part_numel, ZR_MEM_OPTIMIZER)))
        return ZR_ERR;
    *out = zr_tensor_retain(*t);
    return ZR_OK;
}

int zr_zero_async_pending(const zr_zero *z) { return z->async && z->async->pending; }

zr_status zr_zero_async_set_pending(zr_zero *z, int on) {
    ZR_CHECK(zr_zero_async_wait(z));
    if (on && (!z->async || !z->async->w))
        return zr_error("ZeRO: no background-step weights to mark pending (write them through async_state(0) first)");
    if (z->async) z->async->pending = on != 0;
    return ZR_OK;
}

void zero_async_free(zr_zero *z) {
    struct zasync *a = z->async;
    if (!a) return;
    if (a->running) { /* only this engine's step is let go: the hold stays for any other */
        pthread_mutex_lock(&hold_mu);
        a->freeing = 1;
        pthread_cond_broadcast(&hold_cv);
        pthread_mutex_unlock(&hold_mu);
        pthread_join(a->th, NULL);
    }
#ifdef ZR_HAVE_CUDA
    if (a->applied_rec) zr_cuda_event_sync(a->applied); /* the last upload may still be reading w */
    if (a->w_pinned) cudaHostUnregister(zr_tensor_data(a->w));
    if (a->applied) zr_cuda_event_free(a->applied);
#endif
    zr_tensor_release(a->grads);
    zr_tensor_release(a->w);
    zr_tensor_release(a->m2);
    zr_tensor_release(a->v2);
    free(a->lr);
    free(a);
    z->async = NULL;
}
