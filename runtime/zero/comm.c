/* Collectives: launcher detection, the CPU tensors' collectives over MPI (mpirun, srun) or TCP
 * (torchrun's variables: comm_tcp.c), and the single-process backend (see comm.h). bf16/f16 are
 * reduced through an f32 staging buffer, since MPI has no 16-bit float types (TCP does the same,
 * so both give the same results). */
#include "zero/comm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/elementwise.h"
#include "ops/util.h"
#include "zero/comm_tcp.h"
#include "zero/comm_watch.h"

#ifdef ZR_HAVE_MPI
#include <mpi.h>
#endif

static zr_comm_info info = {0, 0, 1, 0, 1, 0, 0, "none"};
#if defined(ZR_HAVE_CUDA) && defined(ZR_HAVE_NCCL)
extern const zr_comm_device_backend zr_nccl_backend;
static const zr_comm_device_backend *device_backend = &zr_nccl_backend;
#else
static const zr_comm_device_backend *device_backend;
#endif

void zr_comm_set_device_backend(const zr_comm_device_backend *b) { device_backend = b; }
const zr_comm_info *zr_comm_get(void) { return &info; }

static int env_int(const char *name, int def) {
    const char *v = getenv(name);
    return v && *v ? atoi(v) : def;
}

zr_status zr_comm_init(void) {
    if (info.initialized) return ZR_OK;
    info.initialized = 1;
    if (getenv("OMPI_COMM_WORLD_SIZE")) info.launcher = "openmpi";
    else if (getenv("PMIX_RANK") || getenv("PMI_SIZE")) info.launcher = "pmix";
    else if (getenv("SLURM_NTASKS") && getenv("SLURM_PROCID")) info.launcher = "slurm";
    else if (getenv("RANK") && *getenv("RANK") && env_int("WORLD_SIZE", 1) > 1) { /* torchrun, accelerate, deepspeed */
        info.launcher = "torchrun";
        ZR_CHECK(zr_watch_init()); /* the deadline, ZRUN_COMM_DEBUG: the rendezvous uses both */
        ZR_CHECK(zr_tcp_init(&info));
        info.tcp = 1;
        return ZR_OK;
    }
    if (!strcmp(info.launcher, "none")) return zr_watch_init(); /* no launcher: world size 1 */
#ifdef ZR_HAVE_MPI
    int provided, inited = 0;
    MPI_Initialized(&inited);
    if (!inited && MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
        return zr_error("MPI_Init failed under launcher %s", info.launcher);
    MPI_Comm_rank(MPI_COMM_WORLD, &info.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &info.world_size);
    MPI_Comm local;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, info.rank, MPI_INFO_NULL, &local);
    MPI_Comm_rank(local, &info.local_rank);
    MPI_Comm_size(local, &info.local_size);
    MPI_Comm_free(&local);
    /* Errors come back as codes so a failing rank can abort every rank with a message. */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    info.mpi = 1;
    return zr_watch_init();
#else
    info.rank = env_int("OMPI_COMM_WORLD_RANK", env_int("SLURM_PROCID", 0));
    info.world_size = env_int("OMPI_COMM_WORLD_SIZE", env_int("SLURM_NTASKS", 1));
    if (info.world_size > 1)
        return zr_error("started by %s with %d ranks, but this zrun was built without MPI; rebuild "
                        "with libopenmpi-dev installed (see `zrun report`)", info.launcher, info.world_size);
    return zr_watch_init();
#endif
}

void zr_comm_finalize(void) {
    if (info.tcp) zr_tcp_finalize();
#ifdef ZR_HAVE_MPI
    int fin = 0;
    if (info.mpi) {
        MPI_Finalized(&fin);
        if (!fin) zr_watch_finalize();
        if (!fin) MPI_Finalize();
    }
#endif
}

void zr_comm_abort(const char *msg, int code) {
    zr_watch_take_over(); /* a collective failure another thread saw first explains this one: say that */
    fprintf(stderr, "[rank %d] %s\n", info.rank, msg);
    fflush(stderr);
    if (info.tcp) zr_tcp_abort_others(code);
#ifdef ZR_HAVE_MPI
    if (info.mpi && info.world_size > 1) MPI_Abort(MPI_COMM_WORLD, code);
#endif
    exit(code);
}

