"""The PyTorch side of a CPU training comparison: transformers' LlamaForCausalLM from a config.json (random init,
f32), torch's AdamW, one micro-batch of B x T random tokens a step, torch's threads = OMP_NUM_THREADS (default 2).
Prints the median step time after 2 warm-up steps, as `zrun tests/bench/bench_llama.lua model=CONFIG_DIR
device=cpu dtype=f32 batch=B seq=T` prints zrun's. bf16=1: the forward and backward under
torch.autocast("cpu", bfloat16), f32 weights and AdamW (what transformers' Trainer runs for bf16=True on the CPU;
zrun's side: dtype=bf16, bf16 weights with fp32 master weights and AdamW).
    python3 tests/bench/cpu_torch_llama.py CONFIG_DIR [B=4] [T=128] [steps=5] [bf16=0]
Needs torch and transformers (tests/golden/reference.sh's venv has both); not part of the build or the tests."""
import json
import os
import sys
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def main():
    d = sys.argv[1]
    o = dict(B=4, T=128, steps=5, bf16=0)
    for a in sys.argv[2:]:
        k, v = a.split("=", 1)
        if k not in o:
            sys.exit(f"cpu_torch_llama.py: unknown argument {k}= (takes {', '.join(f'{x}=' for x in o)})")
        o[k] = int(v)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    cfg = LlamaConfig(**json.load(open(os.path.join(d, "config.json"))))
    torch.manual_seed(0)
    m = LlamaForCausalLM(cfg).train()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    ids = torch.randint(0, cfg.vocab_size, (o["B"], o["T"]))
    ts = []
    for _ in range(o["steps"] + 2):
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bool(o["bf16"])):
            loss = m(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        ts.append(time.perf_counter() - t0)
    ts = sorted(ts[2:])
    med = ts[len(ts) // 2]
    print(f"torch {torch.__version__} CPU{' bf16 autocast' if o['bf16'] else ''}, {torch.get_num_threads()} threads: median step {med * 1000:.1f} ms, "
          f"{o['B'] * o['T'] / med:.0f} tokens/s")


if __name__ == "__main__":
    main()
