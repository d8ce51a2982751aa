/* NCCL backend of the collectives (comm.h) for CUDA tensors. One communicator per process,
 * created on first use on the tensor's device; the unique id travels over MPI, or over TCP for
 * ranks started by torchrun (rank 0 makes it),
 * so a single process without a launcher gets a world of one and still runs through NCCL.
 * Collectives run on the device's comm stream, ordered after the compute stream's pending work by
 * an event and before its later work by another: no host synchronisation.
 *
 * Deadlines (comm_watch.h): the communicator is non-blocking (NCCL >= 2.14), so no NCCL call can
 * hold the host: one that answers ncclInProgress is polled against the deadline. What runs on the
 * GPU is watched by a thread: every collective records an event on the comm stream; the thread
 * checks, a few times per deadline, the oldest event not yet reached and ncclCommGetAsyncError.
 * Past the deadline, or on an error, it aborts the communicator (the stuck kernels exit, so the
 * main thread comes back from whatever CUDA call it waits in) and hands the failure to the main
 * thread, which asks the other ranks and stops the job (or it stops the job itself when the main
 * thread does not come back). */
#if defined(ZR_HAVE_CUDA) && defined(ZR_HAVE_NCCL)
#include <nccl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda/device.h"
#include "ops/util.h"
#include "zero/comm.h"
#include "zero/comm_tcp.h"
#include "zero/comm_watch.h"

#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0)
#define NONBLOCKING 1 /* ncclCommInitRankConfig, config.blocking = 0 */
#else
#define NONBLOCKING 0
#endif

static ncclComm_t comm;
static int comm_device = -1;
static cudaEvent_t ev_before;
/* Held around every call that takes the communicator, so the watchdog never aborts it while
 * the main thread is inside NCCL; `aborted` is set under it. */
static pthread_mutex_t comm_mu = PTHREAD_MUTEX_INITIALIZER;
static int aborted;
/* The process is exiting: the CUDA runtime may already be unloading, so the watchdog stops. */
static int stopping;
static void stop_watching(void) { __atomic_store_n(&stopping, 1, __ATOMIC_RELEASE); }

static zr_status nccl_check(ncclResult_t r, const char *op) {
    if (r == ncclSuccess) return ZR_OK;
    return zr_error("%s failed on rank %d (cuda:%d): %s", op, zr_comm_rank(), comm_device, ncclGetErrorString(r));
}

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* The watchdog aborted the communicator: its failure, posted for the main thread, ends the job. */
static _Noreturn void after_abort(void) {
    for (;;) {
        zr_watch_take_over();
        sleep_s(1e-3);
    }
}

/* Takes the communicator for one NCCL call (or stops, when the watchdog has aborted it). */
static void take(void) {
    pthread_mutex_lock(&comm_mu);
    if (aborted) {
        pthread_mutex_unlock(&comm_mu);
        after_abort();
    }
}
static void give(void) { pthread_mutex_unlock(&comm_mu); }

/* After a call on the non-blocking communicator returned r: until NCCL has taken the call
 * (ncclCommGetAsyncError leaves ncclInProgress), poll against the deadline, answering the other
 * ranks meanwhile. Past it, abort the communicator and report d. */
static zr_status settle(ncclResult_t r, const char *op, const zr_comm_desc *d) {
    double t0 = zr_watch_now(), limit = zr_watch_timeout() > 0 ? t0 + zr_watch_timeout() : 1e300;
    while (r == ncclInProgress) {
        take();
        if (ncclCommGetAsyncError(comm, &r) != ncclSuccess) r = ncclInternalError;
        if (r == ncclInProgress && zr_watch_now() >= limit) {
            ncclCommAbort(comm);
            __atomic_store_n(&aborted, 1, __ATOMIC_RELEASE);
            give();
            zr_watch_fail(d, zr_watch_now() - t0, NULL);
        }
        give();
        if (r == ncclInProgress) {
            zr_watch_poll();
            sleep_s(1e-4);
        }
    }
    if (r == ncclSuccess) return ZR_OK;
    /* an error leaves the communicator unusable: every rank must stop */
    take();
    const char *last = ncclGetLastError(comm);
    char why[384];
    snprintf(why, sizeof why, "%s: %s%s%s", op, ncclGetErrorString(r), last && *last ? ": " : "", last ? last : "");
    ncclCommAbort(comm);
    __atomic_store_n(&aborted, 1, __ATOMIC_RELEASE);
    give();
    zr_watch_fail(d, zr_watch_now() - t0, why);
}

