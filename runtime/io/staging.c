/* Host staging pools for file I/O (see staging.h): cudaHostAlloc when a CUDA device is present,
 * aligned_alloc otherwise. */
#include "io/staging.h"

#include <stdlib.h>

#include "cuda/device.h"

#ifdef ZR_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

static void buf_free(zr_staging_buf *b) {
#ifdef ZR_HAVE_CUDA
    if (b->pinned) cudaFreeHost(b->p);
    else
#endif
        free(b->p);
    *b = (zr_staging_buf){NULL, 0, 0};
}

zr_status zr_staging_take(zr_staging *s, size_t bytes, zr_staging_buf *out) {
    pthread_mutex_lock(&s->lock);
    zr_staging_buf b = s->kept;
    s->kept = (zr_staging_buf){NULL, 0, 0};
    pthread_mutex_unlock(&s->lock);
    if (b.bytes >= bytes) {
        *out = b;
        return ZR_OK;
    }
    buf_free(&b);
#ifdef ZR_HAVE_CUDA
    if (zr_cuda_is_available()) {
        if (cudaHostAlloc((void **)&b.p, bytes, cudaHostAllocPortable) == cudaSuccess) {
            *out = (zr_staging_buf){b.p, bytes, 1};
            return ZR_OK;
        }
        cudaGetLastError(); /* not sticky: fall back to plain memory */
    }
#endif
    b.p = aligned_alloc(4096, (bytes + 4095) & ~(size_t)4095);
    if (!b.p)
        return zr_error("out of host memory for a %zu MB file staging buffer; free host memory", bytes >> 20);
    *out = (zr_staging_buf){b.p, bytes, 0};
    return ZR_OK;
}

void zr_staging_give(zr_staging *s, zr_staging_buf *b) {
    pthread_mutex_lock(&s->lock);
    zr_staging_buf old = s->kept;
    if (b->bytes >= old.bytes) s->kept = *b;
    else old = *b;
    pthread_mutex_unlock(&s->lock);
    buf_free(&old);
    *b = (zr_staging_buf){NULL, 0, 0};
}
