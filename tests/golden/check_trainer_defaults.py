#!/usr/bin/env python3
"""Checks what zr.Trainer does where the arguments are left out against transformers' Trainer itself
(torch, transformers 5.17, DeepSpeed 0.19.8: the GPU machine, or this CPU through tests/golden/reference.sh;
run from the repo root after `make`):

  1. save_strategy and eval_strategy "epoch" with load_best_model_at_end: the checkpoint both Trainers
     name best (and load) is the same step's, the last one included when its evaluation is the best.
  2. A DeepSpeed config whose optimizer has no lr and whose WarmupLR peak is "auto", no learning_rate
     given: the peak both log is args.learning_rate's default (5e-5).
  3. The no-decay parameter names (get_decay_parameter_names) of a model with a LayerNorm, an RMSNorm
     named without "norm", one named post_norm, biases: the same set in both.
  4. The learning_rate logged at each step under a DeepSpeed file with an optimizer and no scheduler (HF's
     schedule stepped by the engine: the next step's rate) and without DeepSpeed (the step's own).
  5. The rows the Trainer reads, in its order (random sampling: torch.randperm seeded seed + epoch), with seed
     and with data_seed.

usage: python3 tests/golden/check_trainer_defaults.py OUT_DIR [ZRUN]     (prints PASS/FAIL lines)
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_torch_files as C  # noqa: E402 (its OUT and ZRUN come from the same argv)

N, T = 48, 16


def rows(seed):
    g = torch.Generator().manual_seed(seed)
    return [[int(x) for x in torch.randint(0, 96, (T,), generator=g)] for _ in range(N)]


def Rows(r):  # (tensors of input_ids and labels, for transformers' default collator)
    from check_trainer_matrix import Rows as R
    return R(r, tensors=True)


def zrun_trainer(cfg_dir, train, evalr, args_lua, tail):
    return C.zrun_lua(f"""
local zr = require "zrun"
local cjson = require "cjson"
local function ds(r) local out = {{}} for i, x in ipairs(r) do out[i] = {{ input_ids = x }} end
  return zr.datasets.Dataset.from_rows(out) end
local m = zr.models.llama.from_pretrained("{cfg_dir}", {{ dtype = "f32" }})
local tr = zr.Trainer {{ model = m, train_dataset = ds(cjson.decode('{json.dumps(train)}')),
  eval_dataset = ds(cjson.decode('{json.dumps(evalr)}')), args = {args_lua} }}
