# The GEMM ceiling under sustained load: Llama-3.2-1B's products at one micro-batch of 4 x 512 tokens
# (bf16, cuBLAS through torch), each run back to back for SECONDS after the GPU is warm, so the clock
# is the one a training run gets (the H200 holds its 700 W cap by lowering the SM clock), not the boost
# clock of a short or serialised (ncu) measurement. Prints TFLOP/s per product and for the
# micro-batch's mix (forward, dX and dW of each, weighted by FLOPs).
#   python3 tests/bench/gemm_sustained.py [SECONDS per product, default 3]
import sys, time, torch
secs = float(sys.argv[1]) if len(sys.argv) > 1 else 3.0
M, H, I, V, KV = 2048, 2048, 8192, 128256, 512  # tokens, hidden, intermediate, vocab, k/v width
prods = {"q/k/v": (H, H + 2 * KV), "o": (H, H), "gate/up": (H, 2 * I), "down": (I, H), "lm head": (H, V)}
layers = {"q/k/v": 16, "o": 16, "gate/up": 16, "down": 16, "lm head": 1}
def run(a, b, out, n):
    for _ in range(n): torch.matmul(a, b, out=out)
def rate(shape_a, shape_b):
    a = torch.randn(*shape_a, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(*shape_b, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(shape_a[0], shape_b[1], device="cuda", dtype=torch.bfloat16)
    run(a, b, out, 3); torch.cuda.synchronize()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < secs:
        run(a, b, out, 20); torch.cuda.synchronize(); n += 20
    dt = time.perf_counter() - t0
    return 2.0 * shape_a[0] * shape_a[1] * shape_b[1] * n / dt / 1e12
warm = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
t0 = time.perf_counter()
while time.perf_counter() - t0 < secs: warm @ warm; torch.cuda.synchronize()
print(f"{'product (M=2048 tokens)':<28}{'fwd':>8}{'dX':>8}{'dW':>8}  TFLOP/s, sustained")
tot_f, tot_t = 0.0, 0.0
for name, (k, n) in prods.items():
    f = rate((M, k), (k, n)); dx = rate((M, n), (n, k)); dw = rate((k, M), (M, n))
    print(f"{name + ' ' + str(k) + 'x' + str(n):<28}{f:8.0f}{dx:8.0f}{dw:8.0f}")
    fl = 2.0 * M * k * n * layers[name]
    tot_f += 3 * fl; tot_t += (fl / f + fl / dx + fl / dw) / 1e12
print(f"micro-batch mix: {tot_f / 1e12:.2f} TFLOP in {tot_t * 1e3:.2f} ms of GEMM = {tot_f / tot_t / 1e12:.0f} TFLOP/s")