/* --- the watchdog: events of the collectives in flight, oldest first --- */

enum { RING = 1024 };
typedef struct {
    cudaEvent_t ev; /* created once per slot, recorded again for each collective */
    double t;       /* when it was enqueued */
    zr_comm_desc d;
} watched;
static watched ring[RING];
static int head, tail; /* [head, tail): in flight; under ring_mu */
static pthread_mutex_t ring_mu = PTHREAD_MUTEX_INITIALIZER;

/* Main thread, after enqueueing d on stream s. A full ring skips the watch of this one: the
 * stream runs in order, so a stall here also stalls the next one watched. */
static void watch_push(cudaStream_t s, const zr_comm_desc *d) {
    pthread_mutex_lock(&ring_mu);
    watched *w = &ring[tail];
    if ((tail + 1) % RING != head && (w->ev || cudaEventCreateWithFlags(&w->ev, cudaEventDisableTiming) == cudaSuccess) &&
        cudaEventRecord(w->ev, s) == cudaSuccess) {
        w->t = zr_watch_now();
        w->d = *d;
        tail = (tail + 1) % RING;
    }
    pthread_mutex_unlock(&ring_mu);
}

/* Watchdog: aborts the communicator, hands the failure to the main thread, and stops the job
 * itself if the main thread does not take it within 15 s plus the time it needs to ask. */
static _Noreturn void watchdog_fail(const zr_comm_desc *d, double waited, const char *why) {
    /* A blocking communicator (NCCL < 2.14) can hold the lock inside a stuck call: abort anyway. */
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 2;
    int locked = pthread_mutex_timedlock(&comm_mu, &until) == 0;
    if (!aborted) ncclCommAbort(comm);
    __atomic_store_n(&aborted, 1, __ATOMIC_RELEASE);
    if (locked) pthread_mutex_unlock(&comm_mu);
    double t = zr_watch_timeout();
    if (!zr_watch_post(d, waited, why, 15 + (t > 0 && t < 100 ? t / 10 : 10))) zr_watch_fail_alone(d, waited, why);
    for (;;) sleep_s(1); /* the main thread is stopping the job */
}

static void *watchdog(void *arg) {
    (void)arg;
    cudaSetDevice(comm_device);
    for (;;) {
        double tmo = zr_watch_timeout(), tick = tmo > 0 ? tmo / 20 : 1;
        sleep_s(tick < 0.05 ? 0.05 : tick > 1 ? 1 : tick);
        if (__atomic_load_n(&aborted, __ATOMIC_ACQUIRE)) continue; /* the main thread reports */
        if (__atomic_load_n(&stopping, __ATOMIC_ACQUIRE)) return NULL;
        zr_comm_desc oldest;
        double since = 0;
        int have = 0;
        cudaError_t e = cudaSuccess;
        pthread_mutex_lock(&ring_mu);
        while (head != tail && (e = cudaEventQuery(ring[head].ev)) == cudaSuccess) head = (head + 1) % RING;
        if (head != tail) {
            oldest = ring[head].d;
            since = zr_watch_now() - ring[head].t;
            have = 1;
        }
        pthread_mutex_unlock(&ring_mu);
        if (__atomic_load_n(&stopping, __ATOMIC_ACQUIRE) || e == cudaErrorCudartUnloading) return NULL;
        if (have && e != cudaErrorNotReady) {
            char why[256];
            snprintf(why, sizeof why, "CUDA error on cuda:%d: %s (%s)", comm_device, cudaGetErrorString(e), cudaGetErrorName(e));
            watchdog_fail(&oldest, since, why);
        }
        ncclResult_t ae = ncclSuccess;
        char why[384] = "";
        if (pthread_mutex_trylock(&comm_mu) == 0) { /* busy: the main thread is in a short call; next tick */
            if (!aborted && ncclCommGetAsyncError(comm, &ae) != ncclSuccess) ae = ncclInternalError;
            if (!aborted && ae != ncclSuccess && ae != ncclInProgress) {
                const char *last = ncclGetLastError(comm);
                snprintf(why, sizeof why, "%s%s%s", ncclGetErrorString(ae), last && *last ? ": " : "", last ? last : "");
            }
            pthread_mutex_unlock(&comm_mu);
        }
        if (why[0]) {
            watchdog_fail(have ? &oldest : zr_watch_last(), since, why);
        }
        if (have && tmo > 0 && since > tmo) watchdog_fail(&oldest, since, NULL);
    }
    return NULL;
}

