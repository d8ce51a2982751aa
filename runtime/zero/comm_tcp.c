/* The TCP backend (comm_tcp.h): rendezvous, the control links to rank 0 and the stop thread. The
 * ring collectives are in comm_tcp_ring.c.
 *
 * Rendezvous, as torch's TCPStore: rank 0 listens on MASTER_PORT; every other rank opens its own
 * listening socket, then connects to MASTER_ADDR:MASTER_PORT (retrying until the deadline) and says
 * hello (rank, world size, its socket's port, host name, ZRUN_COMM_DEBUG). Rank 0 checks them and
 * sends everyone the table of addresses; each rank connects to the next one's socket: the ring.
 *
 * Control: every rank keeps two links to rank 0. On the first ("star"), each blocking collective
 * sends its descriptor and waits for rank 0's go; rank 0 compares them all (a difference stops the
 * job, named) and knows who has not arrived, who ended (said goodbye) and who vanished (closed
 * without a goodbye). A rank that sees a failure hands it to rank 0, which writes the one line;
 * only when rank 0 does not answer does the rank write it. The second link carries only "stop": a
 * thread blocked on it ends the process when another rank stops the job, as MPI_Abort does, even
 * while this rank computes or is stuck. IPv4 only. */
#include "zero/comm_tcp_link.h"

#include <netinet/in.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ops/util.h"

zr_tcp_world zr_tcp = {.W = 1, .next = -1, .prev = -1};
#define T zr_tcp

static struct sockaddr_in master;
static char master_str[320];  /* "MASTER_ADDR:MASTER_PORT (ip:port)" */
static conn_t *star;          /* rank 0: star[r], r = 1..W-1; others: star[0], the link to rank 0 */
static int *stop_fd;          /* the same, for the stop links */
/* rank 0: what the others said; the collective it gathers them into now */
static zr_comm_desc *arrived;
static char *has_arrived, *ended, *gone;
static const zr_comm_desc *arriving;
static int ended0;             /* others: rank 0 said goodbye */
static int stopping, said_bye; /* stopping: __atomic */

double zr_tcp_now(void) { return zr_watch_now(); }
static void nap(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}
int zr_tcp_ms(double s) { return s <= 0 ? 0 : s > 0.1 ? 100 : (int)(s * 1000) + 1; }

/* --- messages --- */

/* Moves n bytes (out: sends buf, else fills it) before the deadline, waiting in poll, never
 * spinning: 0, or -1 on an error, the deadline (errno ETIMEDOUT) or a close (errno 0). */
static int move_all(int fd, char *p, size_t n, double deadline, int out) {
    while (n) {
        ssize_t k = out ? send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT) : recv(fd, p, n, MSG_DONTWAIT);
        if (k > 0) {
            p += k;
            n -= (size_t)k;
            continue;
        }
        if (k == 0) {
            errno = 0;
            return -1;
        }
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) return -1;
        double left = deadline - zr_tcp_now();
        if (left <= 0) {
            errno = ETIMEDOUT;
            return -1;
        }
        struct pollfd pf = {fd, out ? POLLOUT : POLLIN, 0};
        poll(&pf, 1, zr_tcp_ms(left));
    }
    return 0;
}
static int send_all(int fd, const void *buf, size_t n, double deadline) { return move_all(fd, (char *)buf, n, deadline, 1); }
static int recv_all(int fd, void *buf, size_t n, double deadline) { return move_all(fd, buf, n, deadline, 0); }

/* 1: a whole message is in c->m (read it before the next call); 0: not yet; -1: closed. */
static int conn_read(conn_t *c) {
    for (;;) {
        ssize_t k = recv(c->fd, (char *)&c->m + c->got, sizeof c->m - c->got, MSG_DONTWAIT);
        if (k > 0) {
            c->got += (size_t)k;
            if (c->got < sizeof c->m) continue;
            c->got = 0;
            return c->m.magic == TCP_MAGIC ? 1 : -1;
        }
        if (k < 0 && errno == EINTR) continue;
        return k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) ? 0 : -1;
    }
}

static int send_msg(int fd, msg_t *m, int type) {
    m->magic = TCP_MAGIC;
    m->type = type;
    m->rank = T.me;
    m->world = T.W;
    return send_all(fd, m, sizeof *m, zr_tcp_now() + 10);
}

