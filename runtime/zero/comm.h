/* Collectives over the world of ranks, one interface with four backends: MPI for CPU tensors under
 * mpirun/srun, TCP for CPU tensors of ranks started by torchrun/Accelerate/the deepspeed launcher
 * (comm_tcp.h), NCCL for CUDA tensors (when built with NCCL; the unique id travels over MPI or
 * TCP), and a single-process backend when zrun was started without a launcher.
 *
 *   zr_comm_init();                         // reads OpenMPI/PMIx/SLURM, then torchrun's variables; none = 1 rank
 *   zr_all_reduce(grad, ZR_RED_SUM);        // in place
 *   zr_reduce_scatter(shard, flat, ZR_RED_AVG);  // numel(flat) = world * numel(shard)
 *   zr_all_gather(flat, shard);
 *
 * Tensors must be contiguous. Async variants return a handle to wait on. */
#ifndef ZR_COMM_H
#define ZR_COMM_H

#include "core/tensor.h"

typedef enum { ZR_RED_SUM = 0, ZR_RED_AVG, ZR_RED_MAX, ZR_RED_MIN } zr_reduce_op;

typedef struct {
    int initialized;
    int rank, world_size, local_rank, local_size;
    int mpi; /* 1 when running under an MPI launcher */
    int tcp; /* 1 when joined over TCP (torchrun's RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) */
    const char *launcher; /* "openmpi", "pmix", "slurm", "torchrun", "none" */
} zr_comm_info;

zr_status zr_comm_init(void);
void zr_comm_finalize(void);
const zr_comm_info *zr_comm_get(void);
static inline int zr_comm_rank(void) { return zr_comm_get()->rank; }
static inline int zr_comm_world_size(void) { return zr_comm_get()->world_size; }

zr_status zr_all_reduce(zr_tensor *t, zr_reduce_op op);
zr_status zr_reduce_scatter(zr_tensor *out, zr_tensor *in, zr_reduce_op op);
zr_status zr_all_gather(zr_tensor *out, zr_tensor *in);
zr_status zr_broadcast(zr_tensor *t, int root);
zr_status zr_barrier(void);
/* Gathers a few bytes from every rank (e.g. to check that configs agree); out holds
 * world_size * n bytes. */
zr_status zr_all_gather_bytes(void *out, const void *in, size_t n);

/* Async collectives. CPU tensors (MPI): non-blocking MPI calls, waited for on the host. CUDA
 * tensors (NCCL): enqueued on the comm stream after the compute stream's pending work; the
 * compute stream is NOT held, so kernels launched before zr_comm_wait overlap the collective;
 * zr_comm_wait makes the compute stream wait for it (an event, no host synchronisation). The
 * handle keeps the tensors alive until then. */
typedef struct zr_comm_handle zr_comm_handle;
zr_comm_handle *zr_all_reduce_async(zr_tensor *t, zr_reduce_op op);
zr_comm_handle *zr_reduce_scatter_async(zr_tensor *out, zr_tensor *in, zr_reduce_op op);
zr_comm_handle *zr_all_gather_async(zr_tensor *out, zr_tensor *in);
zr_status zr_comm_wait(zr_comm_handle *h); /* frees h */

/* Deadlines. Every collective (MPI and NCCL) must complete within the timeout; when it does not,
 * the waiting rank prints one line naming the collective, its tensor, the step and the ranks that
 * have not arrived, and stops every rank. Seconds; <= 0: no deadline. From ZRUN_COMM_TIMEOUT
 * (seconds) or DeepSpeed's DEEPSPEED_TIMEOUT (minutes) at zr_comm_init; default 1800. */
void zr_comm_set_timeout(double seconds);
double zr_comm_timeout(void);
/* The training step that messages name (the engine sets it; -1: none). */
void zr_comm_set_step(int64_t step);
/* Names the tensor of the next collective in messages (a parameter or bucket), printf-style. */
void zr_comm_label(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* ZRUN_COMM_DEBUG=1: before each collective every rank's call (collective, shape, dtype) is
 * compared, and the first difference stops every rank with one line naming it. */
int zr_comm_debug(void);

/* Stops every rank: prints "[rank r] msg" and aborts the MPI job (exit when single). */
void zr_comm_abort(const char *msg, int code) __attribute__((noreturn));

/* Hook for the NCCL backend (installed by the CUDA build). The *_async variants leave the
 * compute stream free and return an event (through *ev) that `wait` makes it wait on. */
typedef struct {
    zr_status (*all_reduce)(zr_tensor *t, zr_reduce_op op);
    zr_status (*reduce_scatter)(zr_tensor *out, zr_tensor *in, zr_reduce_op op);
    zr_status (*all_gather)(zr_tensor *out, zr_tensor *in);
    zr_status (*broadcast)(zr_tensor *t, int root);
    zr_status (*all_reduce_async)(zr_tensor *t, zr_reduce_op op, void **ev);
    zr_status (*reduce_scatter_async)(zr_tensor *out, zr_tensor *in, zr_reduce_op op, void **ev);
    zr_status (*all_gather_async)(zr_tensor *out, zr_tensor *in, void **ev);
    zr_status (*wait)(zr_device dev, void *ev); /* compute stream waits; frees ev */
} zr_comm_device_backend;
void zr_comm_set_device_backend(const zr_comm_device_backend *b);

#endif
