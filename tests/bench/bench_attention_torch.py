"""PyTorch reference timing for tests/bench/bench_fused.cu's attention rows: causal GQA
scaled_dot_product_attention (bf16, head_dim 64: 32 query / 8 kv heads at B=4, T=512, 2048 and 8192;
GPT-2's 12 heads at B=64, T=1024) forward, backward and forward+backward, with CUDA events, median of 20 after 3 warm-ups.
FLOPs as in bench_fused.cu: forward 4*B*Hq*T^2*Dh/2, backward 2.5x forward.
--sustained (as `bench_fused attention --sustained`): each shape after 2 s of forward + backward, each
time the median of 3 windows of 0.25 s or more of back-to-back calls: the rate at the power cap, as in
training (the default and cuDNN backends only).
--dh 128: head_dim 128 instead (Llama-3-8B's 32 / 8 heads at B=1 T=8192 and B=4 T=2048, Qwen3-0.6B's 16 / 8 at
B=4 T=512), next to `zrun tests/bench/bench_attention_window.lua D=128 B=.. T=.. H=.. KV=.. windows=`.
--dh 96: Phi-3-mini's heads (32, MHA) at B=2 T=4096.
Runs on the GPU machine only (not part of the build or tests): python3 bench_attention_torch.py [--sustained] [--dh 64|96|128]"""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def window_ms(fn, n):
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(n):
        fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b)


def med_ms(fn, warm=3, reps=20):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    ts = sorted(window_ms(fn, 1) for _ in range(reps))
    return ts[len(ts) // 2]


def sustained_ms(fn):
    n = 1
    while window_ms(fn, n) < 250.0:
        n *= 2
    ts = sorted(window_ms(fn, n) / n for _ in range(3))
    return ts[1]


def heat(fn, ms=2000.0):
    done, n = 0.0, 1
    while done < ms:
        done += window_ms(fn, n)
        n *= 2


def run(B, Hq, Hkv, T, backend, sustained=False, Dh=64):
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, Hq, T, Dh, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
    k = torch.randn(B, Hkv, T, Dh, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
    v = torch.randn(B, Hkv, T, Dh, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
    do = torch.randn(B, Hq, T, Dh, device="cuda", dtype=torch.bfloat16, generator=g)
    ctx = sdpa_kernel([backend]) if backend is not None else torch.autocast("cuda", enabled=False)
    with ctx:
        def fwd():
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        o = fwd()

        def bwd():
            torch.autograd.grad(o, (q, k, v), do, retain_graph=True)

        def fb():
            out = fwd()
            torch.autograd.grad(out, (q, k, v), do)
        timed = sustained_ms if sustained else med_ms
        if sustained:
            heat(fb)
        tf, tb, tfb = timed(fwd), timed(bwd), timed(fb)
    ff = 4.0 * B * Hq * T * T * Dh / 2
    fbw = 2.5 * ff
    return tf, tb, tfb, ff / tf / 1e9, fbw / tb / 1e9, (ff + fbw) / tfb / 1e9


def main():
    args = sys.argv[1:]
    sustained = "--sustained" in args
    dh = 64
    if "--dh" in args and args.index("--dh") + 1 < len(args):
        dh = int(args[args.index("--dh") + 1])
    if any(a not in ("--sustained", "--dh", str(dh)) for a in args) or dh not in (64, 96, 128):
        sys.exit(f"usage: bench_attention_torch.py [--sustained] [--dh 64|96|128] (got {' '.join(args)})")
    print("torch", torch.__version__, torch.cuda.get_device_name())
    title = "torch SDPA (causal, gqa, bf16" + (", sustained)" if sustained else ")")
    print(f"{title:34s} {'fwd ms':>10s} {'bwd ms':>10s} {'f+b ms':>10s} "
          f"{'fwd TF/s':>8s} {'bwd TF/s':>8s} {'f+b TF/s':>8s}")
    shapes = ((4, 32, 8, 512), (4, 32, 8, 2048), (4, 32, 8, 8192), (64, 12, 12, 1024))
    if dh == 128:
        shapes = ((4, 16, 8, 512), (4, 32, 8, 2048), (1, 32, 8, 8192))
    if dh == 96:  # Phi-3-mini's heads (32, MHA) at its 4k context
        shapes = ((2, 32, 32, 4096),)
    for B, Hq, Hkv, T in shapes:
        shape = f"B{B} T{T} H{Hq}" + (f"/{Hkv}" if Hkv != Hq else "")
        backends = (("default", None), ("flash", SDPBackend.FLASH_ATTENTION),
                    ("cudnn", SDPBackend.CUDNN_ATTENTION),
                    ("efficient", SDPBackend.EFFICIENT_ATTENTION))
        # sustained: the default and cuDNN backends only (the two that are PyTorch's best at these shapes)
        for name, be in [b for b in backends if not sustained or b[0] in ("default", "cudnn")]:
            try:
                r = run(B, Hq, Hkv, T, be, sustained, dh)
            except Exception as e:  # a backend may not take GQA or these shapes
                print(f"{shape} {name:10s}: unavailable ({str(e).splitlines()[0][:80]})")
                continue
            print(f"{shape + f' Dh{dh} ' + name:34s} {r[0]:10.3f} {r[1]:10.3f} {r[2]:10.3f} "
                  f"{r[3]:8.1f} {r[4]:8.1f} {r[5]:8.1f}")


if __name__ == "__main__":
    main()