tr:train()
{tail}
""")


def part1():
    from transformers import Trainer, TrainingArguments
    m = C.tiny_llama(4)
    init = f"{C.OUT}/tinit1"
    m.save_pretrained(init)
    train = rows(1)
    evalr = train[:8]  # (rows it trains on: each epoch's evaluation better, the last the best)
    out = f"{C.OUT}/byepoch"
    args = TrainingArguments(output_dir=out, per_device_train_batch_size=8, num_train_epochs=3, learning_rate=3e-3,
                             eval_strategy="epoch", save_strategy="epoch", load_best_model_at_end=True,
                             logging_steps=1, report_to=[], use_cpu=True, seed=1,
                             train_sampling_strategy="sequential")  # (the same rows in the same order: one curve)
    tr = Trainer(model=m, args=args, train_dataset=Rows(train), eval_dataset=Rows(evalr))
    tr.train()
    hf_best = os.path.basename(tr.state.best_model_checkpoint or "")
    hf_evals = {h["step"]: h["eval_loss"] for h in tr.state.log_history if "eval_loss" in h}
    rc, text = zrun_trainer(init, train, evalr, f'{{ output_dir = "{out}_zrun", per_device_train_batch_size = 8, '
                            'num_train_epochs = 3, learning_rate = 3e-3, eval_strategy = "epoch", save_strategy = "epoch", '
                            'load_best_model_at_end = true, logging_steps = 1, seed = 1, '
                            'train_sampling_strategy = "sequential" }',
                            'print("BEST " .. tostring(tr.state.best_model_checkpoint))\n'
                            'for _, h in ipairs(tr.state.log_history) do if h.eval_loss then '
                            'print(string.format("EVAL %d %.6f", h.step, h.eval_loss)) end end')
    zb = [x.split()[1] for x in text.splitlines() if x.startswith("BEST ")]
    z_best = os.path.basename(zb[0]) if zb else None
    z_evals = {int(x.split()[1]): float(x.split()[2]) for x in text.splitlines() if x.startswith("EVAL ")}
    print(f"  epochs: transformers evals {hf_evals} best {hf_best}; zrun evals {z_evals} best {z_best}", flush=True)
    C.report("save and eval by epoch with load_best_model_at_end: the same best checkpoint as transformers'",
             rc == 0 and z_best == hf_best, text[-500:])


def both_lrs(name, ds_cfg, seed, lr=None):
    """transformers' Trainer and zr.Trainer, 4 steps from the same weights (2 of warm-up, a loss logged every
    step, learning_rate left out where lr is None): the learning_rate each logged at each step."""
    from transformers import Trainer, TrainingArguments
    m = C.tiny_llama(seed)
    init = f"{C.OUT}/tinit_{name}"
    m.save_pretrained(init)
    train = rows(seed)
    args = TrainingArguments(output_dir=f"{C.OUT}/lr_{name}", per_device_train_batch_size=8, max_steps=4, warmup_steps=2,
                             logging_steps=1, report_to=[], deepspeed=ds_cfg, save_strategy="no", use_cpu=ds_cfg is None,
                             **({} if lr is None else {"learning_rate": lr}))
    tr = Trainer(model=m, args=args, train_dataset=Rows(train))
    tr.train()
    hf = [h["learning_rate"] for h in tr.state.log_history if "loss" in h]
    dsl = "" if ds_cfg is None else f", deepspeed = cjson.decode([[{json.dumps(ds_cfg)}]])"
    rc, text = zrun_trainer(init, train, train[:8], f'{{ output_dir = "{C.OUT}/lr_{name}_zrun", per_device_train_batch_size = 8, '
                            f'max_steps = 4, warmup_steps = 2, {"" if lr is None else f"learning_rate = {lr}, "}logging_steps = 1, '
                            f'save_strategy = "no"{dsl} }}',
                            'for _, h in ipairs(tr.state.log_history) do if h.loss then '
                            'print(string.format("LR %.17g", h.learning_rate)) end end')
    z = [float(x.split()[1]) for x in text.splitlines() if x.startswith("LR ")]
    print(f"  logged lr ({name}): transformers {hf}, zrun {z}", flush=True)
    return hf, (z if rc == 0 else []), text


def part2():
    ds_cfg = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
              "optimizer": {"type": "AdamW", "params": {}},
              "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                           "warmup_num_steps": "auto"}},
              "zero_optimization": {"stage": 0}}
    hf, z, text = both_lrs("nolr", ds_cfg, 5)
    C.report("DeepSpeed optimizer without lr, WarmupLR peak \"auto\": args.learning_rate's default, as transformers",
             bool(z) and abs(max(z) - max(hf)) <= 1e-12, text[-500:])


def part3():
    from torch import nn
    from transformers import Trainer, TrainingArguments

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(4, 4)
            self.ln_x = nn.LayerNorm(4)
            self.normalizer = nn.Linear(4, 4, bias=False)
            self.rms = nn.RMSNorm(4)
            self.post_norm = nn.RMSNorm(4)

    m = nn.Sequential(Block(), nn.LayerNorm(4))
    tr = Trainer(model=m, args=TrainingArguments(output_dir=f"{C.OUT}/decay", report_to=[], use_cpu=True))
    decay = set(tr.get_decay_parameter_names(m))
    hf_no = sorted(n for n, _ in m.named_parameters() if n not in decay)
    rc, text = C.zrun_lua("""
local zr = require "zrun"
local nn = zr.nn
local Block = nn.Module:extend("Block")
function Block:__init()
  self.proj = nn.Linear(4, 4); self.ln_x = nn.LayerNorm(4); self.normalizer = nn.Linear(4, 4, { bias = false })
  self.rms = nn.RMSNorm(4); self.post_norm = nn.RMSNorm(4)
