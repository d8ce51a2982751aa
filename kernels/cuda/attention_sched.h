/* The Hopper attention backward's static schedule (attention_bwd_sm90.cu): which work item, a key
 * tile of a (batch, kv head, split), each persistent block runs r-th. Plain C with the CUDA
 * qualifiers where nvcc compiles it, so that the C tests (tests/c/test_attention_sched.c) run the
 * very functions the kernel runs: every item exactly once, for any grid, and the busiest block's
 * share.
 *
 * Work is numbered by position: a head's tiles in consecutive positions (head x holds positions
 * x·n .. x·n + n − 1), ordered within the head heaviest, lightest, second heaviest, second
 * lightest, ..; a head with odd x reversed when n is odd. So every pair of positions (2u, 2u + 1)
 * costs the same, n + 1 tile steps (the k-th heaviest and k-th lightest of one head; for odd n the
 * two middle tiles of heads 2y and 2y + 1 meet in one pair). The blocks running at one time hold
 * neighbouring heads, whose operands stay in L2 between their tiles (GPT-2's MHA backward: 1.29 ->
 * 1.04-1.07 ms against heaviest-first over all heads, which reads each head's Q, dO and dQ from HBM
 * once per key tile).
 * Two phases (ws_sched): the first hp heads' pairs, dealt whole to the blocks in rounds (unit
 * u = blk, blk + nblk, ..); then the last ht heads' tiles one at a time, heaviest first over those
 * heads (tail item i: head hp + i % ht, key tile i / ht), dealt in rounds that go on from where
 * the pairs' last round stopped, every other round in reverse. Pairs alone leave the last round
 * part-full: T = 8192's 1024 pairs on 132 blocks are 8 rounds for 7.76 rounds of work (the
 * busiest block 3.1% over the mean); single tiles at the end, lighter and lighter, fill it. The
 * forward keeps heaviest-first over all its tiles (attention_fwd_sm90.cu): its tiles need no
 * pairing. */
#ifndef ZR_CUDA_ATTENTION_SCHED_H
#define ZR_CUDA_ATTENTION_SCHED_H

#include <stdint.h>

#ifdef __CUDACC__
#define WS_FN static __host__ __device__ __forceinline__
#else
#define WS_FN static inline
#endif

typedef struct {
    int nT;     /* key (and query) tiles of a head */
    int nitems; /* nbh · nT */
    int hp, ht; /* heads of the pair phase and of the tail: hp + ht = nbh, hp · nT even if ht > 0 */
    int u1;     /* pair units: ceil(hp · nT / 2) */
    int start;  /* u1 % nblk: the block the tail's first item goes to */
} ws_sched;

/* The tail: about WS_TAIL rounds of single tiles (whole heads, one more when nT is odd to keep the
 * pair phase's positions even). The busiest block against the mean, modelled in tile steps on 132
 * blocks: B4 H32/8 T8192 +3.1% -> +0.7%, T4096 +3.1% -> +0.8%, B64 H12 T1024 +3.1% -> +0.7%.
 * Measured (tests/bench/RESULTS.md, session 34; medians of 10 alternating rounds) with 2 rounds:
 * backward -2.2% at T8192, -1.5% at GPT-2's shape, -0.9% at T2048; 4 and 6 rounds model better
 * but measured worse (-1.1% / +0.2% at T8192: more heads at once in the tail, fewer of their
 * operands in L2). */
#define WS_TAIL 2

/* The schedule of nbh heads of nT tiles on nblk blocks (host side). */
WS_FN ws_sched ws_schedule(int nbh, int nT, int nblk) {
    int ht = (int)(((int64_t)WS_TAIL * nblk + nT - 1) / nT);
    if (ht > nbh) ht = nbh;
    if ((nT & 1) && ((nbh - ht) & 1)) ++ht; /* nbh - ht odd and >= 1, so ht < nbh before */
    ws_sched s;
    s.nT = nT;
    s.nitems = nbh * nT;
    s.ht = ht;
    s.hp = nbh - ht;
    s.u1 = (s.hp * nT + 1) / 2;
    s.start = s.u1 % nblk;
    return s;
}

/* Item code x · nT + j (head x, key tile j) of position w: j is its weight rank (0 = heaviest). */
WS_FN int ws_pos_code(int w, int n) {
    const int x = w / n;
    int q = w - x * n;
    if ((n & 1) && (x & 1)) q = n - 1 - q;
    return x * n + ((q & 1) ? n - 1 - (q >> 1) : (q >> 1));
}

/* The item code block blk of nblk runs r-th (r = 0, 1, ..), −1 once past its last (and for every
 * later r); every role of the block walks the same sequence. One item a block when the grid has a
 * block for each. */
WS_FN int ws_sched_item(ws_sched s, int r, int nblk, int blk) {
    if (nblk >= s.nitems) return r == 0 ? ws_pos_code(blk, s.nT) : -1;
    const int n1 = blk < s.u1 ? (s.u1 - 1 - blk) / nblk + 1 : 0; /* this block's pair units */
    if (r < 2 * n1) {
        const int w = 2 * (blk + (r >> 1) * nblk) + (r & 1);
        return w < s.hp * s.nT ? ws_pos_code(w, s.nT) : -1; /* odd hp · nT (ht = 0): one short */
    }
    const int rnd = r - 2 * n1 + (blk < s.start); /* round 0 holds blocks start .. nblk − 1 */
    const int k = (rnd & 1) ? nblk - 1 - blk : blk;
    const int i = rnd * nblk + k - s.start;
    if (i >= s.ht * s.nT) return -1;
    return (s.hp + i % s.ht) * s.nT + i / s.ht;
}

#undef WS_FN
#endif
