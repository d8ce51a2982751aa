"""The PyTorch side of a LoRA training comparison: Hugging Face PEFT's LoRA (get_peft_model, as TRL's SFTTrainer
builds it) on a model directory (e.g. tests/bench/make_random_llama.py's), bf16 weights on the GPU, the Trainer's
loop written out: micro-batches of B x T tokens (rows of a token file, or random ids), gradient accumulation G,
torch's fused AdamW on the adapters, clip 1.0. Prints each step's loss and tokens/s, then the mean rate of the steps
after the warm-up and the rate over all of them (zrun's sft_real_shape.sh prints the latter: num_tokens / runtime).
    python3 tests/bench/lora_torch.py MODEL_DIR [B=4 T=1024 G=8 steps=16 warmup=3 r=16 alpha=32 dropout=0.05
        targets=all-linear lr=2e-4 compile=0]
Needs torch, transformers and peft (PEFT's own import: accelerate, psutil); not part of the build or the tests."""
import sys
import time

import torch
from transformers import AutoModelForCausalLM


def main():
    model_dir = sys.argv[1]
    o = dict(B=4, T=1024, G=8, steps=16, warmup=3, r=16, alpha=32, dropout=0.05, targets="all-linear", lr=2e-4,
             compile=0)
    for a in sys.argv[2:]:
        k, v = a.split("=", 1)
        if k not in o:
            sys.exit(f"lora_torch.py: unknown argument {k} (known: {', '.join(o)})")
        o[k] = type(o[k])(v) if not isinstance(o[k], str) else v
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16, device_map="cuda")
    targets = o["targets"] if o["targets"] == "all-linear" else o["targets"].split(",")
    model = get_peft_model(model, LoraConfig(r=o["r"], lora_alpha=o["alpha"], lora_dropout=o["dropout"],
                                             target_modules=targets, task_type="CAUSAL_LM"))
    model.train()
    trained = [p for p in model.parameters() if p.requires_grad]
    print(f"trained {sum(p.numel() for p in trained):,} of {sum(p.numel() for p in model.parameters()):,} "
          f"parameters; torch {torch.__version__}, {torch.cuda.get_device_name()}")
    opt = torch.optim.AdamW(trained, lr=o["lr"], fused=True)
    fwd = torch.compile(model) if o["compile"] else model
    V, B, T, G = model.config.vocab_size, o["B"], o["T"], o["G"]
    gen = torch.Generator(device="cuda").manual_seed(1)
    rates, t_all = [], 0.0
    for step in range(1, o["steps"] + 1):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        total = 0.0
        for _ in range(G):
            ids = torch.randint(0, V, (B, T), device="cuda", generator=gen)
            loss = fwd(input_ids=ids, labels=ids).loss / G
            loss.backward()
            total += loss.detach()
        torch.nn.utils.clip_grad_norm_(trained, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        t_all += dt
        rate = B * T * G / dt
        if step > o["warmup"]:
            rates.append(rate)
        print(f"step {step}/{o['steps']} | loss {total.item():.4f} | {rate:,.0f} tok/s")
    print(f"steady (steps {o['warmup'] + 1}-{o['steps']}): {sum(rates) / len(rates):,.0f} tokens/s; "
          f"all {o['steps']} steps: {B * T * G * o['steps'] / t_all:,.0f} tokens/s; "
          f"peak memory {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB")


if __name__ == "__main__":
    main()
