/* NCCL backend of the collectives (comm.h) for CUDA tensors. One communicator per process,
 * created on first use on the tensor's device; the unique id travels over MPI (rank 0 makes it),
 * so a single process without a launcher gets a world of one and still runs through NCCL.
 * Collectives run on the device's comm stream, ordered after the compute stream's pending work by
 * an event and before its later work by another: no host synchronisation. */
#if defined(ZR_HAVE_CUDA) && defined(ZR_HAVE_NCCL)
#include <nccl.h>
#include <stdio.h>
#include <string.h>

#include "cuda/device.h"
#include "ops/util.h"
#include "zero/comm.h"

#ifdef ZR_HAVE_MPI
#include <mpi.h>
#endif

static ncclComm_t comm;
static int comm_device = -1;
static cudaEvent_t ev_before;

static zr_status nccl_check(ncclResult_t r, const char *op) {
    if (r == ncclSuccess) return ZR_OK;
    return zr_error("%s failed on rank %d (cuda:%d): %s", op, zr_comm_rank(), comm_device, ncclGetErrorString(r));
}

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
#ifdef ZR_HAVE_MPI
    if (info->mpi && info->world_size > 1 && MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD) != MPI_SUCCESS)
        return zr_error("broadcasting the NCCL unique id over MPI failed");
#endif
    ZR_CHECK(zr_cuda_use(dev.index));
    ZR_CHECK(nccl_check(ncclCommInitRank(&comm, info->world_size, id, info->rank), "ncclCommInitRank"));
    comm_device = dev.index;
    ev_before = zr_cuda_event_new(0);
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

static zr_status end_async(cudaStream_t ms, void **ev) {
    cudaEvent_t e = zr_cuda_event_new(0);
    if (!e) return ZR_ERR;
    if (zr_cuda_event_record(e, ms)) {
        zr_cuda_event_free(e);
        return ZR_ERR;
    }
    *ev = e;
    return ZR_OK;
}

static zr_status nccl_all_reduce_async(zr_tensor *t, zr_reduce_op op, void **ev) {
    zr_device d = zr_tensor_device(t);
    ZR_CHECK(ensure(d));
    cudaStream_t s = begin(d);
    void *p = zr_tensor_data(t);
    ZR_CHECK(nccl_check(ncclAllReduce(p, p, (size_t)zr_tensor_numel(t), nccl_type(t->dtype), nccl_op(op), comm, s),
                        "all_reduce"));
    return end_async(s, ev);
}

static zr_status nccl_reduce_scatter_async(zr_tensor *out, zr_tensor *in, zr_reduce_op op, void **ev) {
    zr_device d = zr_tensor_device(in);
    ZR_CHECK(ensure(d));
    cudaStream_t s = begin(d);
    ZR_CHECK(nccl_check(ncclReduceScatter(zr_tensor_data(in), zr_tensor_data(out), (size_t)zr_tensor_numel(out),
                                          nccl_type(in->dtype), nccl_op(op), comm, s), "reduce_scatter"));
    return end_async(s, ev);
}

static zr_status nccl_all_gather_async(zr_tensor *out, zr_tensor *in, void **ev) {
    zr_device d = zr_tensor_device(in);
    ZR_CHECK(ensure(d));
    cudaStream_t s = begin(d);
    ZR_CHECK(nccl_check(ncclAllGather(zr_tensor_data(in), zr_tensor_data(out), (size_t)zr_tensor_numel(in),
                                      nccl_type(in->dtype), comm, s), "all_gather"));
    return end_async(s, ev);
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
    zr_device d = zr_tensor_device(t);
    ZR_CHECK(ensure(d));
    cudaStream_t s = begin(d);
    void *p = zr_tensor_data(t), *ev;
    ZR_CHECK(nccl_check(ncclBroadcast(p, p, (size_t)zr_tensor_numel(t), nccl_type(t->dtype), root, comm, s),
                        "broadcast"));
    ZR_CHECK(end_async(s, &ev));
    return nccl_wait(d, ev);
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
