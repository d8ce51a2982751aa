"""transformers' from_pretrained of a model directory, warm page cache: loaded twice, the second
timed (the side-by-side row of tests/bench/bench_load.lua, run on the GPU machine).
    python3 tests/bench/bench_load_hf.py DIR [--device cuda|cpu]
Prints `hf_load_s SECONDS`."""
import argparse
import time

import torch
import transformers

ap = argparse.ArgumentParser()
ap.add_argument("dir")
ap.add_argument("--device", default="cuda")
a = ap.parse_args()


def load():
    kw = {"device_map": a.device} if a.device != "cpu" else {}
    try:  # transformers 5 names it dtype; 4.x torch_dtype
        return transformers.AutoModelForCausalLM.from_pretrained(a.dir, dtype=torch.bfloat16, **kw)
    except TypeError:
        return transformers.AutoModelForCausalLM.from_pretrained(a.dir, torch_dtype=torch.bfloat16, **kw)


def sync():
    if a.device != "cpu":
        torch.cuda.synchronize()


if a.device != "cpu":
    torch.zeros(1, device=a.device)  # CUDA context up before timing, as in zrun's run
best = None
for i in range(2):
    sync()
    t0 = time.perf_counter()
    m = load()
    sync()
    t = time.perf_counter() - t0
    del m
print(f"transformers {transformers.__version__}, torch {torch.__version__}")
print(f"hf_load_s {t:.4f}")
