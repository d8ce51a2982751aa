/* Deadlines and consistency checks of the collectives, shared by comm.c (MPI), comm_tcp.c (ranks
 * joined by torchrun's variables) and comm_nccl.c; nothing else includes this. Every collective gets a descriptor (what, which tensor, its number
 * on this rank, the training step). Waits poll against the deadline (ZRUN_COMM_TIMEOUT); when it
 * passes, the waiting rank asks the others over a side channel where they are, names in one line
 * those that have not arrived, and stops the job. With ZRUN_COMM_DEBUG=1 every collective is
 * preceded by an all-gather of the descriptors, and the first difference stops the job. */
#ifndef ZR_COMM_WATCH_H
#define ZR_COMM_WATCH_H

#include <stdint.h>

#include "zero/comm.h"

#ifdef ZR_HAVE_MPI
#include <mpi.h>
#endif

typedef enum {
    ZR_COLL_ALL_REDUCE = 1,
    ZR_COLL_REDUCE_SCATTER,
    ZR_COLL_ALL_GATHER,
    ZR_COLL_BROADCAST,
    ZR_COLL_BARRIER,
    ZR_COLL_ALL_GATHER_BYTES,
    ZR_COLL_NCCL_INIT,
} zr_coll;

/* Plain bytes: it travels between ranks (side channel replies, the debug all-gather). */
typedef struct {
    int64_t seq;       /* collectives this rank has issued, this one included (0: not issued) */
    int64_t step;      /* training step (zr_comm_set_step), -1 when unknown */
    int64_t shape[ZR_MAX_DIMS]; /* the tensor argument ((bytes) for all_gather_bytes) */
    int64_t other;     /* reduce_scatter / all_gather: elements of the full tensor; else -1 */
    int32_t coll, dtype, ndim, arg; /* arg: the reduce op, or broadcast's root */
    int32_t device;    /* -1: CPU (MPI), else the CUDA device (NCCL) */
    char label[116];   /* parameter or bucket (zr_comm_label), "" when unnamed */
} zr_comm_desc;

/* Fills d for a collective about to be called (consumes the pending label; seq stays 0). */
void zr_watch_desc(zr_comm_desc *d, zr_coll c, const zr_tensor *t, const zr_tensor *other, int arg);
/* The collective is issued now: numbers it and, in debug mode, compares it with every rank's. */
void zr_watch_issue(zr_comm_desc *d);
/* The collective issued last (main thread), for the device backend. */
const zr_comm_desc *zr_watch_last(void);
/* The deadline in seconds (<= 0: none); time now (monotonic seconds). */
double zr_watch_timeout(void);
double zr_watch_now(void);
/* Answers the other ranks' questions and takes over a failure posted by another thread; cheap,
 * call it about every millisecond while waiting. */
void zr_watch_poll(void);
/* The wait is over its deadline (why NULL), or failed (why: the error): asks the other ranks
 * where they are, prints one line naming the collective and those that have not arrived, and
 * stops every rank. Main thread only. */
_Noreturn void zr_watch_fail(const zr_comm_desc *d, double waited, const char *why);
/* From another thread (the NCCL watchdog): records the failure for the main thread, which takes
 * it over at its next collective or wait. Returns 1 when the main thread took it over within
 * `patience` seconds (it then stops the job), 0 when it did not (the caller stops it alone). */
int zr_watch_post(const zr_comm_desc *d, double waited, const char *why, double patience);
/* Main thread: when another thread posted a failure, takes it over (does not return then). */
void zr_watch_take_over(void);
/* The line for a failure nobody could ask the other ranks about, then stop (any thread). */
_Noreturn void zr_watch_fail_alone(const zr_comm_desc *d, double waited, const char *why);
/* Side channel set-up and tear-down (zr_comm_init / zr_comm_finalize). */
zr_status zr_watch_init(void);
void zr_watch_finalize(void);

/* Before a blocking CPU collective (MPI or TCP): meets every rank under the deadline and checks
 * that they all call the same one (collective, dtype, shape, sequence number); a difference stops
 * every rank. */
zr_status zr_watch_arrive(const zr_comm_desc *d);
#ifdef ZR_HAVE_MPI
/* Waits for a non-blocking MPI collective under the deadline; an MPI error comes back as a status. */
zr_status zr_watch_mpi(MPI_Request *req, const zr_comm_desc *d);
#endif

/* The wording every backend's messages share. "all_reduce #2 (f32 (4,5), sum, grad bucket
 * lm_head.weight, step 3)"; whether two ranks' calls match; "rank 1" / "ranks 1,3-5"; the one
 * line of a failure ("comm timeout: ... ; stopping all ranks", tail: what is known of the others);
 * the line naming the ranks whose call differs (returns 0, leaving line alone, when all match). */
void zr_watch_describe(char *buf, size_t n, const zr_comm_desc *d);
int zr_watch_same(const zr_comm_desc *a, const zr_comm_desc *b);
void zr_watch_ranks_str(char *buf, size_t n, const int *r, int k);
void zr_watch_line(char *line, size_t n, const zr_comm_desc *d, double waited, const char *why, const char *tail);
int zr_watch_mismatch(char *line, size_t n, const zr_comm_desc *all, int world);
/* How long a rank that asks the others waits for their answers (seconds). */
double zr_watch_grace(void);

#endif