end
local m = nn.Sequential(Block(), nn.LayerNorm(4))
local no = zr.Trainer.no_decay_params(m)
local out = {}
for n, p in m:named_parameters() do if no[p] then out[#out + 1] = n end end
table.sort(out)
print("NODECAY " .. table.concat(out, " "))
""")
    z = [x.split()[1:] for x in text.splitlines() if x.startswith("NODECAY")]
    print(f"  no decay: transformers {hf_no}, zrun {z}", flush=True)
    C.report("the no-decay parameters are transformers' get_decay_parameter_names complement", rc == 0 and z and
             sorted(z[0]) == hf_no, text[-400:])


def part4():
    for name, ds_cfg in (("ds_optimizer", {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
                                           "optimizer": {"type": "AdamW", "params": {"lr": "auto"}},
                                           "zero_optimization": {"stage": 0}}), ("plain", None)):
        hf, z, text = both_lrs(name, ds_cfg, 6, 1e-3)
        C.report(f"the logged learning_rate per step ({name}), as transformers'", len(z) == len(hf) and
                 all(abs(a - b) <= 1e-15 for a, b in zip(z, hf)), text[-400:])


def part5():
    """The rows transformers' Trainer reads, in its order (train_sampling_strategy "random": torch.randperm seeded
    seed + epoch under accelerate), next to zr.Trainer's data_order, with seed and with data_seed."""
    from transformers import Trainer, TrainingArguments
    n, lens = 23, [3 + (i * 7) % 11 for i in range(23)]
    seen = []

    class Read(torch.utils.data.Dataset):
        def __len__(self):
            return n

        def __getitem__(self, i):
            seen.append(i)
            return {"input_ids": torch.tensor([i % 90 + 1] * lens[i]), "labels": torch.tensor([i % 90 + 1] * lens[i])}

    def pad(b):
        t = max(len(x["input_ids"]) for x in b)
        ids, lab = torch.zeros(len(b), t, dtype=torch.long), torch.full((len(b), t), -100)
        for k, x in enumerate(b):
            ids[k, :len(x["input_ids"])], lab[k, :len(x["labels"])] = x["input_ids"], x["labels"]
        return {"input_ids": ids, "labels": lab}
    for extra in ({}, {"data_seed": 7}):
        seen.clear()
        args = TrainingArguments(output_dir=f"{C.OUT}/order", per_device_train_batch_size=2, gradient_accumulation_steps=2,
                                 num_train_epochs=2, report_to=[], use_cpu=True, seed=42, save_strategy="no",
                                 logging_steps=100, **extra)
        Trainer(model=C.tiny_llama(0), args=args, train_dataset=Read(), data_collator=pad).train()
        lua_lens = "{" + ",".join(map(str, lens)) + "}"
        rc, text = C.zrun_lua(f"""
local zr = require "zrun"
local lens, rows = {lua_lens}, {{}}
for i = 0, {n - 1} do local ids = {{}}; for k = 1, lens[i + 1] do ids[k] = i % 90 + 1 end; rows[i + 1] = {{ input_ids = ids }} end
local tr = zr.Trainer {{ model = zr.models.llama.LlamaForCausalLM(zr.models.llama.config("zrun/tiny-llama")), train_dataset = rows,
  args = {{ output_dir = "{C.OUT}/order_zrun", per_device_train_batch_size = 2, gradient_accumulation_steps = 2,
    num_train_epochs = 2, seed = 42, save_strategy = "no"{", data_seed = 7" if extra else ""} }} }}
local t = {{}}
for i, v in ipairs((tr:data_order())) do t[i] = v - 1 end
print("ORDER " .. table.concat(t, " "))
""")
        z = [int(x) for x in ([l for l in text.splitlines() if l.startswith("ORDER")] or ["ORDER"])[0].split()[1:]]
        print(f"  order {extra}: transformers {seen}\n  order {extra}: zrun {z}", flush=True)
        C.report(f"the rows in the order transformers' Trainer reads them ({extra or 'seed'})", rc == 0 and z == seen,
                 text[-300:])


if __name__ == "__main__":
    C.one_process_world()
    for part in (part1, part3, part2, part4, part5):
        try:
            part()
        except Exception as e:  # noqa: BLE001 (the check reports what failed)
            C.report(f"{part.__name__} ran", False, repr(e)[:600])
    print(f"{C.failed} failed", flush=True)