/* Another rank: reads its link to rank 0, answering rank 0's questions (where is this rank: in
 * `waiting`, else the collective issued last). 1: rank 0's go came; -1: the link closed; else 0. */
static int other_read(const zr_comm_desc *waiting) {
    int st;
    while ((st = conn_read(&star[0])) == 1) {
        msg_t *m = &star[0].m;
        if (m->type == GO) return 1;
        if (m->type == BYE) ended0 = 1;
        if (m->type == QUERY) {
            msg_t a = {0};
            a.desc = waiting ? *waiting : *zr_watch_last();
            send_msg(star[0].fd, &a, REPLY);
        }
    }
    return st;
}

/* --- failures --- */

/* Rank 0: "; not arrived: ranks 1,3 (no answer: ...), rank 2 (ended its program ...)". */
static int not_arrived(char *out, size_t n) {
    static const char *why[3] = {"no answer: busy outside any collective, or stuck",
                                 "it ended its program without calling it",
                                 "closed its connections without a goodbye: crashed or killed"};
    int *rs = malloc(sizeof *rs * (size_t)T.W), p = 0, any = 0;
    char list[160];
    if (!rs) return 0;
    for (int kind = 0; kind < 3; kind++) {
        int k = 0;
        for (int r = 1; r < T.W; r++)
            if (!has_arrived[r] && (kind == 0 ? !ended[r] && !gone[r] : kind == 1 ? ended[r] : gone[r] && !ended[r]))
                rs[k++] = r;
        if (!k || (size_t)p >= n) continue;
        zr_watch_ranks_str(list, sizeof list, rs, k);
        p += snprintf(out + p, n - (size_t)p, "%s%s (%s)", any++ ? ", " : "; not arrived: ", list, why[kind]);
    }
    free(rs);
    return any;
}

/* Rank 0, outside a gathering (an NCCL collective, a stalled ring): asks every rank where it is, as
 * comm_watch.c does over MPI, and names those behind collective d ("" when all have reached it). */
static void ask(const zr_comm_desc *d, char *out, size_t n) {
    zr_comm_desc *at = calloc((size_t)T.W, sizeof *at);
    char *got = calloc((size_t)T.W, 1);
    int *silent = malloc(sizeof *silent * (size_t)T.W), ns = 0, left = 0, p = 0, nb = 0;
    if (!at || !got || !silent) return;
    msg_t q = {0};
    for (int r = 1; r < T.W; r++)
        if (star[r].fd >= 0 && send_msg(star[r].fd, &q, QUERY) == 0) left++;
    /* GPU ranks answer once their own watchdog has freed their main thread: give them longer */
    double grace = zr_watch_grace() + (d->device >= 0 ? 5 : 0), end = zr_tcp_now() + grace;
    while (left > 0 && zr_tcp_now() < end)
        for (int r = 1; r < T.W; r++) {
            struct pollfd pf = {star[r].fd, POLLIN, 0};
            if (star[r].fd < 0 || got[r] || poll(&pf, 1, r == 1 ? 20 : 0) <= 0) continue;
            int st;
            while (!got[r] && (st = conn_read(&star[r])) == 1)
                if (star[r].m.type == REPLY || star[r].m.type == FAIL) { /* (a failing rank waits in its desc) */
                    at[r] = star[r].m.desc;
                    got[r] = 1;
                    left--;
                }
            if (!got[r] && st < 0) {
                close(star[r].fd);
                star[r].fd = -1;
                left--;
            }
        }
    char what[320], rs[160];
    for (int r = 1; r < T.W; r++) {
        if (!got[r]) silent[ns++] = r;
        else if (at[r].seq < d->seq && (size_t)p < n && nb++ < 4) {
            zr_watch_describe(what, sizeof what, &at[r]);
            p += snprintf(out + p, n - (size_t)p, "%srank %d (its last: %s)", p ? ", " : "; not arrived: ",
                          r, at[r].seq ? what : "no collective");
        }
    }
    if (ns && (size_t)p < n) {
        zr_watch_ranks_str(rs, sizeof rs, silent, ns);
        snprintf(out + p, n - (size_t)p, "%s%s (no answer within %.1f s: busy outside any collective, stuck, or exited)",
                 p ? ", " : "; not arrived: ", rs, grace);
    }
    free(at);
    free(got);
    free(silent);
}

