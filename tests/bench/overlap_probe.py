"""Does memory-bound work hide behind GEMMs under the H200's power cap? (issue 18's question for the
4x512 step: 180 ms of GEMMs, ~45 ms of memory-bound kernels beside them.)

Runs, each alone and then both at once on two streams: G = the GEMMs of Llama-3.2-1B's MLP at
2048 tokens (gate/up 2048x16384x2048, down 2048x2048x8192, bf16, cuBLAS through torch), and one of
M_add = bf16 adds over 2^30 elements (6 bytes an element, SwiGLU-like traffic) or M_adamw = torch's
fused AdamW over 1.236e9 fp32 parameters (Llama-3.2-1B's optimizer step). Prints, per pair, the
median of ROUNDS alternating rounds: G, M, G||M (wall, both streams), the part of M hidden
((G + M - G||M) / M). The GEMMs first run alone for WARM seconds, so that the figures are the
loaded GPU's (under sustained load the H200 holds 700 W at a lower SM clock).

  python3 tests/bench/overlap_probe.py [ROUNDS=5] [WARM=15]
"""
import statistics
import sys
import time

import torch

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 5
WARM = float(sys.argv[2]) if len(sys.argv) > 2 else 15.0
dev = "cuda"
bf = torch.bfloat16
T, D, F = 2048, 2048, 8192
x = torch.randn(T, D, device=dev, dtype=bf)
h = torch.randn(T, F, device=dev, dtype=bf)
w_gu = torch.randn(2 * F, D, device=dev, dtype=bf) * 0.02
w_d = torch.randn(D, F, device=dev, dtype=bf) * 0.02
gu = torch.empty(T, 2 * F, device=dev, dtype=bf)
y = torch.empty(T, D, device=dev, dtype=bf)
N_GEMM = 64  # pairs: ~206 GFLOP each

a = torch.randn(1 << 30, device=dev, dtype=bf)
b = torch.randn(1 << 30, device=dev, dtype=bf)
c = torch.empty(1 << 30, device=dev, dtype=bf)
N_ADD = 6

P = 1_235_814_400
p = torch.nn.Parameter(torch.randn(P, device=dev) * 0.02)
p.grad = torch.randn(P, device=dev) * 1e-3
opt = torch.optim.AdamW([p], lr=1e-5, fused=True)
opt.step()  # state made here, not in the timed steps


def gemms():
    for _ in range(N_GEMM):
        torch.mm(x, w_gu.t(), out=gu)
        torch.mm(h, w_d.t(), out=y)


def adds():
    for _ in range(N_ADD):
        torch.add(a, b, out=c)


def adamw():
    opt.step()


s1 = torch.cuda.Stream()
s2 = torch.cuda.Stream()


def timed(fns):
    """Wall ms of fns, fn i on stream i, all started together."""
    start = torch.cuda.Event(enable_timing=True)
    ends = [torch.cuda.Event(enable_timing=True) for _ in fns]
    cur = torch.cuda.current_stream()
    start.record(cur)
    for fn, s, e in zip(fns, (s1, s2), ends):
        s.wait_event(start)
        with torch.cuda.stream(s):
            fn()
        e.record(s)
    torch.cuda.synchronize()
    return max(start.elapsed_time(e) for e in ends)


for _ in range(3):
    timed([gemms, adds])
    timed([adamw])
t_end = time.time() + WARM
while time.time() < t_end:
    timed([gemms])

print("| pair | G ms | M ms | G+M | G‖M wall | M hidden |")
print("|---|---|---|---|---|---|")
for name, m in (("GEMMs + adds", adds), ("GEMMs + fused AdamW", adamw)):
    g_t, m_t, gm_t = [], [], []
    for _ in range(ROUNDS):
        g_t.append(timed([gemms]))
        m_t.append(timed([m]))
        gm_t.append(timed([gemms, m]))
    G, M, GM = (statistics.median(v) for v in (g_t, m_t, gm_t))
    print(f"| {name} | {G:.2f} | {M:.2f} | {G + M:.2f} | {GM:.2f} | {100 * (G + M - GM) / M:.0f}% |")
    sys.stdout.flush()