static zr_status check_tensor(const char *op, zr_tensor *t) {
    if (!zr_tensor_is_contiguous(t))
        return zr_error("%s: the tensor must be contiguous (call :contiguous() first)", op);
    return ZR_OK;
}

#ifdef ZR_HAVE_MPI
static zr_status mpi_check(int rc, const char *op) {
    if (rc == MPI_SUCCESS) return ZR_OK;
    char s[MPI_MAX_ERROR_STRING];
    int n = 0;
    MPI_Error_string(rc, s, &n);
    return zr_error("%s failed on rank %d: %s", op, info.rank, s);
}
static MPI_Datatype mpi_type(zr_dtype t) {
    switch (t) {
    case ZR_F32: return MPI_FLOAT;
    case ZR_F64: return MPI_DOUBLE;
    case ZR_I32: return MPI_INT32_T;
    case ZR_I64: return MPI_INT64_T;
    case ZR_U8: return MPI_UINT8_T;
    default: return MPI_DATATYPE_NULL;
    }
}
static MPI_Op mpi_op(zr_reduce_op op) {
    return op == ZR_RED_MAX ? MPI_MAX : op == ZR_RED_MIN ? MPI_MIN : MPI_SUM;
}
#endif

/* Runs a reduction on an f32 copy when the dtype has no MPI type (bf16/f16). */
static zr_tensor *staged(zr_tensor *t) {
    if (t->dtype != ZR_BF16 && t->dtype != ZR_F16) return zr_tensor_retain(t);
    return zr_tensor_to_raw(t, ZR_F32, zr_cpu());
}
static zr_status unstage(zr_tensor *t, zr_tensor *s) {
    zr_status st = s != t ? zr_tensor_copy_(t, s) : ZR_OK;
    zr_tensor_release(s);
    return st;
}
static zr_status average(zr_tensor *t, zr_reduce_op op) {
    return op == ZR_RED_AVG && info.world_size > 1 ? zr_mul_scalar_(t, 1.0 / info.world_size) : ZR_OK;
}

/* The CPU tensors' transport: TCP when torchrun's variables joined the ranks, else MPI (world_size >
 * 1 implies one of them). Contiguous host buffers; s/out already staged to a reducible dtype. */
static zr_status cpu_all_reduce(zr_tensor *s, zr_reduce_op op, const zr_comm_desc *d) {
    if (info.tcp) return zr_tcp_all_reduce(zr_tensor_data(s), zr_tensor_numel(s), s->dtype, op, d);
#ifdef ZR_HAVE_MPI
    return mpi_check(MPI_Allreduce(MPI_IN_PLACE, zr_tensor_data(s), (int)zr_tensor_numel(s), mpi_type(s->dtype), mpi_op(op),
                                   MPI_COMM_WORLD), "all_reduce");
#else
    return ZR_OK;
#endif
}
static zr_status cpu_reduce_scatter(zr_tensor *so, zr_tensor *si, zr_reduce_op op, const zr_comm_desc *d) {
    if (info.tcp)
        return zr_tcp_reduce_scatter(zr_tensor_data(so), zr_tensor_data(si), zr_tensor_numel(so), so->dtype, op, d);
#ifdef ZR_HAVE_MPI
    return mpi_check(MPI_Reduce_scatter_block(zr_tensor_data(si), zr_tensor_data(so), (int)zr_tensor_numel(so),
                                              mpi_type(so->dtype), mpi_op(op), MPI_COMM_WORLD), "reduce_scatter");
#else
    return ZR_OK;
#endif
}
static zr_status cpu_all_gather(void *out, const void *in, size_t n, const zr_comm_desc *d) {
    if (info.tcp) return zr_tcp_all_gather(out, in, n, d);
#ifdef ZR_HAVE_MPI
    return mpi_check(MPI_Allgather(in, (int)n, MPI_BYTE, out, (int)n, MPI_BYTE, MPI_COMM_WORLD), "all_gather");
#else
    return ZR_OK;
#endif
}
static zr_status cpu_broadcast(void *p, size_t n, int root, const zr_comm_desc *d) {
    if (info.tcp) return zr_tcp_broadcast(p, n, root, d);
#ifdef ZR_HAVE_MPI
    return mpi_check(MPI_Bcast(p, (int)n, MPI_BYTE, root, MPI_COMM_WORLD), "broadcast");
#else
    return ZR_OK;
#endif
}

