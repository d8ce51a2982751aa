/* Storage allocation with per-category accounting. Every byte a tensor owns belongs to one
 * category, so memory can be reported exactly by kind and device (zr.memory.stats()).
 * The CPU allocator is malloc-based (64-byte aligned); a CUDA backend registers its own
 * allocate/free pair (a caching allocator) with zr_alloc_set_backend. */
#ifndef ZR_ALLOC_H
#define ZR_ALLOC_H

#include "kernels/base/dtype.h"
#include "kernels/base/error.h"

typedef enum {
    ZR_MEM_PARAMS = 0,
    ZR_MEM_GRADS,
    ZR_MEM_OPTIMIZER,
    ZR_MEM_ACTIVATIONS,
    ZR_MEM_COMM,
    ZR_MEM_WORKSPACE,
    ZR_MEM_OTHER,
    ZR_MEM_NCATEGORIES
} zr_mem_category;

typedef struct zr_storage {
    int refcount;
    void *data;
    size_t nbytes;
    zr_device device;
    zr_mem_category category;
    int external; /* memory not owned (wrapping a caller's buffer): never freed, not counted */
} zr_storage;

typedef struct {
    int64_t current[ZR_MEM_NCATEGORIES];
    int64_t peak[ZR_MEM_NCATEGORIES];
    int64_t total_current, total_peak; /* peak of the sum, not the sum of peaks */
    int64_t at_peak[ZR_MEM_NCATEGORIES]; /* each category's bytes when total_peak was reached */
    int64_t window_peak[ZR_MEM_NCATEGORIES]; /* peak since zr_mem_window_reset (memory traces) */
    int64_t n_allocs, n_frees;
} zr_mem_stats;

typedef struct {
    void *(*alloc)(zr_device dev, size_t nbytes); /* NULL on failure, message set */
    void (*free)(zr_device dev, void *p, size_t nbytes);
    void (*zero)(zr_device dev, void *p, size_t nbytes); /* memset 0 on the device's stream */
} zr_alloc_backend;

const char *zr_mem_category_name(zr_mem_category c);
int zr_mem_category_parse(const char *s); /* -1 if unknown */

/* New storage with refcount 1; zeroed when zero != 0. NULL on failure (out-of-memory message
 * includes the device's per-category breakdown). */
zr_storage *zr_storage_new(zr_device dev, size_t nbytes, zr_mem_category cat, int zero);
/* Wraps memory the caller owns; the storage never frees it. */
zr_storage *zr_storage_wrap(zr_device dev, void *data, size_t nbytes);
void zr_storage_retain(zr_storage *s);
void zr_storage_release(zr_storage *s);
/* Moves the storage's bytes to another category (e.g. a fresh tensor becomes a parameter). */
void zr_storage_set_category(zr_storage *s, zr_mem_category cat);

void zr_mem_get_stats(zr_device dev, zr_mem_stats *out);
void zr_mem_reset_peak(zr_device dev);
/* Restarts the window peak (a second peak figure for per-op memory traces). */
void zr_mem_window_reset(zr_device dev);
/* Writes a one-line per-category breakdown ("params 1.2 GiB, grads ...") into buf. */
void zr_mem_describe(zr_device dev, char *buf, size_t len);

/* Host blocks of 32 MiB or more that were freed are kept (at most 8 blocks, 1 GiB) for the next request
 * of their size, rounded to 2 MiB, instead of being unmapped and faulted in again at every step:
 * the bytes kept now (no tensor's: not in zr_mem_get_stats), and their release to the OS (done
 * also under host memory pressure and before an allocation that would fail). */
size_t zr_mem_host_kept(void);
void zr_mem_host_trim(void);

void zr_alloc_set_backend(zr_device_type t, const zr_alloc_backend *b);

/* The embedding language's garbage collector (main.c: a full Lua collection, whose finalizers free
 * the tensors nothing reaches). Lua frees a tensor only when its collector reaches the handle,
 * which a loop that allocates little on the Lua heap seldom triggers: its garbage tensors pile up
 * (PyTorch's reference counts free them at once). So it is asked before a host allocation takes
 * the CPU's tensor bytes past a soft limit, the bytes after the last time plus a quarter, at least
 * ZR_MEM_COLLECT_FLOOR more (malloc does not fail on Linux: the kernel would kill the process),
 * and when a device allocation fails (zr_mem_collect, from the CUDA allocator). fn(ctx, dev,
 * failed) returns whether it collected (it may decline when little could be freed and nothing
 * failed). Only on the thread that set it (fn NULL: none), never inside itself. */
#define ZR_MEM_COLLECT_FLOOR ((int64_t)256 << 20)
void zr_mem_set_collector(int (*fn)(void *ctx, zr_device dev, int failed), void *ctx);
/* Sets another floor than ZR_MEM_COLLECT_FLOOR (bytes, > 0; main.c: ZRUN_COLLECT_FLOOR_MB); the
 * floor in force. */
void zr_mem_set_collect_floor(int64_t bytes);
int64_t zr_mem_collect_floor(void);
/* Asks the collector now, for dev (failed: an allocation there failed). Returns -1 when it may not
 * run (none set, another thread, inside itself), else whether it collected (counted per kind). */
int zr_mem_collect(zr_device dev, int failed);
/* Runs so far: for the host's soft limit, and for failed device allocations. */
void zr_mem_collections(int64_t *host, int64_t *device);

/* Category given to tensors created by creation functions (zeros, randn, ...); ops tag their
 * outputs as activations. Per thread; returns the previous value. */
zr_mem_category zr_mem_set_default_category(zr_mem_category c);
zr_mem_category zr_mem_default_category(void);

#endif
