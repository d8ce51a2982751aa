"""A model of attn_bwd_sm90_kernel's (kernels/cuda/attention_bwd_sm90.cu) persistent schedule and
barrier protocol, run on the CPU: `python3 tests/cuda/attention_bwd_sm90_emu.py [seed]` (~30 s; no GPU
needed). Each block's roles (producer warp, dQ warp, 8 consumer warps) are coroutines that mirror the
kernel's loops and counters; TMA, cp.async, reduce-adds and wgmma operand reads are delayed events;
a random scheduler interleaves them, with mbarriers as the hardware has them (try_wait.parity p
passes once the phase of parity p has completed; transaction bytes) and the named barrier over the
8 consumer warps. It fails on a deadlock, on a buffer (Q/dO/lse/D stage, K/V, dS^T, dQ) written while
read or read with another step's data (which is what a wrong or lapped phase leads to), and unless
every (item, query head, query tile) of the shape is consumed exactly once, at grids of 1, 2, 3, 5, 7
blocks and one block per item. Change it with the kernel's protocol."""
import random, sys

WS_ST = 2


class Fail(Exception):
    pass


def check(c, msg):
    if not c:
        raise Fail(msg)


class MBar:
    def __init__(s, name, count):
        s.name, s.count, s.pending, s.tx, s.k = name, count, count, 0, 0

    def _maybe(s):
        if s.pending == 0 and s.tx == 0:
            s.k += 1
            s.pending = s.count

    def arrive(s, n=1):
        check(s.pending >= n, f"{s.name}: {n} arrivals on a phase with {s.pending} pending")
        s.pending -= n
        s._maybe()

    def expect_tx(s, b):
        s.tx += b
        s.arrive()

    def complete_tx(s, b):
        s.tx -= b
        check(s.tx >= 0 or s.pending > 0, f"{s.name}: tx underflow")
        s._maybe()

    def passes(s, parity):
        return (s.k & 1) != parity


def item_of(r, nblk, blk):
    return r * nblk + ((nblk - 1 - blk) if (r & 1) else blk)


def decode(w, nbh, nT, Hkv, G, nsplit):
    j = w // nbh
    x = w % nbh
    split = x % nsplit
    bhk = x // nsplit
    b, hk = bhk // Hkv, bhk % Hkv
    Gs = G // nsplit
    h0 = hk * G + split * Gs
    nq = nT - j
    return dict(j=j, split=split, bhk=bhk, b=b, hk=hk, h0=h0, nq=nq, niter=Gs * nq)