/* --- the communicator --- */

static zr_status ensure(zr_device dev) {
    if (comm) {
        if (dev.index != comm_device)
            return zr_error("NCCL collectives: this rank's communicator is on cuda:%d but the tensor is on "
                            "cuda:%d; use one GPU per rank (zr.cuda.set_device(local_rank))", comm_device, dev.index);
        return ZR_OK;
    }
    ZR_CHECK(zr_comm_init());
    const zr_comm_info *info = zr_comm_get();
    ncclUniqueId id;
    if (info->rank == 0) ZR_CHECK(nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId"));
    zr_comm_desc d;
    zr_watch_desc(&d, ZR_COLL_BROADCAST, NULL, NULL, 0);
    d.ndim = 1;
    d.shape[0] = (int64_t)sizeof id;
    snprintf(d.label, sizeof d.label, "NCCL unique id for cuda:%d", dev.index);
#ifdef ZR_HAVE_MPI
    if (info->mpi && info->world_size > 1) {
        zr_watch_issue(&d);
        MPI_Request rq;
        if (MPI_Ibcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD, &rq) != MPI_SUCCESS || zr_watch_mpi(&rq, &d))
            return zr_error("broadcasting the NCCL unique id over MPI failed");
    }
#endif
    if (info->tcp && info->world_size > 1) { /* ranks joined by torchrun's variables */
        zr_watch_issue(&d);
        ZR_CHECK(zr_watch_arrive(&d));
        ZR_CHECK(zr_tcp_broadcast(&id, sizeof id, 0, &d));
    }
    ZR_CHECK(zr_cuda_use(dev.index));
    d.coll = ZR_COLL_NCCL_INIT;
    d.device = dev.index;
    d.label[0] = 0;
    zr_watch_issue(&d);
    comm_device = dev.index;
#if NONBLOCKING
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&comm, info->world_size, id, info->rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) {
        comm = NULL;
        return nccl_check(r, "ncclCommInitRankConfig");
    }
    ZR_CHECK(settle(r, "ncclCommInitRankConfig", &d));
#else
    ZR_CHECK(nccl_check(ncclCommInitRank(&comm, info->world_size, id, info->rank), "ncclCommInitRank"));
#endif
    ev_before = zr_cuda_event_new(0);
    atexit(stop_watching);
    pthread_t th;
    if (pthread_create(&th, NULL, watchdog, NULL) != 0) return zr_error("NCCL: could not start the watchdog thread");
    pthread_detach(th);
    return ZR_OK;
}

static ncclDataType_t nccl_type(zr_dtype t) {
    switch (t) {
    case ZR_F32: return ncclFloat32;
    case ZR_BF16: return ncclBfloat16;
    case ZR_F16: return ncclFloat16;
    case ZR_F64: return ncclFloat64;
    case ZR_I32: return ncclInt32;
    case ZR_I64: return ncclInt64;
    default: return ncclUint8;
    }
}
static ncclRedOp_t nccl_op(zr_reduce_op op) {
    switch (op) {
    case ZR_RED_AVG: return ncclAvg;
    case ZR_RED_MAX: return ncclMax;
    case ZR_RED_MIN: return ncclMin;
    default: return ncclSum;
    }
}

/* Orders the comm stream after the compute stream; returns the comm stream. */
static cudaStream_t begin(zr_device dev) {
    cudaStream_t cs = zr_cuda_stream(dev), ms = zr_cuda_comm_stream(dev);
    zr_cuda_event_record(ev_before, cs);
    zr_cuda_stream_wait(ms, ev_before);
    return ms;
}
/* --- async: the collective's own event, which the compute stream waits on in nccl_wait --- */

static zr_status end_async(cudaStream_t ms, void **ev, const zr_comm_desc *d) {
    watch_push(ms, d);
    cudaEvent_t e = zr_cuda_event_new(0);
    if (!e) return ZR_ERR;
    if (zr_cuda_event_record(e, ms)) {
        zr_cuda_event_free(e);
        return ZR_ERR;
    }
    *ev = e;
    return ZR_OK;
}