/* The blocking MPI calls below follow zr_watch_arrive (comm_watch.c): every rank meets the others
 * there, under the deadline, and agrees on what it calls. They are OpenMPI's fastest algorithms
 * (the non-blocking twins take 1.8x as long at 1 MB: tests/bench/bench_comm.lua), and once every
 * rank has arrived they wait for nobody. */

zr_status zr_all_reduce(zr_tensor *t, zr_reduce_op op) {
    zr_comm_desc d;
    zr_watch_desc(&d, ZR_COLL_ALL_REDUCE, t, NULL, op);
    ZR_CHECK(check_tensor("all_reduce", t));
    if (!zr_is_cpu(t)) {
        if (!device_backend) return zr_error("all_reduce: no NCCL backend for %s tensors in this build", "CUDA");
        zr_watch_issue(&d);
        return device_backend->all_reduce(t, op);
    }
    if (info.world_size == 1) return ZR_OK;
    zr_tensor *s = staged(t);
    if (!s) return ZR_ERR;
    zr_watch_issue(&d);
    zr_status st = zr_watch_arrive(&d);
    if (!st) st = cpu_all_reduce(s, op, &d);
    if (!st) st = average(s, op);
    zr_status st2 = unstage(t, s);
    return st ? st : st2;
}

static zr_status check_sizes(const char *op, zr_tensor *small, zr_tensor *big) {
    int64_t a = zr_tensor_numel(small), b = zr_tensor_numel(big);
    if (a * info.world_size != b)
        return zr_error("%s: the full tensor has %lld elements, expected world_size (%d) x %lld", op,
                        (long long)b, info.world_size, (long long)a);
    if (small->dtype != big->dtype)
        return zr_error("%s: dtypes differ (%s and %s)", op, zr_dtype_name(small->dtype), zr_dtype_name(big->dtype));
    return ZR_OK;
}

zr_status zr_reduce_scatter(zr_tensor *out, zr_tensor *in, zr_reduce_op op) {
    zr_comm_desc d;
    zr_watch_desc(&d, ZR_COLL_REDUCE_SCATTER, out, in, op);
    ZR_CHECK(check_tensor("reduce_scatter", out));
    ZR_CHECK(check_tensor("reduce_scatter", in));
    ZR_CHECK(check_sizes("reduce_scatter", out, in));
    if (!zr_is_cpu(in)) {
        if (!device_backend) return zr_error("reduce_scatter: no NCCL backend in this build");
        zr_watch_issue(&d);
        return device_backend->reduce_scatter(out, in, op);
    }
    if (info.world_size == 1) return zr_tensor_copy_(out, in);
    zr_tensor *si = staged(in), *so = si ? staged(out) : NULL;
    zr_status st = ZR_ERR;
    if (so) {
        zr_watch_issue(&d);
        st = zr_watch_arrive(&d);
        if (!st) st = cpu_reduce_scatter(so, si, op, &d);
    }
    if (!st) st = average(so, op);
    zr_tensor_release(si);
    zr_status st2 = so ? unstage(out, so) : ZR_ERR;
    return st ? st : st2;
}

zr_status zr_all_gather(zr_tensor *out, zr_tensor *in) {
    zr_comm_desc d;
    zr_watch_desc(&d, ZR_COLL_ALL_GATHER, in, out, 0);
    ZR_CHECK(check_tensor("all_gather", out));
    ZR_CHECK(check_tensor("all_gather", in));
    ZR_CHECK(check_sizes("all_gather", in, out));
    if (!zr_is_cpu(in)) {
        if (!device_backend) return zr_error("all_gather: no NCCL backend in this build");
        zr_watch_issue(&d);
        return device_backend->all_gather(out, in);
    }
    if (info.world_size == 1) return zr_tensor_copy_(out, in);
    zr_watch_issue(&d);
    ZR_CHECK(zr_watch_arrive(&d));
    return cpu_all_gather(zr_tensor_data(out), zr_tensor_data(in), (size_t)zr_tensor_numel(in) * zr_dtype_size(in->dtype), &d);
}

