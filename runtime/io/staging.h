/* Host staging buffers for file I/O, kept for the process: page-locked when a CUDA device is
 * present (device copies into and out of them run at full speed and may be asynchronous), plain
 * memory otherwise. Pinning costs about as much as the copies it speeds up, so it is paid once.
 *
 *   static zr_staging pool = ZR_STAGING_INIT;
 *   zr_staging_buf b;
 *   if (zr_staging_take(&pool, 128 << 20, &b)) return ZR_ERR;  // the kept buffer, or a new one
 *   ...                                                        // use b.p (b.bytes >= asked)
 *   zr_staging_give(&pool, &b);                                // kept for the next take
 * A take while the kept buffer is out (nested or concurrent use) gets a buffer of its own. */
#ifndef ZR_STAGING_H
#define ZR_STAGING_H

#include <pthread.h>
#include <stddef.h>

#include "kernels/base/error.h"

typedef struct {
    char *p;
    size_t bytes;
    int pinned; /* p came from cudaHostAlloc */
} zr_staging_buf;
typedef struct {
    pthread_mutex_t lock;
    zr_staging_buf kept;
} zr_staging;
#define ZR_STAGING_INIT {PTHREAD_MUTEX_INITIALIZER, {NULL, 0, 0}}

zr_status zr_staging_take(zr_staging *s, size_t bytes, zr_staging_buf *out);
/* Keeps b in the pool (freeing the smaller of b and what the pool holds). */
void zr_staging_give(zr_staging *s, zr_staging_buf *b);

#endif
