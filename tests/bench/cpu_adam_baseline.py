# DeepSpeed's CPU AdamW (deepspeed.ops.adam.DeepSpeedCPUAdam, JIT-built on first use) timed on N
# fp32 parameters in Llama-like tensors, for tests/bench/bench_cpu_adam.sh to compare with zrun's
# host AdamW. Prints one line: "deepspeed_cpu_adam N MS" (median step of STEPS after a warm-up),
# or "deepspeed_cpu_adam unavailable: REASON" when it cannot be built or imported.
import sys, time

n_target, steps = int(float(sys.argv[1])), int(sys.argv[2])
try:
    import torch
    from deepspeed.ops.adam import DeepSpeedCPUAdam
except Exception as e:  # no deepspeed, or its op builder failed
    print(f"deepspeed_cpu_adam unavailable: {type(e).__name__}: {e}".splitlines()[0])
    sys.exit(0)

H, params, total = 2048, [], 0
while total < n_target:  # the shapes of bench_offload.lua: (H, 4H), (H, H), (H)
    for shape in ((H, 4 * H), (H, H), (H,)):
        p = torch.nn.Parameter(torch.full(shape, 0.01))
        p.grad = torch.empty(shape).uniform_(-0.01, 0.01)
        params.append(p)
        total += p.numel()
try:
    opt = DeepSpeedCPUAdam(params, lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, adamw_mode=True)
    opt.step()  # builds the op, allocates the states
except Exception as e:
    print(f"deepspeed_cpu_adam unavailable: {type(e).__name__}: {e}".splitlines()[0])
    sys.exit(0)
times = []
for _ in range(steps):
    t = time.perf_counter()
    opt.step()
    times.append((time.perf_counter() - t) * 1e3)
times.sort()
print(f"deepspeed_cpu_adam {total} {times[len(times) // 2]:.1f}")
