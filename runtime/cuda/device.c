/* CUDA device layer (see cuda.h): lazy runtime init, per-thread current device, per-device compute
 * and comm streams, events and error translation. Without ZR_HAVE_CUDA only the availability
 * stubs are compiled (no GPU, count 0). */
#include "cuda/device.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef ZR_HAVE_CUDA
#include <pthread.h>

#define MAX_CUDA (ZR_MAX_DEVICES - 1)

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static int g_count;
static char g_reason[256];
static int g_default_device;

typedef struct {
    int ready;
    cudaStream_t compute, comm;
} dev_state;
static dev_state devs[MAX_CUDA];
static pthread_mutex_t dev_lock = PTHREAD_MUTEX_INITIALIZER;
static _Thread_local int tl_current = -1;

static void do_init(void) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        snprintf(g_reason, sizeof g_reason, "%s (%s)", cudaGetErrorString(e), cudaGetErrorName(e));
        cudaGetLastError();
        n = 0;
    } else if (n == 0)
        snprintf(g_reason, sizeof g_reason, "no CUDA-capable device is detected");
    g_count = n > MAX_CUDA ? MAX_CUDA : n;
}

int zr_cuda_device_count(void) {
    pthread_once(&init_once, do_init);
    return g_count;
}
int zr_cuda_is_available(void) { return zr_cuda_device_count() > 0; }
const char *zr_cuda_unavailable_reason(void) {
    zr_cuda_device_count();
    return g_reason;
}

zr_status zr_cuda_check(cudaError_t e, const char *op, const char *file, int line) {
    if (e == cudaSuccess) return ZR_OK;
    int dev = tl_current;
    if (dev < 0) cudaGetDevice(&dev);
    cudaGetLastError(); /* clear it if it is not sticky */
    return zr_set_error_at(file, line, "%s on cuda:%d: %s (%s)", op, dev, cudaGetErrorString(e),
                           cudaGetErrorName(e));
}

zr_status zr_cuda_page_lock(void *p, size_t bytes, const char *setting, const char *what) {
    cudaError_t e = cudaHostRegister(p, bytes, cudaHostRegisterDefault);
    if (e == cudaSuccess) return ZR_OK;
    cudaGetLastError();
    return zr_error("%s: page-locking %s (%.2f GiB) failed (%s); raise the locked-memory limit (ulimit -l) or set %s "
                    "to false", setting, what, (double)bytes / (1 << 30), cudaGetErrorString(e), setting);
}

zr_status zr_cuda_check_device(zr_device dev, const char *op) {
    int n = zr_cuda_device_count();
    if (dev.type != ZR_CUDA) return zr_error("%s: expected a CUDA device", op);
    if (n == 0)
        return zr_error("%s: cuda:%d is not available: %s; use device 'cpu'", op, dev.index, g_reason);
    if (dev.index < 0 || dev.index >= n)
        return zr_error("%s: cuda:%d is not available: this machine has %d CUDA device%s (cuda:0%s)",
                        op, dev.index, n, n == 1 ? "" : "s", n == 1 ? "" : " ..");
    return ZR_OK;
}

zr_status zr_cuda_use(int index) {
    if (tl_current == index) return ZR_OK;
    ZR_CHECK(zr_cuda_check_device((zr_device){ZR_CUDA, (int8_t)index}, "set_device"));
    ZR_CHECK(ZR_CUDA_CHECK(cudaSetDevice(index), "set_device"));
    tl_current = index;
    return ZR_OK;
}

zr_status zr_cuda_set_device(int n) {
    ZR_CHECK(zr_cuda_use(n));
    g_default_device = n;
    return ZR_OK;
}
int zr_cuda_current_device(void) { return tl_current >= 0 ? tl_current : g_default_device; }