/* Rank 0: the one line, then every rank stops. from: the rank that saw it; waits_for: its peer. */
static _Noreturn void report(const zr_comm_desc *d, double waited, const char *why, int from, int waits_for) {
    char tail[2048] = "", line[4096];
    int p = 0, gathering = arriving && arriving->seq == d->seq; /* then rank 0 knows where everyone is */
    if (waits_for >= 0 && !gathering) p = snprintf(tail, sizeof tail, "; rank %d waits for rank %d", from, waits_for);
    else if (from > 0 && why) p = snprintf(tail, sizeof tail, "; seen by rank %d", from);
    if (arriving && (size_t)p < sizeof tail) not_arrived(tail + p, sizeof tail - (size_t)p);
    else if ((size_t)p < sizeof tail) ask(d, tail + p, sizeof tail - (size_t)p);
    zr_watch_line(line, sizeof line, gathering ? arriving : d, waited, why, tail);
    zr_comm_abort(line, 1);
}

void zr_tcp_abort_others(int code) {
    if (__atomic_exchange_n(&stopping, 1, __ATOMIC_ACQ_REL) || T.W < 2) return;
    msg_t m = {0};
    m.code = code;
    for (int r = T.me == 0 ? 1 : 0; r < (T.me == 0 ? T.W : 1); r++)
        if (stop_fd[r] >= 0) send_msg(stop_fd[r], &m, STOP);
}

_Noreturn void zr_tcp_fail(const zr_comm_desc *d, double waited, const char *why, int waits_for) {
    static int failing;
    if (T.me == 0) report(d, waited, why, 0, waits_for);
    char tail[512] = "", line[4096];
    /* Rank 0 takes it and its stop ends this process. When rank 0 does not answer, rank 1 reports and
     * the others wait longer: rank 1's stop reaches them through rank 0's stop thread first. */
    double grace = zr_watch_grace() * (T.me == 1 ? 1 : 2);
    int closed = star[0].fd < 0;
    if (!failing++ && !closed) {
        msg_t m = {0};
        m.desc = *d;
        m.waited = waited;
        m.waits_for = waits_for;
        snprintf(m.text, sizeof m.text, "%s", why ? why : "");
        closed = send_msg(star[0].fd, &m, FAIL) != 0;
        for (double end = zr_tcp_now() + grace; !closed && zr_tcp_now() < end;) {
            struct pollfd pf = {star[0].fd, POLLIN, 0};
            poll(&pf, 1, 100);
            closed = other_read(d) < 0;
        }
    }
    if (closed) nap(1); /* rank 0 has gone: a stop it sent first ends this process meanwhile */
    if (waits_for == 0 && !why)
        snprintf(tail, sizeof tail, "; not arrived: rank 0 (no answer within %.1f s: busy outside any collective, stuck, "
                 "or exited)", grace);
    else if (waits_for >= 0)
        snprintf(tail, sizeof tail, "; waits for rank %d (rank 0 did not answer within %.1f s)", waits_for, grace);
    zr_watch_line(line, sizeof line, d, waited, why, tail);
    zr_comm_abort(line, 1);
}

/* --- control: arrival at rank 0 --- */


/* Rank 0: takes in what rank r said. */
static void take(int r, const msg_t *m) {
    if (m->type == ARRIVE) {
        arrived[r] = m->desc;
        has_arrived[r] = 1;
    } else if (m->type == BYE) ended[r] = 1;
    else if (m->type == FAIL) report(&m->desc, m->waited, m->text[0] ? m->text : NULL, r, m->waits_for);
}

/* Rank 0: reads the links from the others, waiting up to `wait` s for something to come. */
static void ctl_poll(double wait) {
    static struct pollfd *pf;
    static int *who;
    if (!pf && (!(pf = malloc(sizeof *pf * (size_t)T.W)) || !(who = malloc(sizeof *who * (size_t)T.W))))
        zr_comm_abort("comm (TCP): out of host memory", 1);
    int k = 0;
    for (int r = 1; r < T.W; r++)
        if (star[r].fd >= 0) {
            pf[k] = (struct pollfd){star[r].fd, POLLIN, 0};
            who[k++] = r;
        }
    if (!k) {
        if (wait > 0) nap(wait);
        return;
    }
    if (poll(pf, (nfds_t)k, zr_tcp_ms(wait)) <= 0) return;
    for (int i = 0; i < k; i++) {
        if (!pf[i].revents) continue;
        int r = who[i], st;
        while ((st = conn_read(&star[r])) == 1) take(r, &star[r].m);
        if (st < 0) {
            close(star[r].fd);
            star[r].fd = -1;
            gone[r] = 1;
        }
    }
}

