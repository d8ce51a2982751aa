"""PyTorch baseline for tests/bench/bench_llama.lua: the same Llama training step in PyTorch, eager
and torch.compile, side by side with zrun (tests/bench/vs_torch.sh). transformers'
LlamaForCausalLM from a config.json (random init, sdpa attention), mixed precision as PyTorch
users run it: fp32 parameters and gradients (so fp32 gradient accumulation, as zrun's
grad_accum=fp32 and DeepSpeed's default), bf16 autocast, fused AdamW; random token ids.
Prints one line per mode: "torch MODE tokens/s N step_ms M peak_GiB G".
    python3 tests/bench/llama_torch.py CONFIG_JSON [--batch 4] [--seq 512] [--gas 8] [--steps 6] [--modes eager,compile]
Runs on the GPU machine only (not part of the build or the tests)."""
import argparse
import json
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def run(cfg, mode, a):
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).cuda()
    model.config.use_cache = False
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    fwd = torch.compile(model) if mode == "compile" else model
    V = cfg.vocab_size

    def step():
        for _ in range(a.gas):
            ids = torch.randint(0, V, (a.batch, a.seq), device="cuda")
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = fwd(input_ids=ids, labels=ids).loss / a.gas
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=False)

    for _ in range(3):  # warm-up (and compilation)
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    ts = []
    for _ in range(a.steps):
        t = time.perf_counter()
        step()
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t)
    ts.sort()
    med = ts[len(ts) // 2]
    toks = a.batch * a.seq * a.gas / med
    peak = torch.cuda.max_memory_allocated() / 2**30
    print(f"torch {mode} tokens/s {toks:.0f} step_ms {med * 1e3:.1f} peak_GiB {peak:.2f}", flush=True)
    del model, opt, fwd
    torch.cuda.empty_cache()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("config")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--gas", type=int, default=8)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--modes", default="eager,compile")
    a = p.parse_args()
    with open(a.config) as f:
        raw = json.load(f)
    for k in ("torch_dtype", "dtype"):
        raw.pop(k, None)
    cfg = LlamaConfig(**raw)
    cfg._attn_implementation = "sdpa"
    torch.backends.cuda.matmul.allow_tf32 = True
    for mode in a.modes.split(","):
        try:
            run(cfg, mode, a)
        except Exception as e:  # e.g. out of memory at a large shape
            print(f"torch {mode} failed: {str(e).splitlines()[0][:160]}", flush=True)


if __name__ == "__main__":
    main()
