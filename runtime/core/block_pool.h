/* A pool of device memory in blocks, the policy of PyTorch's CUDA caching allocator: memory is
 * taken from the device in segments, handed out in 512-byte blocks split off them (best fit),
 * merged with free neighbours when freed, and given back only as whole free segments. Plain C over
 * two callbacks (take and return a segment), so the CUDA allocator (cuda/caching_alloc.c) and the
 * CPU tests (tests/c/test_block_pool.c) run the same code. Not thread-safe: the caller locks.
 *
 * Segments: a request of up to 1 MiB is served from 2 MiB segments ("small" blocks, kept apart
 * from the rest), up to 10 MiB from 20 MiB segments, anything larger from a segment of its own
 * rounded up to a quarter of its power of two (300 MiB -> 320 MiB), or to 2 MiB steps when the
 * device refuses that. A block is only handed out again to the stream it was made for. */
#ifndef ZR_BLOCK_POOL_H
#define ZR_BLOCK_POOL_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    /* size bytes from the device, or NULL when it has no room (or another error, the caller's to
     * report: the pool only retries the exact size, then gives up) */
    void *(*take)(void *ctx, size_t size);
    void (*give_back)(void *ctx, void *ptr);
    void *ctx;
} zr_pool_source;

typedef struct {
    int64_t allocated; /* bytes in blocks handed out (rounded to 512) */
    int64_t reserved;  /* bytes in segments taken from the device */
    int64_t peak_allocated, peak_reserved;
    int64_t n_segments;            /* segments held now */
    int64_t n_take, n_give_back;   /* segments taken from / returned to the device */
    int64_t n_alloc, n_cache_hits; /* requests; those served without taking a segment */
} zr_pool_stats;

typedef struct zr_pool_block zr_pool_block;

typedef struct {
    zr_pool_source src;
    zr_pool_block **free_set; /* free blocks by (small, stream, size, address) */
    int n_free, cap_free;
    zr_pool_block **used; /* blocks handed out, by address */
    int n_used, cap_used;
    zr_pool_block *spares; /* block structs kept for reuse, linked by next */
    int n_spares;
    zr_pool_stats st;
} zr_block_pool;

enum { ZR_POOL_OK = 0, ZR_POOL_NO_DEVICE_MEMORY = 1, ZR_POOL_NO_HOST_MEMORY = 2 };

#define ZR_POOL_ALIGN ((size_t)512)

void zr_pool_init(zr_block_pool *p, zr_pool_source src);
/* A block of at least nbytes (0 counts as 1) for stream into *out; ZR_POOL_OK, or
 * ZR_POOL_NO_DEVICE_MEMORY when no free block fits and the device gave no segment (free some and
 * retry: zr_pool_release), or ZR_POOL_NO_HOST_MEMORY. *size_out (if given): the block's size. */
int zr_pool_alloc(zr_block_pool *p, size_t nbytes, uintptr_t stream, void **out, size_t *size_out);
/* Frees the block at ptr (from zr_pool_alloc): returns its size, or 0 for a pointer the pool did
 * not hand out (nothing done). */
size_t zr_pool_free(zr_block_pool *p, void *ptr);
/* Returns every wholly free segment to the device; returns the bytes given back. */
size_t zr_pool_release(zr_block_pool *p);
/* Gives back every segment (blocks still handed out included) and the pool's host memory. */
void zr_pool_destroy(zr_block_pool *p);

/* The segment size the pool asks the device for, for a request of nbytes (exposed for tests). */
size_t zr_pool_segment_size(size_t nbytes);

/* Checks the pool's invariants (blocks tile their segments, neighbours are never both free, the
 * sets are sorted, the counters add up): 0, or -1 with a reason in why (tests). */
int zr_pool_check(const zr_block_pool *p, char *why, size_t len);

#endif
