/* The CUDA caching allocator, registered as the core's ZR_CUDA backend (see alloc.h, cuda.h).
 * Sizes are rounded (512 B steps up to 1 MiB, 2 MiB steps above); freed blocks stay cached per
 * device and per stream and are handed out again best-fit, so a training loop that repeats its
 * shapes stops calling cudaMalloc/cudaFree after the first step. A block is only reused on the
 * stream it was allocated for, so stream order keeps reuse safe without events. When cudaMalloc
 * fails the device's cache is returned to the driver and the call retried once. */
#include "cuda/device.h"

#ifdef ZR_HAVE_CUDA
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_CUDA (ZR_MAX_DEVICES - 1)
#define SMALL_LIMIT ((size_t)1 << 20)
#define SMALL_ROUND ((size_t)512)
#define LARGE_ROUND ((size_t)2 << 20)

typedef struct {
    char *ptr;
    size_t size;
    cudaStream_t stream;
} block;

typedef struct {
    block *v;
    int n, cap;
} block_vec;

typedef struct {
    pthread_mutex_t lock;
    block_vec free_blocks; /* sorted by (stream, size, ptr) */
    block_vec used;        /* sorted by ptr */
    zr_cuda_mem_stats st;
} dev_pool;

static dev_pool pools[MAX_CUDA];
static pthread_once_t pools_once = PTHREAD_ONCE_INIT;
static void pools_init(void) {
    for (int i = 0; i < MAX_CUDA; i++) pthread_mutex_init(&pools[i].lock, NULL);
}

static size_t round_size(size_t n) {
    if (n <= SMALL_LIMIT) return (n + SMALL_ROUND - 1) / SMALL_ROUND * SMALL_ROUND;
    return (n + LARGE_ROUND - 1) / LARGE_ROUND * LARGE_ROUND;
}

static int cmp_free(const block *a, const block *b) {
    if (a->stream != b->stream) return (uintptr_t)a->stream < (uintptr_t)b->stream ? -1 : 1;
    if (a->size != b->size) return a->size < b->size ? -1 : 1;
    if (a->ptr != b->ptr) return a->ptr < b->ptr ? -1 : 1;
    return 0;
}

static int vec_insert_at(block_vec *v, int i, block b) {
    if (v->n == v->cap) {
        int nc = v->cap ? v->cap * 2 : 64;
        block *nv = realloc(v->v, (size_t)nc * sizeof *nv);
        if (!nv) return -1;
        v->v = nv;
        v->cap = nc;
    }
    memmove(v->v + i + 1, v->v + i, (size_t)(v->n - i) * sizeof *v->v);
    v->v[i] = b;
    v->n++;
    return 0;
}
static void vec_remove_at(block_vec *v, int i) {
    memmove(v->v + i, v->v + i + 1, (size_t)(v->n - i - 1) * sizeof *v->v);
    v->n--;
}

/* First index whose block is not less than key (free list order). */
static int free_lower_bound(const block_vec *v, const block *key) {
    int lo = 0, hi = v->n;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (cmp_free(&v->v[mid], key) < 0) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}