void zr_tcp_poll(void) {
    if (T.W < 2 || __atomic_load_n(&stopping, __ATOMIC_ACQUIRE)) return;
    if (T.me == 0) ctl_poll(0);
    else if (star[0].fd >= 0) other_read(NULL); /* (no go is due outside an arrival) */
}

static zr_status arrive0(const zr_comm_desc *d) {
    double t0 = zr_tcp_now(), tmo = zr_watch_timeout(), limit = tmo > 0 ? t0 + tmo : 1e300;
    arriving = d;
    for (;;) {
        int missing = 0, lost = 0;
        for (int r = 1; r < T.W; r++)
            if (!has_arrived[r]) {
                missing++;
                lost += ended[r] || gone[r];
            }
        if (!missing) break;
        double t = zr_tcp_now();
        if (lost) report(d, t - t0, "a rank has left the job", 0, -1);
        if (t >= limit) report(d, t - t0, NULL, 0, -1);
        zr_watch_take_over();
        ctl_poll(limit - t < 0.1 ? limit - t : 0.1);
    }
    zr_comm_desc *all = malloc(sizeof *all * (size_t)T.W);
    if (!all) return zr_error("comm (TCP): out of host memory");
    all[0] = *d;
    for (int r = 1; r < T.W; r++) {
        all[r] = arrived[r];
        has_arrived[r] = 0;
    }
    char line[4096];
    if (zr_watch_mismatch(line, sizeof line, all, T.W)) zr_comm_abort(line, 1);
    free(all);
    arriving = NULL;
    msg_t go = {0};
    for (int r = 1; r < T.W; r++)
        if (send_msg(star[r].fd, &go, GO)) report(d, zr_tcp_now() - t0, "the go could not be sent", 0, r);
    return ZR_OK;
}

static zr_status arrive_other(const zr_comm_desc *d) {
    double t0 = zr_tcp_now(), tmo = zr_watch_timeout(), limit = tmo > 0 ? t0 + tmo : 1e300;
    msg_t m = {0};
    m.desc = *d;
    if (send_msg(star[0].fd, &m, ARRIVE)) zr_tcp_fail(d, 0, "rank 0's connection is closed (it ended, crashed or was killed)", 0);
    for (;;) {
        int st = other_read(d);
        if (st == 1) return ZR_OK;
        double t = zr_tcp_now();
        if (st < 0)
            zr_tcp_fail(d, t - t0, ended0 ? "rank 0 ended its program (it said goodbye) without calling it"
                                          : "rank 0 closed its connections without a goodbye: crashed or killed", 0);
        if (t >= limit) zr_tcp_fail(d, t - t0, NULL, 0);
        zr_watch_take_over();
        struct pollfd pf = {star[0].fd, POLLIN, 0};
        poll(&pf, 1, zr_tcp_ms(limit - t));
    }
}

zr_status zr_tcp_arrive(const zr_comm_desc *d) {
    if (T.W < 2) return ZR_OK;
    return T.me == 0 ? arrive0(d) : arrive_other(d);
}

/* --- the stop thread --- */

static int recv_blocking(int fd, msg_t *m) {
    for (size_t got = 0; got < sizeof *m;) {
        ssize_t k = recv(fd, (char *)m + got, sizeof *m - got, 0);
        if (k > 0) got += (size_t)k;
        else if (k < 0 && errno == EINTR) continue;
        else return -1;
    }
    return m->magic == TCP_MAGIC ? 0 : -1;
}

/* Blocks (no polling) on the stop links. Another rank stopped the job: end this process now (rank
 * 0 first passes the stop on). A link that closes is a rank that ended: nothing to do. */
