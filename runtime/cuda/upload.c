/* Small host tables (kernel descriptors) to the device without waiting for the GPU (see device.h's
 * zr_cuda_upload): SLOTS page-locked slots per device, taken in turn, each reused only once the copy
 * that last read it has run (an event recorded after the copy). Kept for the process, as
 * io/staging.c's buffers are. */
#include "cuda/device.h"

#ifdef ZR_HAVE_CUDA
#include <pthread.h>
#include <string.h>

#define SLOTS 4
#define MIN_BYTES 16384 /* a few hundred descriptors: one allocation for a whole run */

typedef struct {
    void *host; /* cudaHostAlloc'd, cap bytes */
    size_t cap;
    cudaEvent_t done; /* recorded after the copy that last read host; NULL before the first */
} slot;
static slot g_slots[ZR_MAX_DEVICES][SLOTS];
static int g_next[ZR_MAX_DEVICES];
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

static zr_status upload(slot *sl, void *dst, const void *src, size_t bytes, cudaStream_t s) {
    const char *op = "upload";
    /* the copy that last read this slot, SLOTS uploads ago: long done unless the host queued that many
     * tables ahead of the GPU (zenflow uploads one per micro-step and reads its sums back before the
     * next), the one case that waits */
    if (sl->done) ZR_CHECK(ZR_CUDA_CHECK(cudaEventSynchronize(sl->done), op));
    else ZR_CHECK(ZR_CUDA_CHECK(cudaEventCreateWithFlags(&sl->done, cudaEventDisableTiming), op));
    if (sl->cap < bytes) {
        size_t cap = MIN_BYTES;
        while (cap < bytes) cap *= 2;
        if (sl->host) ZR_CHECK(ZR_CUDA_CHECK(cudaFreeHost(sl->host), op)); /* its copy has run (above) */
        sl->host = NULL, sl->cap = 0;
        ZR_CHECK(ZR_CUDA_CHECK(cudaHostAlloc(&sl->host, cap, cudaHostAllocPortable), op));
        sl->cap = cap;
    }
    memcpy(sl->host, src, bytes);
    ZR_CHECK(ZR_CUDA_CHECK(cudaMemcpyAsync(dst, sl->host, bytes, cudaMemcpyHostToDevice, s), op));
    return ZR_CUDA_CHECK(cudaEventRecord(sl->done, s), op);
}

zr_status zr_cuda_upload(zr_device dev, void *dst, const void *src, size_t bytes, cudaStream_t s) {
    if (bytes == 0) return ZR_OK;
    ZR_CHECK(zr_cuda_use(dev.index));
    pthread_mutex_lock(&g_lock);
    int k = g_next[dev.index];
    g_next[dev.index] = (k + 1) % SLOTS;
    zr_status st = upload(&g_slots[dev.index][k], dst, src, bytes, s);
    pthread_mutex_unlock(&g_lock);
    return st;
}
#endif