def run_block(B, Hq, Hkv, T, nsplit, nblk, blk, rng, consumed, items_seen):
    G = Hq // Hkv
    nT = (T + 127) // 128
    nbh = B * Hkv * nsplit
    nitems = nbh * nT
    kvfull, kvempty = MBar("kvfull", 1), MBar("kvempty", 8)
    full = [MBar(f"full{s}", 33) for s in range(WS_ST)]
    empty = [MBar(f"empty{s}", 8) for s in range(WS_ST)]
    dqfull = [MBar(f"dqfull{w}", 128) for w in range(2)]
    dqempty = [MBar(f"dqempty{w}", 1) for w in range(2)]
    st = dict(kv=None, stage=[None] * WS_ST, lsed=[None] * WS_ST, ds=[[{}, {}], [{}, {}]],
              dq=[[None] * 4, [None] * 4], kvread=set(), stread=[set(), set()], dsread=[set(), set()],
              dqread=[False, False], kvwrite=False, stwrite=[0, 0], named=[0, 0])
    agents = []

    def delay():
        for _ in range(rng.choice([0, 1, 2, 5, 20])):
            yield None

    def spawn(gen):
        agents.append(gen)

    # ---- asynchronous copies ------------------------------------------------------------------
    def tma_kv(tag):
        check(not st["kvread"], f"K/V load of item {tag} while {st['kvread']} read K/V")
        st["kvwrite"] = True
        yield from delay()
        check(not st["kvread"], f"K/V landing for item {tag} while read")
        st["kv"] = tag
        st["kvwrite"] = False
        kvfull.complete_tx(2 * 128 * 64 * 2)

    def tma_stage(s, tag):
        check(not st["stread"][s], f"Q/dO load into stage {s} while {st['stread'][s]} read it")
        st["stwrite"][s] += 1
        yield from delay()
        check(not st["stread"][s], f"Q/dO landing in stage {s} while read")
        st["stage"][s] = tag
        st["stwrite"][s] -= 1
        full[s].complete_tx(2 * 128 * 64 * 2)

    def cp_lsed(s, tag):
        check(not st["stread"][s], f"lse/D copy into stage {s} while read")
        st["stwrite"][s] += 1
        yield from delay()
        st["lsed"][s] = tag
        st["stwrite"][s] -= 1
        full[s].arrive(32)

    def wait(bar, parity):
        yield (lambda: bar.passes(parity))

    def block_items():  # the kernel's item loop: (r, w, item) for r = 0, 1, ...
        r = 0
        while (w := item_of(r, nblk, blk)) < nitems:
            yield r, w, decode(w, nbh, nT, Hkv, G, nsplit)
            r += 1

    # ---- producer warp ------------------------------------------------------------------------
    def producer():
        c = 0
        for r, w, t in block_items():
            if r == 0:
                kvfull.expect_tx(2 * 128 * 64 * 2)
                spawn(tma_kv(w))
            for it in range(t["niter"]):
                s = c % WS_ST
                h, i = t["h0"] + it // t["nq"], t["j"] + it % t["nq"]
                if c >= WS_ST:
                    yield from wait(empty[s], ((c // WS_ST) - 1) & 1)
                full[s].expect_tx(2 * 128 * 64 * 2)
                spawn(tma_stage(s, (w, it, h, i)))
                spawn(cp_lsed(s, (w, it, h, i)))
                if r > 0 and it == 0:
                    yield from wait(kvempty, (r - 1) & 1)
                    kvfull.expect_tx(2 * 128 * 64 * 2)
                    spawn(tma_kv(w))
                c += 1
                yield None

    # ---- dQ warp ------------------------------------------------------------------------------
    def reduce_add(wg, done):
        yield from delay()
        done[0] = True

    def dqwarp():
        c = 0
        for r, w, t in block_items():
            for it in range(t["niter"]):
                h, i = t["h0"] + it // t["nq"], t["j"] + it % t["nq"]
                for wg in range(2):
                    yield from wait(dqfull[wg], c & 1)
                    check(st["dq"][wg] == [(w, it, h, i, wg)] * 4,
                          f"dQ warp step {c}: buffer {wg} holds {st['dq'][wg]}, wants {(w, it, h, i, wg)}")
                    st["dqread"][wg] = True
                    done = [False]
                    spawn(reduce_add(wg, done))
                    yield (lambda: done[0])
                    check(st["dq"][wg] == [(w, it, h, i, wg)] * 4, "dQ buffer overwritten while read")
                    st["dqread"][wg] = False
                    dqempty[wg].arrive()
                c += 1

    # ---- consumer warpgroups ------------------------------------------------------------------
    def named_barrier():
        gen = st["named"][1]
        st["named"][0] += 1
        if st["named"][0] == 8:  # bar_sync(WS_BAR_DS, 256): the 8 consumer warps
            st["named"][0] = 0
            st["named"][1] += 1
        yield (lambda: st["named"][1] != gen)

    # Consumer warps run independently but for the named barrier (pessimistic: a warpgroup's wgmma
    # is taken to read its operands from each warp's issue until that warp's wait returns).
    def consumer(wg, wp):
        me = (wg, wp)
        c = 0
        for r, w, t in block_items():
            items_seen.append(w)
            yield from wait(kvfull, r & 1)
            check(st["kv"] == w, f"warp {me} item {w}: K/V holds item {st['kv']}")
            st["kvread"].add(me)
            for it in range(t["niter"]):
                s = c % WS_ST
                i = t["j"] + it % t["nq"]
                h = t["h0"] + it // t["nq"]
                yield from wait(full[s], (c // WS_ST) & 1)
                want = (w, it, h, i)
                check(st["stage"][s] == want and st["lsed"][s] == want,
                      f"warp {me} step {c}: stage {s} holds {st['stage'][s]}/{st['lsed'][s]}, wants {want}")
                check(st["stwrite"][s] == 0, "stage still being written")
                st["stread"][s].add(me)
                if me == (0, 0):
                    consumed.append((t["b"], t["hk"], t["j"], t["split"], h, i))
                buf = c & 1
                for hh in range(2):
                    yield from delay()  # S^T, dP^T
                    check(not st["dsread"][buf],
                          f"warp {me} step {c}: dS^T buffer {buf} written while read by {st['dsread'][buf]}")
                    st["ds"][buf][hh][me] = c
                    yield None  # dV/dK issued
                yield from named_barrier()
                check(all(st["ds"][buf][wg].get((x, y)) == c for x in range(2) for y in range(4)),
                      f"warp {me} step {c}: dS^T half {wg} is {st['ds'][buf][wg]}")
                st["dsread"][buf].add(me)  # dQ product in flight
                yield from delay()  # wg_wait<1>: dV/dK done
                check(st["stage"][s] == want and st["lsed"][s] == want, "stage overwritten while read")
                st["stread"][s].discard(me)
                empty[s].arrive(1)
                if c > 0:
                    yield from wait(dqempty[wg], (c - 1) & 1)
                yield from delay()  # wg_wait<0>: dQ product done
                check(all(st["ds"][buf][wg].get((x, y)) == c for x in range(2) for y in range(4)),
                      "dS^T overwritten while read")
                check(st["kv"] == w and not st["kvwrite"], "K/V overwritten while read")
                st["dsread"][buf].discard(me)
                if it == t["niter"] - 1:
                    st["kvread"].discard(me)
                    kvempty.arrive(1)
                check(not st["dqread"][wg], f"warp {me} step {c}: dQ buffer written while the TMA reads it")
                st["dq"][wg][wp] = (w, it, h, i, wg)
                dqfull[wg].arrive(32)
                c += 1
            yield None  # store_dkv

    roles = [producer(), dqwarp()] + [consumer(x, y) for x in range(2) for y in range(4)]
    agents.extend(roles)
    pend = {}  # agent -> the predicate it waits on
    while agents:
        ready = [a for a in agents if a not in pend or pend[a]()]
        if not ready:
            raise Fail(f"deadlock: all {len(agents)} agents wait (barriers: " +
                       ", ".join(f"{b.name} k{b.k} pending{b.pending} tx{b.tx}" for b in
                                 [kvfull, kvempty] + full + empty + dqfull + dqempty) + ")")
        a = rng.choice(ready)
        pend.pop(a, None)
        try:
            y = next(a)
            if y is not None:
                pend[a] = y
        except StopIteration:
            agents.remove(a)
    check(st["kvread"] == set(), "K/V still marked read at exit")
    # every async copy has landed (the producer's cp_async_wait<0>, the dQ warp's bulk_wait<0>)
    check(st["stwrite"] == [0, 0] and not st["kvwrite"], "copies outstanding at exit")


def expected(B, Hq, Hkv, T, nsplit):
    G, nT = Hq // Hkv, (T + 127) // 128
    out = []
    for b in range(B):
        for hk in range(Hkv):
            for j in range(nT):
                for sp in range(nsplit):
                    Gs = G // nsplit
                    for h in range(hk * G + sp * Gs, hk * G + (sp + 1) * Gs):
                        for i in range(j, nT):
                            out.append((b, hk, j, sp, h, i))
    return sorted(out)


def main():
    rng = random.Random(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
    shapes = [(1, 1, 1, 1, 1), (2, 4, 2, 37, 1), (2, 4, 2, 37, 2), (1, 2, 2, 64, 1),
              (1, 8, 2, 130, 1), (1, 8, 2, 130, 4), (1, 4, 1, 200, 4), (1, 6, 2, 300, 1),
              (1, 3, 1, 550, 1), (2, 4, 2, 1000, 2), (1, 4, 1, 1100, 1)]
    n = 0
    for (B, Hq, Hkv, T, ns) in shapes:
        nT = (T + 127) // 128
        nitems = B * Hkv * ns * nT
        for nblk in sorted({1, 2, 3, 5, 7, nitems}):
            if nblk > nitems:
                continue
            for rep in range(3):
                consumed, seen = [], []
                for blk in range(nblk):
                    run_block(B, Hq, Hkv, T, ns, nblk, blk, rng, consumed, seen)
                check(sorted(seen) == sorted(list(range(nitems)) * 8),
                      f"items run {sorted(seen)} (each 8 times: 8 consumer warps)")
                check(sorted(consumed) == expected(B, Hq, Hkv, T, ns),
                      f"B{B} Hq{Hq} Hkv{Hkv} T{T} ns{ns} grid {nblk}: (item, head, tile) set differs")
                n += 1
    print(f"{n} runs passed")


if __name__ == "__main__":
    main()
