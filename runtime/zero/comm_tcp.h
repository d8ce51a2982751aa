/* The TCP backend of the CPU collectives, for ranks started by torchrun, `accelerate launch` or the
 * deepspeed launcher (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT): a rendezvous at rank 0, a ring
 * of connections for the data, and rank 0 as the coordinator that checks every rank's call and
 * names the ranks a collective waits for. Only comm.c, comm_watch.c and comm_nccl.c include it. */
#ifndef ZR_COMM_TCP_H
#define ZR_COMM_TCP_H

#include "zero/comm_watch.h"

/* Joins the world torchrun's variables describe, under the deadline (zr_watch_timeout); fills
 * rank, world_size, local_rank, local_size. A rank that does not show up, a port in use or a
 * MASTER_ADDR nobody answers on is one error line. */
zr_status zr_tcp_init(zr_comm_info *info);
/* Says goodbye to the others (so that a rank waiting for this one learns it ended) and closes. */
void zr_tcp_finalize(void);

/* Meets every rank at rank 0 under the deadline and compares their calls (a difference, a rank
 * that does not arrive or has gone stops every rank with one line). */
zr_status zr_tcp_arrive(const zr_comm_desc *d);
/* The data collectives, after zr_tcp_arrive, on contiguous host buffers. Reductions take f32,
 * f64, i32, i64, u8 (AVG is a SUM here: the caller scales); all_gather and broadcast move bytes. */
zr_status zr_tcp_all_reduce(void *buf, int64_t n, zr_dtype dt, zr_reduce_op op, const zr_comm_desc *d);
zr_status zr_tcp_reduce_scatter(void *out, const void *in, int64_t n_out, zr_dtype dt, zr_reduce_op op,
                                const zr_comm_desc *d);
zr_status zr_tcp_all_gather(void *out, const void *in, size_t bytes, const zr_comm_desc *d);
zr_status zr_tcp_broadcast(void *buf, size_t bytes, int root, const zr_comm_desc *d);

/* Reads the other ranks' reports while this rank waits elsewhere (the NCCL backend's loops). */
void zr_tcp_poll(void);
/* A failure seen by this rank (why NULL: the deadline passed; waits_for: the rank it waited for,
 * or -1): rank 0 names what it knows of every rank in one line and stops the job; another rank
 * hands it to rank 0 and reports alone only when rank 0 does not answer. */
_Noreturn void zr_tcp_fail(const zr_comm_desc *d, double waited, const char *why, int waits_for);
/* After this rank printed why it stops: tells the others to stop (exit code `code`). */
void zr_tcp_abort_others(int code);

#endif