static void *stop_thread(void *arg) {
    (void)arg;
    msg_t m;
    if (T.me != 0) {
        while (recv_blocking(stop_fd[0], &m) == 0)
            if (m.type == STOP && !__atomic_load_n(&stopping, __ATOMIC_ACQUIRE)) _exit(m.code ? m.code : 1);
        return NULL;
    }
    struct pollfd *pf = calloc((size_t)T.W, sizeof *pf);
    if (!pf) return NULL;
    int live = T.W - 1;
    for (int r = 1; r < T.W; r++) pf[r - 1] = (struct pollfd){stop_fd[r], POLLIN, 0};
    while (live > 0) {
        if (poll(pf, (nfds_t)(T.W - 1), -1) < 0) {
            if (errno == EINTR) continue;
            break;
        }
        for (int i = 0; i < T.W - 1; i++) {
            if (pf[i].fd < 0 || !pf[i].revents) continue;
            if (recv_blocking(pf[i].fd, &m) == 0 && m.type == STOP) {
                if (__atomic_exchange_n(&stopping, 1, __ATOMIC_ACQ_REL)) return NULL; /* this rank stops it */
                int code = m.code ? m.code : 1;
                m.rank = 0;
                for (int r = 1; r < T.W; r++)
                    if (r != i + 1) send_all(stop_fd[r], &m, sizeof m, zr_tcp_now() + 1);
                _exit(code);
            }
            pf[i].fd = -1;
            live--;
        }
    }
    free(pf);
    return NULL;
}

/* --- rendezvous --- */

static int env_num(const char *k, int lo, int hi, int *out) {
    const char *v = getenv(k);
    char *end;
    if (!v || !*v) return 0;
    long x = strtol(v, &end, 10);
    if (*end || x < lo || x > hi) return -1;
    *out = (int)x;
    return 1;
}

static void tune(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    fcntl(fd, F_SETFD, FD_CLOEXEC);
}

/* A listening socket on any address; port 0: one the system picks (*port says which). */
static int listen_on(int *port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    if (fd < 0) return -1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)*port), .sin_addr.s_addr = htonl(INADDR_ANY)};
    socklen_t len = sizeof a;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) || listen(fd, T.W + 16) || getsockname(fd, (struct sockaddr *)&a, &len)) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    *port = ntohs(a.sin_port);
    return fd;
}

/* Connects to a, retrying until the deadline (the other side may not listen yet). */
static int connect_to(const struct sockaddr_in *a, double deadline, char *why, size_t n) {
    double pause = 0.02;
    snprintf(why, n, "timed out");
    for (;;) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            snprintf(why, n, "%s", strerror(errno));
            return -1;
        }
        fcntl(fd, F_SETFL, O_NONBLOCK);
        int rc = connect(fd, (const struct sockaddr *)a, sizeof *a), err = rc ? errno : 0;
        if (rc && err == EINPROGRESS) {
            struct pollfd pf = {fd, POLLOUT, 0};
            double left = deadline - zr_tcp_now();
            socklen_t len = sizeof err;
            if (poll(&pf, 1, (int)((left < 5 ? left : 5) * 1000) + 1) == 1 &&
                getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0) {
            } else
                err = ETIMEDOUT;
        }
        if (!err) {
            fcntl(fd, F_SETFL, 0);
            tune(fd);
            return fd;
        }
        close(fd);
        snprintf(why, n, "%s", strerror(err));
        if (zr_tcp_now() + pause > deadline) return -1;
        nap(pause);
        pause = pause < 0.5 ? pause * 2 : 1;
    }
}

/* Accepts one connection and reads its hello; -1 when the deadline passed (strangers are dropped). */
static int accept_hello(int lfd, msg_t *h, struct sockaddr_in *peer, double deadline) {
    while (zr_tcp_now() < deadline) {
        struct pollfd pf = {lfd, POLLIN, 0};
        if (poll(&pf, 1, zr_tcp_ms(deadline - zr_tcp_now())) <= 0) continue;
        socklen_t len = sizeof *peer;
        int fd = accept(lfd, (struct sockaddr *)peer, &len);
        if (fd < 0) continue;
        tune(fd);
        double hd = zr_tcp_now() + 5 < deadline ? zr_tcp_now() + 5 : deadline;
        if (recv_all(fd, h, sizeof *h, hd) == 0 && h->magic == TCP_MAGIC && h->type == HELLO) return fd;
        close(fd);
    }
    return -1;
}