/* Creates the device's streams once; returns its state or NULL (error set). */
static dev_state *ensure(int index) {
    if (zr_cuda_use(index)) return NULL;
    dev_state *d = &devs[index];
    if (__atomic_load_n(&d->ready, __ATOMIC_ACQUIRE)) return d;
    pthread_mutex_lock(&dev_lock);
    zr_status st = ZR_OK;
    if (!d->ready) {
        st = ZR_CUDA_CHECK(cudaStreamCreateWithFlags(&d->compute, cudaStreamNonBlocking), "stream create");
        if (!st) st = ZR_CUDA_CHECK(cudaStreamCreateWithFlags(&d->comm, cudaStreamNonBlocking), "stream create");
        if (!st) __atomic_store_n(&d->ready, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&dev_lock);
    return st ? NULL : d;
}

cudaStream_t zr_cuda_stream(zr_device dev) {
    dev_state *d = ensure(dev.index);
    return d ? d->compute : 0; /* unreachable for a device that holds tensors */
}
cudaStream_t zr_cuda_comm_stream(zr_device dev) {
    dev_state *d = ensure(dev.index);
    return d ? d->comm : 0;
}

zr_status zr_cuda_synchronize(int index) {
    int n = zr_cuda_device_count();
    for (int i = 0; i < n; i++) {
        if (index >= 0 && i != index) continue;
        if (index < 0 && !devs[i].ready) continue;
        ZR_CHECK(zr_cuda_use(i));
        ZR_CHECK(ZR_CUDA_CHECK(cudaDeviceSynchronize(), "synchronize"));
    }
    if (index >= n) return zr_cuda_check_device((zr_device){ZR_CUDA, (int8_t)index}, "synchronize");
    return ZR_OK;
}

zr_status zr_cuda_device_info(int index, char *name, int *sm_count, int64_t *total_mem) {
    ZR_CHECK(zr_cuda_check_device((zr_device){ZR_CUDA, (int8_t)index}, "device_info"));
    struct cudaDeviceProp p;
    ZR_CHECK(ZR_CUDA_CHECK(cudaGetDeviceProperties(&p, index), "device_info"));
    if (name) snprintf(name, 256, "%s", p.name);
    if (sm_count) *sm_count = p.multiProcessorCount;
    if (total_mem) *total_mem = (int64_t)p.totalGlobalMem;
    return ZR_OK;
}

cudaEvent_t zr_cuda_event_new(int timing) {
    cudaEvent_t e = NULL;
    if (ZR_CUDA_CHECK(cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming),
                      "event create"))
        return NULL;
    return e;
}
zr_status zr_cuda_event_record(cudaEvent_t ev, cudaStream_t s) {
    return ZR_CUDA_CHECK(cudaEventRecord(ev, s), "event record");
}
zr_status zr_cuda_stream_wait(cudaStream_t s, cudaEvent_t ev) {
    return ZR_CUDA_CHECK(cudaStreamWaitEvent(s, ev, 0), "stream wait");
}
zr_status zr_cuda_event_sync(cudaEvent_t ev) {
    return ZR_CUDA_CHECK(cudaEventSynchronize(ev), "event synchronize");
}
float zr_cuda_event_elapsed_ms(cudaEvent_t start, cudaEvent_t end) {
    float ms = 0;
    if (ZR_CUDA_CHECK(cudaEventElapsedTime(&ms, start, end), "event elapsed")) return -1;
    return ms;
}
void zr_cuda_event_free(cudaEvent_t ev) {
    if (ev) cudaEventDestroy(ev);
}

#else /* no CUDA in this build */

int zr_cuda_device_count(void) { return 0; }
int zr_cuda_is_available(void) { return 0; }
const char *zr_cuda_unavailable_reason(void) { return "this zrun was built without CUDA"; }
zr_status zr_cuda_set_device(int n) {
    return zr_error("set_device(%d): this zrun was built without CUDA (see `zrun report`)", n);
}
int zr_cuda_current_device(void) { return 0; }
zr_status zr_cuda_check_device(zr_device dev, const char *op) {
    return zr_error("%s: cuda:%d is not available: this zrun was built without CUDA", op, dev.index);
}
zr_status zr_cuda_synchronize(int index) {
    (void)index;
    return ZR_OK;
}
zr_status zr_cuda_device_info(int index, char *name, int *sm_count, int64_t *total_mem) {
    return zr_error("device_info(%d): this zrun was built without CUDA", index);
}
void zr_cuda_install(void) {}
void zr_cuda_mem_get_stats(int index, zr_cuda_mem_stats *out) { memset(out, 0, sizeof *out); }
void zr_cuda_empty_cache(int index) { (void)index; }

#endif

/* Device names (zr_device, dtype.h): here because a plain "cuda" is the current device. */
int zr_device_parse(const char *s, zr_device *out) {
    if (strcmp(s, "cpu") == 0) {
        *out = zr_cpu();
        return 0;
    }
    if (strncmp(s, "cuda", 4) == 0) {
        int idx = zr_cuda_current_device(); /* plain "cuda": the current device, as in PyTorch */
        if (s[4] == ':') {
            char *end;
            long v = strtol(s + 5, &end, 10);
            if (*end || v < 0 || v >= ZR_MAX_DEVICES - 1) return -1;
            idx = (int)v;
        } else if (s[4]) return -1;
        *out = (zr_device){ZR_CUDA, (int8_t)idx};
        return 0;
    }
    return -1;
}