static int used_lower_bound(const block_vec *v, const char *p) {
    int lo = 0, hi = v->n;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (v->v[mid].ptr < p) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

static void human(double b, char *buf, size_t len) {
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (b >= 1024 && i < 4) b /= 1024, i++;
    snprintf(buf, len, i ? "%.2f %s" : "%.0f %s", b, u[i]);
}

/* Frees every cached block of pool (lock held). cudaFree waits for the device, so blocks still in
 * use by queued kernels are never handed back early. */
static void release_cached(dev_pool *p) {
    for (int i = 0; i < p->free_blocks.n; i++) {
        cudaFree(p->free_blocks.v[i].ptr);
        p->st.n_cuda_free++;
        p->st.cached -= (int64_t)p->free_blocks.v[i].size;
        p->st.reserved -= (int64_t)p->free_blocks.v[i].size;
    }
    p->free_blocks.n = 0;
}

static void track_peaks(dev_pool *p) {
    if (p->st.reserved > p->st.peak_reserved) p->st.peak_reserved = p->st.reserved;
    if (p->st.allocated > p->st.peak_allocated) p->st.peak_allocated = p->st.allocated;
}

void *zr_cuda_malloc(zr_device dev, size_t nbytes, cudaStream_t stream) {
    if (zr_cuda_check_device(dev, "cuda alloc") || zr_cuda_use(dev.index)) return NULL;
    pthread_once(&pools_once, pools_init);
    dev_pool *p = &pools[dev.index];
    size_t need = round_size(nbytes ? nbytes : 1);
    /* Reuse a cached block that is not much larger than asked for (no splitting). */
    size_t limit = need <= SMALL_LIMIT ? 2 * need : need + (need / 8 > LARGE_ROUND ? need / 8 : LARGE_ROUND);
    pthread_mutex_lock(&p->lock);
    p->st.n_alloc++;
    block key = {NULL, need, stream};
    int i = free_lower_bound(&p->free_blocks, &key);
    if (i < p->free_blocks.n && p->free_blocks.v[i].stream == stream && p->free_blocks.v[i].size <= limit) {
        block b = p->free_blocks.v[i];
        vec_remove_at(&p->free_blocks, i);
        if (vec_insert_at(&p->used, used_lower_bound(&p->used, b.ptr), b)) {
            vec_insert_at(&p->free_blocks, i, b); /* cannot grow used: put it back */
            pthread_mutex_unlock(&p->lock);
            return zr_error_null("out of host memory in the CUDA allocator");
        }
        p->st.cached -= (int64_t)b.size;
        p->st.allocated += (int64_t)b.size;
        p->st.n_cache_hits++;
        track_peaks(p);
        pthread_mutex_unlock(&p->lock);
        return b.ptr;
    }
    void *ptr = NULL;
    cudaError_t e = cudaMalloc(&ptr, need);
    if (e == cudaErrorMemoryAllocation) {
        cudaGetLastError();
        release_cached(p);
        e = cudaMalloc(&ptr, need);
    }
    if (e == cudaErrorMemoryAllocation) {
        /* the tensors Lua no longer reaches, freed by a collection (zr_mem_collect; unlocked: its
         * finalizers free blocks, and zr_cuda_free takes the lock), then once more */
        cudaGetLastError();
        pthread_mutex_unlock(&p->lock);
        const int ran = zr_mem_collect(dev, 1);
        pthread_mutex_lock(&p->lock);
        if (ran > 0) {
            release_cached(p);
            e = cudaMalloc(&ptr, need);
        }
    }
    if (e != cudaSuccess) {
        int64_t cached = p->st.cached, reserved = p->st.reserved;
        pthread_mutex_unlock(&p->lock);
        if (e != cudaErrorMemoryAllocation) {
            ZR_CUDA_CHECK(e, "cudaMalloc");
            return NULL;
        }
        cudaGetLastError();
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
        return NULL;
    }
    block b = {ptr, need, stream};
    if (vec_insert_at(&p->used, used_lower_bound(&p->used, b.ptr), b)) {
        cudaFree(ptr);
        pthread_mutex_unlock(&p->lock);
        return zr_error_null("out of host memory in the CUDA allocator");
    }
    p->st.n_cuda_malloc++;
    p->st.reserved += (int64_t)need;
    p->st.allocated += (int64_t)need;
    track_peaks(p);
    pthread_mutex_unlock(&p->lock);
    return ptr;
}

void zr_cuda_free(zr_device dev, void *ptr) {
    if (!ptr || dev.index < 0 || dev.index >= MAX_CUDA) return;
    dev_pool *p = &pools[dev.index];
    pthread_mutex_lock(&p->lock);
    int i = used_lower_bound(&p->used, ptr);
    if (i < p->used.n && p->used.v[i].ptr == ptr) {
        block b = p->used.v[i];
        vec_remove_at(&p->used, i);
        p->st.allocated -= (int64_t)b.size;
        if (vec_insert_at(&p->free_blocks, free_lower_bound(&p->free_blocks, &b), b)) {
            cudaFree(b.ptr); /* no room to cache it */
            p->st.reserved -= (int64_t)b.size;
            p->st.n_cuda_free++;
        } else
            p->st.cached += (int64_t)b.size;
    }
    pthread_mutex_unlock(&p->lock);
}

void zr_cuda_empty_cache(int index) {
    pthread_once(&pools_once, pools_init);
    int n = zr_cuda_device_count();
    for (int i = 0; i < n; i++) {
        if (index >= 0 && i != index) continue;
        dev_pool *p = &pools[i];
        pthread_mutex_lock(&p->lock);
        if (p->free_blocks.n && !zr_cuda_use(i)) release_cached(p);
        pthread_mutex_unlock(&p->lock);
    }
}

void zr_cuda_mem_get_stats(int index, zr_cuda_mem_stats *out) {
    memset(out, 0, sizeof *out);
    if (index < 0 || index >= MAX_CUDA) return;
    pthread_once(&pools_once, pools_init);
    dev_pool *p = &pools[index];
    pthread_mutex_lock(&p->lock);
    *out = p->st;
    pthread_mutex_unlock(&p->lock);
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
const zr_alloc_backend *zr_cuda_alloc_backend(void) { return &cuda_backend; }

#endif