zr_status zr_broadcast(zr_tensor *t, int root) {
    zr_comm_desc d;
    zr_watch_desc(&d, ZR_COLL_BROADCAST, t, NULL, root);
    ZR_CHECK(check_tensor("broadcast", t));
    if (root < 0 || root >= info.world_size)
        return zr_error("broadcast: root %d is outside world size %d", root, info.world_size);
    if (!zr_is_cpu(t)) {
        if (!device_backend) return zr_error("broadcast: no NCCL backend in this build");
        zr_watch_issue(&d);
        return device_backend->broadcast(t, root);
    }
    if (info.world_size == 1) return ZR_OK;
    zr_watch_issue(&d);
    ZR_CHECK(zr_watch_arrive(&d));
    return cpu_broadcast(zr_tensor_data(t), (size_t)zr_tensor_numel(t) * zr_dtype_size(t->dtype), root, &d);
}

zr_status zr_barrier(void) {
    zr_comm_desc d;
    zr_watch_desc(&d, ZR_COLL_BARRIER, NULL, NULL, 0);
    if (info.world_size > 1) {
        zr_watch_issue(&d);
        return zr_watch_arrive(&d); /* meeting every rank is all a barrier does */
    }
    return ZR_OK;
}

zr_status zr_all_gather_bytes(void *out, const void *in, size_t n) {
    zr_comm_desc d;
    zr_watch_desc(&d, ZR_COLL_ALL_GATHER_BYTES, NULL, NULL, 0);
    d.ndim = 1;
    d.shape[0] = (int64_t)n;
    if (info.world_size > 1) {
        zr_watch_issue(&d);
        ZR_CHECK(zr_watch_arrive(&d));
        return cpu_all_gather(out, in, n, &d);
    }
    memcpy(out, in, n);
    return ZR_OK;
}

/* --- async: MPI non-blocking collectives; TCP and the single backend complete them at once --- */

struct zr_comm_handle {
#ifdef ZR_HAVE_MPI
    MPI_Request req;
#endif
    int active;
    zr_tensor *avg_target; /* scaled by 1/world after completion for AVG */
    zr_comm_desc desc;     /* what it is, for the deadline's message */
    void *dev_event;       /* device backend: the collective's event on the comm stream */
    zr_device dev;
    zr_tensor *keep[2];    /* device backend: tensors the comm stream still uses */
};

static zr_comm_handle *handle_new(const zr_comm_desc *d) {
    zr_comm_handle *h = calloc(1, sizeof *h);
    if (!h) zr_error("out of host memory");
    else h->desc = *d;
    return h;
}

/* Falls back to the blocking call for cases the non-blocking path does not cover. */
static zr_comm_handle *sync_fallback(zr_status st, const zr_comm_desc *d) {
    if (st) return NULL;
    return handle_new(d);
}

/* A device handle: the backend enqueued the collective and gave its event. */
static zr_comm_handle *device_handle(zr_status st, const zr_comm_desc *d, void *ev, zr_tensor *a, zr_tensor *b) {
    if (st) return NULL;
    zr_comm_handle *h = handle_new(d);
    if (!h) {
        device_backend->wait(zr_tensor_device(a), ev);
        return NULL;
    }
    h->dev_event = ev;
    h->dev = zr_tensor_device(a);
    h->keep[0] = zr_tensor_retain(a);
    h->keep[1] = b ? zr_tensor_retain(b) : NULL;
    return h;
}
static int device_async(const zr_tensor *t) {
    return !zr_is_cpu(t) && device_backend && device_backend->wait;
}

zr_comm_handle *zr_all_reduce_async(zr_tensor *t, zr_reduce_op op) {
    zr_comm_desc d;
    zr_watch_desc(&d, ZR_COLL_ALL_REDUCE, t, NULL, op);
    if (device_async(t)) {
        void *ev = NULL;
        zr_status st = check_tensor("all_reduce", t);
        if (!st) zr_watch_issue(&d);
        if (!st) st = device_backend->all_reduce_async(t, op, &ev);
        return device_handle(st, &d, ev, t, NULL);
    }
#ifdef ZR_HAVE_MPI
    if (info.mpi && info.world_size > 1 && zr_is_cpu(t) && mpi_type(t->dtype) != MPI_DATATYPE_NULL && zr_tensor_is_contiguous(t)) {
        zr_watch_issue(&d);
        zr_comm_handle *h = handle_new(&d);
        if (!h) return NULL;
        if (mpi_check(MPI_Iallreduce(MPI_IN_PLACE, zr_tensor_data(t), (int)zr_tensor_numel(t), mpi_type(t->dtype),
                                     mpi_op(op), MPI_COMM_WORLD, &h->req), "all_reduce")) {
            free(h);
            return NULL;
        }
        h->active = 1;
        if (op == ZR_RED_AVG) h->avg_target = zr_tensor_retain(t);
        return h;
    }
#endif
    zr_comm_label("%s", d.label); /* the blocking call names it too */
    return sync_fallback(zr_all_reduce(t, op), &d);
}