/* The call on the communicator, between take() and give(), then settled against the deadline. */
#define NCCL_CALL(op, d, call)                                                                                         \
    do {                                                                                                               \
        take();                                                                                                        \
        ncclResult_t r_ = (call);                                                                                      \
        give();                                                                                                        \
        ZR_CHECK(settle(r_, (op), (d)));                                                                               \
    } while (0)

static zr_status nccl_all_reduce_async(zr_tensor *t, zr_reduce_op op, void **ev) {
    zr_comm_desc d = *zr_watch_last(); /* before ensure() issues its own */
    zr_device dv = zr_tensor_device(t);
    ZR_CHECK(ensure(dv));
    cudaStream_t s = begin(dv);
    void *p = zr_tensor_data(t);
    NCCL_CALL("all_reduce", &d,
              ncclAllReduce(p, p, (size_t)zr_tensor_numel(t), nccl_type(t->dtype), nccl_op(op), comm, s));
    return end_async(s, ev, &d);
}

static zr_status nccl_reduce_scatter_async(zr_tensor *out, zr_tensor *in, zr_reduce_op op, void **ev) {
    zr_comm_desc d = *zr_watch_last();
    zr_device dv = zr_tensor_device(in);
    ZR_CHECK(ensure(dv));
    cudaStream_t s = begin(dv);
    NCCL_CALL("reduce_scatter", &d,
              ncclReduceScatter(zr_tensor_data(in), zr_tensor_data(out), (size_t)zr_tensor_numel(out),
                                nccl_type(in->dtype), nccl_op(op), comm, s));
    return end_async(s, ev, &d);
}

static zr_status nccl_all_gather_async(zr_tensor *out, zr_tensor *in, void **ev) {
    zr_comm_desc d = *zr_watch_last();
    zr_device dv = zr_tensor_device(in);
    ZR_CHECK(ensure(dv));
    cudaStream_t s = begin(dv);
    NCCL_CALL("all_gather", &d,
              ncclAllGather(zr_tensor_data(in), zr_tensor_data(out), (size_t)zr_tensor_numel(in), nccl_type(in->dtype),
                            comm, s));
    return end_async(s, ev, &d);
}

static zr_status nccl_wait(zr_device dev, void *ev) {
    zr_status st = zr_cuda_stream_wait(zr_cuda_stream(dev), (cudaEvent_t)ev);
    zr_cuda_event_free((cudaEvent_t)ev);
    return st;
}

/* The blocking forms: later compute work waits for the collective (still no host sync). */
static zr_status nccl_all_reduce(zr_tensor *t, zr_reduce_op op) {
    void *ev;
    ZR_CHECK(nccl_all_reduce_async(t, op, &ev));
    return nccl_wait(zr_tensor_device(t), ev);
}
static zr_status nccl_reduce_scatter(zr_tensor *out, zr_tensor *in, zr_reduce_op op) {
    void *ev;
    ZR_CHECK(nccl_reduce_scatter_async(out, in, op, &ev));
    return nccl_wait(zr_tensor_device(in), ev);
}
static zr_status nccl_all_gather(zr_tensor *out, zr_tensor *in) {
    void *ev;
    ZR_CHECK(nccl_all_gather_async(out, in, &ev));
    return nccl_wait(zr_tensor_device(in), ev);
}
static zr_status nccl_broadcast(zr_tensor *t, int root) {
    zr_comm_desc d = *zr_watch_last();
    zr_device dv = zr_tensor_device(t);
    ZR_CHECK(ensure(dv));
    cudaStream_t s = begin(dv);
    void *p = zr_tensor_data(t), *ev;
    NCCL_CALL("broadcast", &d, ncclBroadcast(p, p, (size_t)zr_tensor_numel(t), nccl_type(t->dtype), root, comm, s));
    ZR_CHECK(end_async(s, &ev, &d));
    return nccl_wait(dv, ev);
}

const zr_comm_device_backend zr_nccl_backend = {nccl_all_reduce,       nccl_reduce_scatter,       nccl_all_gather,
                                                nccl_broadcast,        nccl_all_reduce_async,     nccl_reduce_scatter_async,
                                                nccl_all_gather_async, nccl_wait};

/* NCCL version as "2.27.3" (buf >= 32 bytes). */
const char *zr_nccl_version(char *buf) {
    int v = 0;
    ncclGetVersion(&v);
    snprintf(buf, 32, "%d.%d.%d", v / 10000, (v / 100) % 100, v % 100);
    return buf;
}
#else
typedef int zr_comm_nccl_unused;
#endif
