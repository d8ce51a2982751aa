/* The CUDA backend's device layer: lazy runtime init, device selection, one compute stream and
 * one comm stream per device, events, error checks, and the caching allocator's controls.
 *
 *   if (!zr_is_cpu(x)) {                     // in an ops file, under #ifdef ZR_HAVE_CUDA
 *       cudaStream_t s = zr_cuda_stream(zr_tensor_device(x));  // also makes x's device current
 *       if (relu_forward_cuda(y, x, n, x->dtype, s)) return ZR_ERR;
 *   }
 *
 * Nothing touches the CUDA runtime until a CUDA function is first called, so a CUDA build runs on
 * a machine without a GPU (zr_cuda_is_available() is then 0). The availability queries and the
 * memory statistics exist in every build (stubs without ZR_HAVE_CUDA); the stream/event API only
 * in CUDA builds. Work for a device goes on its compute stream (non-blocking: it does not wait for
 * the legacy default stream), so device memory is reused in stream order by the allocator. */
#ifndef ZR_CUDA_DEVICE_H
#define ZR_CUDA_DEVICE_H

#include <stdint.h>

#include "core/tensor.h"

/* Number of CUDA devices (0 when there is no driver or GPU; never an error). First call
 * initialises the runtime. */
int zr_cuda_device_count(void);
int zr_cuda_is_available(void);
/* Why no device is available ("no CUDA-capable device is detected"), or "" when one is. */
const char *zr_cuda_unavailable_reason(void);
/* Makes device n current for this thread and the default for "cuda" (zr_cuda_current_device).
 * Error when n is out of range. */
zr_status zr_cuda_set_device(int n);
int zr_cuda_current_device(void);
/* Fails with a message naming dev unless it is a usable CUDA device. */
zr_status zr_cuda_check_device(zr_device dev, const char *op);
/* Waits for all work on dev (or, with index -1, on every device that was used). */
zr_status zr_cuda_synchronize(int index);
/* Device name and multiprocessor count ("NVIDIA H200", 132); name buf >= 256 bytes. */
zr_status zr_cuda_device_info(int index, char *name, int *sm_count, int64_t *total_mem);

/* Parses "cpu", "cuda" (the current device: zr_cuda_set_device), "cuda:N"; returns 0 on success. */
int zr_device_parse(const char *s, zr_device *out);

/* Installs the CUDA backend into the core (allocator, device copy/fill, random fills). Idempotent
 * and cheap (touches no CUDA API); also run automatically at program start in CUDA builds. */
void zr_cuda_install(void);

/* --- caching allocator (cuda/caching_alloc.c) --- */
typedef struct {
    int64_t allocated;      /* bytes in blocks handed out (rounded sizes) */
    int64_t cached;         /* bytes in free blocks kept for reuse */
    int64_t reserved;       /* allocated + cached: what cudaMalloc holds */
    int64_t peak_reserved;
    int64_t peak_allocated;
    int64_t n_cuda_malloc, n_cuda_free; /* calls into the driver */
    int64_t n_alloc, n_cache_hits;      /* allocator requests, served from the cache */
    int64_t device_free, device_total;  /* cudaMemGetInfo (0 when unknown) */
} zr_cuda_mem_stats;

/* Statistics of device index (zeros for a device never used or a build without CUDA). */
void zr_cuda_mem_get_stats(int index, zr_cuda_mem_stats *out);
/* Returns the wholly free segments of device index (-1: all devices) to the driver. */
void zr_cuda_empty_cache(int index);

#ifdef ZR_HAVE_CUDA
#include <cuda_runtime_api.h>

/* Sets dev current for this thread and returns its compute stream (created on first use). dev
 * must be a valid device: any device that holds a tensor is. */
cudaStream_t zr_cuda_stream(zr_device dev);
/* The second stream, for communication overlapping compute (ZeRO bucket reduces). */
cudaStream_t zr_cuda_comm_stream(zr_device dev);
/* Makes device index current for this thread (cached: no driver call when it already is). */
zr_status zr_cuda_use(int index);

/* Turns a CUDA error into a zrun error:
 *   "matmul on cuda:0: an illegal memory access was encountered (cudaErrorIllegalAddress)".
 * Returns ZR_OK for cudaSuccess. Clears non-sticky errors. */
zr_status zr_cuda_check(cudaError_t e, const char *op, const char *file, int line);
#define ZR_CUDA_CHECK(expr, op) zr_cuda_check((expr), (op), __FILE__, __LINE__)

/* Events: new (timing on when timing != 0), record on a stream, make a stream wait for one,
 * wait on the host, elapsed milliseconds between two recorded events, free. */
cudaEvent_t zr_cuda_event_new(int timing);
zr_status zr_cuda_event_record(cudaEvent_t ev, cudaStream_t s);
zr_status zr_cuda_stream_wait(cudaStream_t s, cudaEvent_t ev);
zr_status zr_cuda_event_sync(cudaEvent_t ev);
float zr_cuda_event_elapsed_ms(cudaEvent_t start, cudaEvent_t end);
void zr_cuda_event_free(cudaEvent_t ev);

/* Raw allocator access for runtime code that needs device scratch outside a tensor (counted in
 * reserved/allocated but in no memory category; prefer a ZR_MEM_WORKSPACE tensor). Blocks are
 * reused on the stream they were allocated for. */
void *zr_cuda_malloc(zr_device dev, size_t nbytes, cudaStream_t stream);
void zr_cuda_free(zr_device dev, void *p);

/* Page-locks bytes of host memory at p for DMA (cudaHostRegister; undo with cudaHostUnregister). On
 * failure one line: `setting` (the config key that asked for it), what, its size and the fix. */
zr_status zr_cuda_page_lock(void *p, size_t bytes, const char *setting, const char *what);

/* Queues a copy of bytes of host memory src (a small table: kernel descriptors) to device memory dst
 * on stream s and returns without waiting for the GPU; src may change at once (cuda/upload.c copies it
 * into one of four page-locked slots per device first, taken in turn, and reuses a slot once the copy
 * that read it has run: only an upload queued while the one four before it still waits for the GPU
 * waits). A table larger than the slot's last one allocates a larger slot (cudaHostAlloc, at least
 * 16 KB: rare in a run). */
zr_status zr_cuda_upload(zr_device dev, void *dst, const void *src, size_t bytes, cudaStream_t s);
#endif

#endif
