/* The CUDA caching allocator, registered as the core's ZR_CUDA backend (see alloc.h, cuda.h): a
 * block pool per device (core/block_pool.h, PyTorch's policy) over cudaMalloc'd segments, split
 * into 512-byte blocks and merged again when freed, so a training loop stops calling cudaMalloc
 * after its first steps even when its shapes vary (unpadded rows: a new token count every
 * micro-batch). A block is only reused on the stream it was allocated for, so stream order keeps
 * reuse safe without events. When cudaMalloc fails the device's wholly free segments are returned
 * to the driver and the call retried; then once more after a Lua collection. */
#include "cuda/device.h"

#ifdef ZR_HAVE_CUDA
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/block_pool.h"

#define MAX_CUDA (ZR_MAX_DEVICES - 1)

typedef struct {
    pthread_mutex_t lock;
    zr_block_pool pool;
    cudaError_t last_error; /* a cudaMalloc failure other than out-of-memory, for the report */
} dev_pool;

static dev_pool pools[MAX_CUDA];
static pthread_once_t pools_once = PTHREAD_ONCE_INIT;

/* The pool's source: segments from cudaMalloc (the device is current: zr_cuda_malloc set it). */
static void *take_segment(void *ctx, size_t size) {
    dev_pool *p = ctx;
    void *ptr = NULL;
    const cudaError_t e = cudaMalloc(&ptr, size);
    if (e == cudaSuccess) return ptr;
    cudaGetLastError();
    if (e != cudaErrorMemoryAllocation) p->last_error = e;
    return NULL;
}
/* cudaFree waits for the device, so a segment's last kernels finish before it goes back. */
static void give_back_segment(void *ctx, void *ptr) {
    (void)ctx;
    cudaFree(ptr);
}

static void pools_init(void) {
    for (int i = 0; i < MAX_CUDA; i++) {
        pthread_mutex_init(&pools[i].lock, NULL);
        zr_pool_init(&pools[i].pool, (zr_pool_source){take_segment, give_back_segment, &pools[i]});
    }
}

static void human(double b, char *buf, size_t len) {
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (b >= 1024 && i < 4)
        b /= 1024, i++;
    snprintf(buf, len, i ? "%.2f %s" : "%.0f %s", b, u[i]);
}

/* One clear line for a request the device cannot hold (lock not held). */
static void report_oom(zr_device dev, size_t nbytes, int64_t reserved, int64_t cached) {
    size_t fr = 0, tot = 0;
    cudaMemGetInfo(&fr, &tot);
    cudaGetLastError();
    char want[32], f[32], t[32], c[32], r[32], cats[512];
    human((double)nbytes, want, sizeof want);
    human((double)fr, f, sizeof f);
    human((double)tot, t, sizeof t);
    human((double)cached, c, sizeof c);
    human((double)reserved, r, sizeof r);
    zr_mem_describe(dev, cats, sizeof cats);
    zr_error("out of memory on cuda:%d allocating %s: the device has %s free of %s; zrun tensors "
             "on it: %s; allocator reserved %s (cached %s). Free tensors, lower the batch size "
             "or sequence length, or use ZeRO stage 2/3 or offload",
             dev.index, want, f, t, cats, r, c);
}

