"""Writes tests/golden/ds_engine.json: what DeepSpeed 0.19.8's engine does on the CPU (its CPU accelerator, one
process) with llama_tiny's golden weights (tests/golden/llama_tiny.{config.json,safetensors}, make_golden.py's) on
fixed batches, for DeepSpeed configs whose behaviour lives in DeepSpeed's own code: OneCycle with its momentum cycle
(beta1 moved every step, beta2 pinned at 0.99), WarmupCosineLR with accumulation and clipping at ZeRO-1. Per config:
the file, the batches, every micro-step's loss and after every optimizer step the learning rate, the first group's
betas and the global gradient norm. Read by tests/lua/test_ds_golden.lua.
    python3 tests/golden/make_ds_golden.py          (torch, transformers, deepspeed: tests/golden/reference.sh's venv)
Not part of the build or the test suite."""
import json
import os
import sys

import torch
from safetensors.torch import load_file
from transformers import LlamaConfig, LlamaForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import check_torch_files as C  # noqa: E402 (one_process_world)
CONFIGS = {
    "onecycle_momentum": {
        "train_micro_batch_size_per_gpu": 2, "steps_per_print": 1000, "zero_optimization": {"stage": 2},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.01}},
        "scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 1e-4, "cycle_max_lr": 3e-3, "cycle_first_step_size": 3,
                                                     "cycle_min_mom": 0.85, "cycle_max_mom": 0.95, "decay_step_size": 2,
                                                     "decay_lr_rate": 0.1, "decay_mom_rate": 0.05}}},
    "warmup_cosine_gas2_clip": {
        "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "gradient_clipping": 0.5,
        "steps_per_print": 1000, "zero_optimization": {"stage": 1},
        "optimizer": {"type": "Adam", "params": {"lr": 2e-3, "betas": [0.8, 0.95], "eps": 1e-6, "weight_decay": 0.1}},
        "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 8, "warmup_num_steps": 2,
                                                           "warmup_min_ratio": 0.05, "cos_min_ratio": 0.1}}},
}
STEPS = 8


def main():
    import deepspeed
    C.one_process_world()
    with open(f"{HERE}/llama_tiny.config.json") as f:
        cfg = LlamaConfig(**{k: v for k, v in json.load(f).items() if k not in ("architectures", "dtype")})
    golden = load_file(f"{HERE}/llama_tiny.safetensors")
    g = torch.Generator().manual_seed(11)
    out = {"deepspeed": deepspeed.__version__, "torch": torch.__version__, "runs": {}}
    for name, ds in CONFIGS.items():
        m = LlamaForCausalLM(cfg)
        m.load_state_dict({k: v for k, v in golden.items() if k in m.state_dict()}, strict=True)
        gas = ds.get("gradient_accumulation_steps", 1)
        batches = [torch.randint(0, cfg.vocab_size, (2, 12), generator=g) for _ in range(gas * STEPS)]
        eng, _, _, _ = deepspeed.initialize(model=m, model_parameters=m.parameters(), config=ds)
        losses, steps = [], []
        for i, b in enumerate(batches):
            loss = eng(input_ids=b, labels=b).loss
            losses.append(float(loss.detach()))
            eng.backward(loss)
            eng.step()
            if (i + 1) % gas == 0:
                grp = eng.optimizer.param_groups[0]
                steps.append({"lr": [float(x) for x in eng.get_lr()], "betas": [float(x) for x in grp["betas"]],
                              "grad_norm": float(eng.get_global_grad_norm())})
        out["runs"][name] = {"config": ds, "batches": [b.tolist() for b in batches], "losses": losses, "steps": steps}
        print(name, [round(x, 6) for x in losses])
    with open(f"{HERE}/ds_engine.json", "w") as f:
        json.dump(out, f, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