typedef struct {
    uint32_t ip; /* network order */
    int32_t port;
    char host[64];
} entry_t;

/* Rank 0: gathers every other rank's hello, checks them, and sends the table (or the reason). */
static zr_status gather_hellos(int lfd, entry_t *tab, double deadline, int debug) {
    char err[768] = "";
    int joined = 0, need = 2 * (T.W - 1);
    while (joined < need && !err[0]) {
        msg_t h;
        struct sockaddr_in peer;
        int fd = accept_hello(lfd, &h, &peer, deadline);
        if (fd < 0) break;
        int r = h.rank;
        if (h.world != T.W)
            snprintf(err, sizeof err, "rank %d was started with WORLD_SIZE=%d but rank 0 with WORLD_SIZE=%d: start "
                     "every rank with the same WORLD_SIZE", r, h.world, T.W);
        else if (r < 1 || r >= T.W || (h.kind == KIND_STAR ? star[r].fd : stop_fd[r]) >= 0)
            snprintf(err, sizeof err, "two processes were started as RANK=%d: give each process its own RANK, 0 to %d",
                     r, T.W - 1);
        else if (h.kind == KIND_STAR && h.debug != debug)
            snprintf(err, sizeof err, "ZRUN_COMM_DEBUG is %s for rank 0 but %s for rank %d: set it for every rank",
                     debug ? "on" : "off", debug ? "off" : "on", r);
        if (err[0] || (h.kind != KIND_STAR && h.kind != KIND_STOP)) {
            msg_t m = {0};
            snprintf(m.text, sizeof m.text, "%s", err);
            if (err[0] && h.kind == KIND_STAR) send_msg(fd, &m, TABLE); /* the rank refused hears why */
            close(fd);
            continue;
        }
        joined++;
        if (h.kind == KIND_STOP) {
            stop_fd[r] = fd;
            continue;
        }
        star[r].fd = fd;
        tab[r].ip = peer.sin_addr.s_addr;
        tab[r].port = h.port;
        memcpy(tab[r].host, h.host, sizeof tab[r].host);
        tab[r].host[sizeof tab[r].host - 1] = 0;
    }
    if (!err[0] && joined < need) {
        int *miss = malloc(sizeof *miss * (size_t)T.W), k = 0;
        char rs[160] = "some ranks";
        for (int r = 1; miss && r < T.W; r++)
            if (star[r].fd < 0 || stop_fd[r] < 0) miss[k++] = r;
        if (miss) zr_watch_ranks_str(rs, sizeof rs, miss, k);
        free(miss);
        snprintf(err, sizeof err, "%s of WORLD_SIZE=%d did not join rank 0 at %s within %g s: start all %d ranks with the "
                 "same MASTER_ADDR, MASTER_PORT and WORLD_SIZE (ZRUN_COMM_TIMEOUT sets how long rank 0 waits)",
                 rs, T.W, master_str, zr_watch_timeout(), T.W);
    }
    msg_t m = {0};
    snprintf(m.text, sizeof m.text, "%s", err);
    for (int r = 1; r < T.W; r++)
        if (star[r].fd >= 0 && (send_msg(star[r].fd, &m, TABLE) ||
                                (!err[0] && send_all(star[r].fd, tab, sizeof *tab * (size_t)T.W, deadline + 10))))
            if (!err[0]) snprintf(err, sizeof err, "rank %d closed its connection during the rendezvous", r);
    return err[0] ? zr_error("torchrun rendezvous: %s", err) : ZR_OK;
}