zr_comm_handle *zr_reduce_scatter_async(zr_tensor *out, zr_tensor *in, zr_reduce_op op) {
    zr_comm_desc d;
    zr_watch_desc(&d, ZR_COLL_REDUCE_SCATTER, out, in, op);
    if (device_async(in)) {
        void *ev = NULL;
        zr_status st = check_tensor("reduce_scatter", out);
        if (!st) st = check_tensor("reduce_scatter", in);
        if (!st) st = check_sizes("reduce_scatter", out, in);
        if (!st) zr_watch_issue(&d);
        if (!st) st = device_backend->reduce_scatter_async(out, in, op, &ev);
        return device_handle(st, &d, ev, out, in);
    }
#ifdef ZR_HAVE_MPI
    if (info.mpi && info.world_size > 1 && zr_is_cpu(in) && mpi_type(in->dtype) != MPI_DATATYPE_NULL &&
        zr_tensor_is_contiguous(in) && zr_tensor_is_contiguous(out) && !check_sizes("reduce_scatter", out, in)) {
        zr_watch_issue(&d);
        zr_comm_handle *h = handle_new(&d);
        if (!h) return NULL;
        if (mpi_check(MPI_Ireduce_scatter_block(zr_tensor_data(in), zr_tensor_data(out), (int)zr_tensor_numel(out),
                                                mpi_type(out->dtype), mpi_op(op), MPI_COMM_WORLD, &h->req),
                      "reduce_scatter")) {
            free(h);
            return NULL;
        }
        h->active = 1;
        if (op == ZR_RED_AVG) h->avg_target = zr_tensor_retain(out);
        return h;
    }
#endif
    zr_comm_label("%s", d.label);
    return sync_fallback(zr_reduce_scatter(out, in, op), &d);
}

zr_comm_handle *zr_all_gather_async(zr_tensor *out, zr_tensor *in) {
    zr_comm_desc d;
    zr_watch_desc(&d, ZR_COLL_ALL_GATHER, in, out, 0);
    if (device_async(in)) {
        void *ev = NULL;
        zr_status st = check_tensor("all_gather", out);
        if (!st) st = check_tensor("all_gather", in);
        if (!st) st = check_sizes("all_gather", in, out);
        if (!st) zr_watch_issue(&d);
        if (!st) st = device_backend->all_gather_async(out, in, &ev);
        return device_handle(st, &d, ev, out, in);
    }
#ifdef ZR_HAVE_MPI
    if (info.mpi && info.world_size > 1 && zr_is_cpu(in) && zr_tensor_is_contiguous(in) && zr_tensor_is_contiguous(out) &&
        !check_sizes("all_gather", in, out)) {
        zr_watch_issue(&d);
        zr_comm_handle *h = handle_new(&d);
        if (!h) return NULL;
        int n = (int)(zr_tensor_numel(in) * (int64_t)zr_dtype_size(in->dtype));
        if (mpi_check(MPI_Iallgather(zr_tensor_data(in), n, MPI_BYTE, zr_tensor_data(out), n, MPI_BYTE,
                                     MPI_COMM_WORLD, &h->req), "all_gather")) {
            free(h);
            return NULL;
        }
        h->active = 1;
        return h;
    }
#endif
    zr_comm_label("%s", d.label);
    return sync_fallback(zr_all_gather(out, in), &d);
}

zr_status zr_comm_wait(zr_comm_handle *h) {
    if (!h) return zr_error("comm wait: invalid handle");
    zr_status st = ZR_OK;
#ifdef ZR_HAVE_MPI
    if (h->active) st = zr_watch_mpi(&h->req, &h->desc);
#endif
    if (h->dev_event) st = device_backend->wait(h->dev, h->dev_event);
    zr_tensor_release(h->keep[0]);
    zr_tensor_release(h->keep[1]);
    if (!st && h->avg_target) st = zr_mul_scalar_(h->avg_target, 1.0 / info.world_size);
    zr_tensor_release(h->avg_target);
    free(h);
    return st;
}
