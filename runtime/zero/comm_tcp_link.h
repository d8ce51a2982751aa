/* What comm_tcp.c (rendezvous, control) and comm_tcp_ring.c (the data collectives) share: the
 * world's sockets and the control messages. Nothing else includes it. */
#ifndef ZR_COMM_TCP_LINK_H
#define ZR_COMM_TCP_LINK_H

#include <sys/socket.h>

#include "zero/comm_tcp.h"

#define TCP_MAGIC 0x317063746e75727aull /* "zruntcp1" */
enum { HELLO = 1, TABLE, ARRIVE, GO, FAIL, BYE, STOP, QUERY, REPLY };
enum { KIND_STAR = 1, KIND_STOP, KIND_RING }; /* which link a hello opens */

/* One control message; fixed size, so a link carries nothing else. */
typedef struct {
    uint64_t magic;
    int32_t type, rank, world, kind, port, debug, code, waits_for;
    double waited;
    zr_comm_desc desc;
    char host[64];
    char text[768];
} msg_t;

/* A control link and the part of a message read so far. */
typedef struct {
    int fd;
    size_t got;
    msg_t m;
} conn_t;

typedef struct {
    int W, me;
    int next, prev; /* the ring: this rank sends to rank me+1 and receives from rank me-1 */
} zr_tcp_world;
extern zr_tcp_world zr_tcp;

double zr_tcp_now(void);
/* A poll() timeout in ms for `s` seconds left, at most 100 ms (the loops look around that often). */
int zr_tcp_ms(double s);

#endif