/* Another rank: joins rank 0 and receives the table. */
static zr_status join(int port, entry_t *tab, double deadline, int debug, const char *host) {
    char why[128];
    msg_t h = {0};
    h.port = port;
    h.debug = debug;
    snprintf(h.host, sizeof h.host, "%s", host);
    msg_t m;
    for (int kind = KIND_STAR; kind <= KIND_STOP; kind++) {
        int fd = connect_to(&master, deadline, why, sizeof why);
        /* refused at the first link, this rank finds rank 0's listener closed: its verdict came */
        if (fd < 0 && kind == KIND_STOP && recv_all(star[0].fd, &m, sizeof m, zr_tcp_now() + 1) == 0 &&
            m.magic == TCP_MAGIC && m.type == TABLE && m.text[0])
            return zr_error("torchrun rendezvous: %s (rank 0's verdict)", m.text);
        if (fd < 0)
            return zr_error("torchrun rendezvous: rank %d could not reach rank 0 at %s within %g s (%s): start rank 0 "
                            "too, with the same MASTER_ADDR and MASTER_PORT for every rank (ZRUN_COMM_TIMEOUT sets how "
                            "long to wait)", T.me, master_str, zr_watch_timeout(), why);
        h.kind = kind;
        send_msg(fd, &h, HELLO);
        if (kind == KIND_STAR) star[0].fd = fd;
        else stop_fd[0] = fd;
    }
    if (recv_all(star[0].fd, &m, sizeof m, deadline + 1) || m.magic != TCP_MAGIC || m.type != TABLE)
        return zr_error("torchrun rendezvous: rank %d reached %s but no zrun rank 0 answered there within %g s: another "
                        "program may hold MASTER_PORT (choose a free one), or rank 0 stopped (see its message)",
                        T.me, master_str, zr_watch_timeout());
    if (m.text[0]) return zr_error("torchrun rendezvous: %s (rank 0's verdict)", m.text);
    if (recv_all(star[0].fd, tab, sizeof *tab * (size_t)T.W, deadline + 10))
        return zr_error("torchrun rendezvous: rank 0 closed its connection while sending the table of ranks");
    return ZR_OK;
}

/* Connects to the next rank and accepts the previous one: the ring. */
static zr_status ring(int lfd, const entry_t *tab, double deadline) {
    int nx = (T.me + 1) % T.W, pv = (T.me + T.W - 1) % T.W;
    struct sockaddr_in a = master;
    if (nx != 0) {
        a.sin_addr.s_addr = tab[nx].ip;
        a.sin_port = htons((uint16_t)tab[nx].port);
    }
    char why[128];
    if ((T.next = connect_to(&a, deadline, why, sizeof why)) < 0)
        return zr_error("torchrun rendezvous: rank %d could not connect to rank %d at %s:%d (%s): a firewall between "
                        "the hosts?", T.me, nx, inet_ntoa(a.sin_addr), ntohs(a.sin_port), why);
    msg_t h = {0};
    h.kind = KIND_RING;
    send_msg(T.next, &h, HELLO);
    struct sockaddr_in peer;
    while ((T.prev = accept_hello(lfd, &h, &peer, deadline)) >= 0 && !(h.kind == KIND_RING && h.rank == pv)) close(T.prev);
    if (T.prev < 0)
        return zr_error("torchrun rendezvous: rank %d (%s) did not connect to rank %d within %g s", pv,
                        pv ? tab[pv].host : "rank 0", T.me, zr_watch_timeout());
    return ZR_OK;
}

static void bye(void) {
    if (said_bye || T.W < 2 || __atomic_load_n(&stopping, __ATOMIC_ACQUIRE)) return;
    said_bye = 1;
    msg_t m = {0};
    char sink[4096];
    for (int r = 0; r < T.W; r++) {
        if (star[r].fd >= 0 && (T.me == 0) == (r != 0)) {
            send_msg(star[r].fd, &m, BYE);
            while (recv(star[r].fd, sink, sizeof sink, MSG_DONTWAIT) > 0) {} /* unread bytes would reset */
            shutdown(star[r].fd, SHUT_WR);
        }
        if (stop_fd[r] >= 0) shutdown(stop_fd[r], SHUT_RDWR); /* ends the stop threads' waits */
    }
    if (T.next >= 0) shutdown(T.next, SHUT_WR);
}

void zr_tcp_finalize(void) { bye(); }