void *zr_cuda_malloc(zr_device dev, size_t nbytes, cudaStream_t stream) {
    if (zr_cuda_check_device(dev, "cuda alloc") || zr_cuda_use(dev.index)) return NULL;
    pthread_once(&pools_once, pools_init);
    dev_pool *p = &pools[dev.index];
    void *ptr = NULL;
    pthread_mutex_lock(&p->lock);
    p->last_error = cudaSuccess;
    int rc = zr_pool_alloc(&p->pool, nbytes, (uintptr_t)stream, &ptr, NULL);
    if (rc == ZR_POOL_NO_DEVICE_MEMORY && p->last_error == cudaSuccess && zr_pool_release(&p->pool))
        rc = zr_pool_alloc(&p->pool, nbytes, (uintptr_t)stream, &ptr, NULL);
    if (rc == ZR_POOL_NO_DEVICE_MEMORY && p->last_error == cudaSuccess) {
        /* the tensors Lua no longer reaches, freed by a collection (zr_mem_collect; unlocked: its
         * finalizers free blocks, and zr_cuda_free takes the lock), then once more */
        pthread_mutex_unlock(&p->lock);
        const int ran = zr_mem_collect(dev, 1);
        pthread_mutex_lock(&p->lock);
        if (ran > 0) {
            zr_pool_release(&p->pool);
            rc = zr_pool_alloc(&p->pool, nbytes, (uintptr_t)stream, &ptr, NULL);
        }
    }
    const cudaError_t err = p->last_error;
    const int64_t reserved = p->pool.st.reserved, cached = reserved - p->pool.st.allocated;
    pthread_mutex_unlock(&p->lock);
    if (rc == ZR_POOL_OK) return ptr;
    if (rc == ZR_POOL_NO_HOST_MEMORY)
        return zr_error_null("out of host memory in the CUDA allocator");
    if (err != cudaSuccess) {
        ZR_CUDA_CHECK(err, "cudaMalloc");
        return NULL;
    }
    report_oom(dev, nbytes, reserved, cached);
    return NULL;
}

void zr_cuda_free(zr_device dev, void *ptr) {
    if (!ptr || dev.index < 0 || dev.index >= MAX_CUDA) return;
    pthread_once(&pools_once, pools_init);
    dev_pool *p = &pools[dev.index];
    pthread_mutex_lock(&p->lock);
    zr_pool_free(&p->pool, ptr);
    pthread_mutex_unlock(&p->lock);
}

void zr_cuda_empty_cache(int index) {
    pthread_once(&pools_once, pools_init);
    int n = zr_cuda_device_count();
    for (int i = 0; i < n; i++) {
        if (index >= 0 && i != index) continue;
        dev_pool *p = &pools[i];
        pthread_mutex_lock(&p->lock);
        if (p->pool.n_free && !zr_cuda_use(i)) zr_pool_release(&p->pool);
        pthread_mutex_unlock(&p->lock);
    }
}

void zr_cuda_mem_get_stats(int index, zr_cuda_mem_stats *out) {
    memset(out, 0, sizeof *out);
    if (index < 0 || index >= MAX_CUDA) return;
    pthread_once(&pools_once, pools_init);
    dev_pool *p = &pools[index];
    pthread_mutex_lock(&p->lock);
    const zr_pool_stats st = p->pool.st;
    pthread_mutex_unlock(&p->lock);
    out->allocated = st.allocated;
    out->reserved = st.reserved;
    out->cached = st.reserved - st.allocated;
    out->peak_allocated = st.peak_allocated;
    out->peak_reserved = st.peak_reserved;
    out->n_cuda_malloc = st.n_take;
    out->n_cuda_free = st.n_give_back;
    out->n_alloc = st.n_alloc;
    out->n_cache_hits = st.n_cache_hits;
    if (index < zr_cuda_device_count() && !zr_cuda_use(index)) {
        size_t fr = 0, tot = 0;
        if (cudaMemGetInfo(&fr, &tot) == cudaSuccess) {
            out->device_free = (int64_t)fr;
            out->device_total = (int64_t)tot;
        } else
            cudaGetLastError();
    }
}

/* --- the core's backend interface: tensors allocate on their device's compute stream --- */

static void *backend_alloc(zr_device dev, size_t nbytes) {
    if (zr_cuda_check_device(dev, "allocate")) return NULL;
    return zr_cuda_malloc(dev, nbytes, zr_cuda_stream(dev));
}
static void backend_free(zr_device dev, void *p, size_t nbytes) {
    (void)nbytes;
    zr_cuda_free(dev, p);
}
static void backend_zero(zr_device dev, void *p, size_t nbytes) {
    /* Errors here are sticky kernel faults at worst; the next checked call reports them. */
    cudaMemsetAsync(p, 0, nbytes, zr_cuda_stream(dev));
}

static const zr_alloc_backend cuda_backend = {backend_alloc, backend_free, backend_zero};
const zr_alloc_backend *zr_cuda_alloc_backend(void) {
    return &cuda_backend;
}

#endif