zr_status zr_tcp_init(zr_comm_info *info) {
    int rank = 0, world = 1, port = 0, lr = -1, ls = -1;
    const char *addr = getenv("MASTER_ADDR");
    if (env_num("RANK", 0, 1 << 24, &rank) < 0 || env_num("WORLD_SIZE", 1, 1 << 24, &world) < 0 || rank >= world)
        return zr_error("torchrun's RANK=%s and WORLD_SIZE=%s must be integers with 0 <= RANK < WORLD_SIZE",
                        getenv("RANK") ? getenv("RANK") : "", getenv("WORLD_SIZE") ? getenv("WORLD_SIZE") : "");
    if (!addr || !*addr || env_num("MASTER_PORT", 1, 65535, &port) != 1)
        return zr_error("torchrun launch (RANK=%d, WORLD_SIZE=%d) without MASTER_ADDR and MASTER_PORT (1-65535): set both "
                        "for every rank, to rank 0's host and a free port (torchrun sets them)", rank, world);
    if (env_num("LOCAL_RANK", 0, 1 << 24, &lr) < 0 || env_num("LOCAL_WORLD_SIZE", 1, 1 << 24, &ls) < 0)
        return zr_error("LOCAL_RANK=%s / LOCAL_WORLD_SIZE=%s must be integers", getenv("LOCAL_RANK"), getenv("LOCAL_WORLD_SIZE"));
    /* Under torchrun its agent already serves a TCPStore on MASTER_PORT (and tells its workers so
     * with TORCHELASTIC_USE_AGENT_STORE): zrun's rendezvous then takes the next port. */
    const char *agent = getenv("TORCHELASTIC_USE_AGENT_STORE");
    const int shifted = agent && (!strcmp(agent, "True") || !strcmp(agent, "true") || !strcmp(agent, "1"));
    if (shifted) port = port < 65535 ? port + 1 : port - 1;
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res = NULL;
    int gai = getaddrinfo(addr, NULL, &hints, &res);
    if (gai || !res) return zr_error("MASTER_ADDR=%s: %s (it must name rank 0's host, IPv4)", addr, gai_strerror(gai));
    master = *(struct sockaddr_in *)res->ai_addr;
    master.sin_port = htons((uint16_t)port);
    freeaddrinfo(res);
    snprintf(master_str, sizeof master_str, "MASTER_ADDR:MASTER_PORT=%s:%d%s", addr, port,
             shifted ? " (MASTER_PORT's neighbour: torchrun's agent store holds MASTER_PORT)" : "");
    T.me = rank;
    T.W = world;
    star = calloc((size_t)world, sizeof *star);
    stop_fd = malloc(sizeof *stop_fd * (size_t)world);
    arrived = calloc((size_t)world, sizeof *arrived);
    has_arrived = calloc((size_t)world, 4);
    ended = has_arrived + world;
    gone = ended + world;
    entry_t *tab = calloc((size_t)world, sizeof *tab);
    if (!star || !stop_fd || !arrived || !has_arrived || !tab) return zr_error("comm (TCP): out of host memory");
    for (int r = 0; r < world; r++) star[r].fd = stop_fd[r] = -1;
    double tmo = zr_watch_timeout(), deadline = zr_tcp_now() + (tmo > 0 ? tmo : 1e9);
    int lport = rank == 0 ? port : 0, lfd = listen_on(&lport), debug = zr_comm_debug();
    if (lfd < 0 && rank == 0 && errno == EADDRINUSE)
        return zr_error("torchrun rendezvous: port %d%s is in use on rank 0's host (another job, or an earlier run "
                        "still holding it): choose a free port for every rank (torchrun --master_port P)", port,
                        shifted ? " (MASTER_PORT + 1: torchrun's agent store holds MASTER_PORT, zrun takes the next)" : "");
    if (lfd < 0) return zr_error("torchrun rendezvous: rank %d could not listen on port %d: %s", rank, lport, strerror(errno));
    gethostname(tab[rank].host, sizeof tab[rank].host - 1);
    zr_status st = rank == 0 ? gather_hellos(lfd, tab, deadline, debug) : join(lport, tab, deadline, debug, tab[rank].host);
    if (!st) st = ring(lfd, tab, deadline);
    close(lfd);
    if (st) {
        free(tab);
        return st;
    }
    /* local ranks: torchrun's variables, else the ranks on this host */
    int same = 0, below = 0;
    for (int r = 0; r < world; r++)
        if (!strcmp(tab[r].host, tab[rank].host)) {
            same++;
            below += r < rank;
        }
    free(tab);
    info->rank = rank;
    info->world_size = world;
    info->local_rank = lr >= 0 ? lr : below;
    info->local_size = ls >= 0 ? ls : same;
    atexit(bye);
    pthread_t th;
    if (pthread_create(&th, NULL, stop_thread, NULL)) return zr_error("comm (TCP): could not start the stop thread");
    pthread_detach(th);
    return ZR_OK;
}
