#!/usr/bin/env python3
"""Checks the DeepSpeed 0.19.8 defaults zrun follows against the real DeepSpeed (on the GPU machine, or the CPU through tests/golden/reference.sh,
from the repo root after `make`): a real engine and a zrun engine train a tiny random Llama from the
same weights on the same batches with the same config, and what each default decides must agree:

  1. WarmupLR without warmup_max_lr: every param group warms up to its own lr (DeepSpeed's None),
     the lrs of both runs equal at every step.
  2. gradient_clipping left out: clipped at 1.0 (losses within 1e-4 over 6 steps, fp32).
  3. torch_adam without weight_decay: torch.optim.AdamW's 0.01 (the weights' sum of squares after 6
     steps at lr 1e-2 nearer DeepSpeed's than zrun's with weight_decay 0 is, by 10x).
  4. fp16 without ZeRO (FP16_Optimizer: no hysteresis) and at stage 2 (DynamicLossScaler, hysteresis
     2): the loss scale after every step and the skipped steps equal. DeepSpeed 0.19.8's engine.backward
     does not scale the loss at stage 0 while FP16_Optimizer.step unscales the gradients (its PR #8393,
     open: updates cur_scale times too small); the check scales the loss as that fix does, and prints
     the unfixed run's losses beside it.
  5. bf16 and fp16: the parameters are cast, a floating buffer keeps its fp32 (and its value) unless
     data_types.buffer_dtype names a dtype (and keep_in_fp32_modules does not name the buffer), an integer
     buffer never changes.

usage: python3 tests/golden/check_ds_defaults.py OUT_DIR [ZRUN]     (prints PASS/FAIL lines)
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_torch_files as C  # noqa: E402 (its OUT and ZRUN come from the same argv)


def groups_of(m, norm_lr):
    """Two param groups by name, as the Lua side builds them: the norms at norm_lr, the rest at the
    optimizer's lr."""
    norm = [p for n, p in m.named_parameters() if "norm" in n]
    rest = [p for n, p in m.named_parameters() if "norm" not in n]
    return [{"params": rest}, {"params": norm, "lr": norm_lr}] if norm_lr else list(m.parameters())


def ds_run(cfg, tag, steps=6, norm_lr=None, fp16=False, scale_loss=False):
    """DeepSpeed trains tiny_llama(1) `steps` steps; returns per-step records and the init dir.
    scale_loss: the loss multiplied by the loss scale before engine.backward (PR #8393's stage-0 fix)."""
    import deepspeed
    m = C.tiny_llama(1)
    init = f"{C.OUT}/dinit_{tag}"
    m.save_pretrained(init)
    eng, _, _, _ = deepspeed.initialize(model=m, model_parameters=groups_of(m, norm_lr), config=cfg)
    g = torch.Generator().manual_seed(5)
    batches = [torch.randint(0, 96, (2, 16), generator=g) for _ in range(steps)]
    recs = []
    for b in batches:
        b = b.to(eng.device)
        loss = eng(input_ids=b, labels=b).loss
        eng.backward(loss.float() * eng.optimizer.loss_scale if scale_loss else loss)
        eng.step()
        scale = getattr(eng.optimizer, "loss_scale", None) if fp16 else None  # (FP16_Optimizer's and ZeRO's)
        recs.append({"loss": float(loss.detach().float()), "lr": [float(x) for x in eng.get_lr()],
                     "scale": float(scale) if scale is not None else None, "skipped": int(eng.skipped_steps)})
    sq = float(sum(p.detach().double().pow(2).sum() for p in m.parameters()))
    if fp16:  # the fp32 master is what the optimizer keeps; the module's fp16 copy rounds it
        sq = None
    return recs, init, batches, sq


def zrun_run(cfg, init, batches, norm_lr=None):
    groups = ""
    if norm_lr:
        groups = (f', model_parameters = {{ {{ params = rest }}, {{ params = norm, lr = {norm_lr} }} }}')
    rc, out = C.zrun_lua(f"""
local zr = require "zrun"
local cjson = require "cjson"
local m = zr.models.llama.from_pretrained("{init}", {{ dtype = "f32" }})
local norm, rest = {{}}, {{}}
for n, p in m:named_parameters() do if n:find("norm") then norm[#norm + 1] = p else rest[#rest + 1] = p end end
local e = zr.initialize{{ model = m, config = cjson.decode([[{json.dumps(cfg)}]]){groups} }}
local recs = {{}}
for _, b in ipairs(cjson.decode('{json.dumps([b.tolist() for b in batches])}')) do
  local t = zr.tensor(b, {{ dtype = "i64" }})
  local loss = e(t, t).loss
  e:backward(loss)
  e:step()
  recs[#recs + 1] = {{ loss = loss:to({{ dtype = "f32" }}):item(), lr = e:get_lr(), scale = e.scaler and e.scaler.scale or cjson.null,
    skipped = e.skipped_steps }}
end
local sq = 0
for _, p in ipairs(e:gather_parameters()) do local q = p:to({{ dtype = "f64" }}); sq = sq + (q * q):sum():item() end
print("JSON " .. cjson.encode({{ recs = recs, sq = sq }}))
""")
    for line in out.splitlines():
        if line.startswith("JSON "):
            return json.loads(line[5:]), out
    return None, out


def base(**kw):
    cfg = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.0}}}
    cfg.update(kw)
    return cfg


def close(a, b, rtol):
    return all(abs(x - y) <= rtol * max(abs(y), 1e-30) for x, y in zip(a, b)) and len(a) == len(b)


def main():
    # 1. WarmupLR without warmup_max_lr, two groups with their own lr
    cfg = base(optimizer={"type": "AdamW", "params": {"lr": 2e-3, "weight_decay": 0.0}},
               scheduler={"type": "WarmupLR", "params": {"warmup_num_steps": 4, "warmup_type": "linear"}})
    d, init, batches, _ = ds_run(cfg, "warmup", norm_lr=5e-3)
    z, out = zrun_run(cfg, init, batches, norm_lr=5e-3)
    ok = z is not None and all(close(r["lr"], q["lr"], 1e-12) for r, q in zip(z["recs"], d))
    C.report("WarmupLR without warmup_max_lr: each group warms to its own lr, as DeepSpeed's",
             ok, f"zrun {[r['lr'] for r in z['recs']] if z else out[-400:]} deepspeed {[r['lr'] for r in d]}")
    print(f"  lrs deepspeed {[r['lr'] for r in d]}", flush=True)

    # 2. gradient_clipping left out (1.0 in 0.19.8)
    cfg = base()
    d, init, batches, _ = ds_run(cfg, "clip")
    z, out = zrun_run(cfg, init, batches)
    zl, dl = ([r["loss"] for r in z["recs"]] if z else []), [r["loss"] for r in d]
    C.report("gradient_clipping left out: DeepSpeed's losses (clipped at 1.0)", close(zl, dl, 1e-4),
             f"zrun {zl} deepspeed {dl}: {out[-300:]}")

    # 3. torch_adam without weight_decay
    cfg = base(optimizer={"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}})
    d, init, batches, dsq = ds_run(cfg, "torch_adam")
    z, out = zrun_run(cfg, init, batches)
    cfg0 = base(optimizer={"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True, "weight_decay": 0.0}})
    z0, _ = zrun_run(cfg0, init, batches)
    ok = z is not None and z0 is not None and abs(z["sq"] - dsq) * 10 < abs(z0["sq"] - dsq)
    C.report("torch_adam without weight_decay: torch AdamW's 0.01, as DeepSpeed", ok,
             f"sum of squares zrun {z and z['sq']} (weight_decay 0: {z0 and z0['sq']}) deepspeed {dsq}: {out[-300:]}")
    print(f"  sum of squares: deepspeed {dsq}, zrun {z and z['sq']}, zrun with weight_decay 0 {z0 and z0['sq']}",
          flush=True)

    # 4. fp16 loss scaling: stage 0 (FP16_Optimizer) and stage 2 (DynamicLossScaler)
    for stage in (0, 2):
        cfg = base(fp16={"enabled": True, "initial_scale_power": 24, "hysteresis": 2, "loss_scale_window": 3},
                   zero_optimization={"stage": stage})
        if stage == 0:
            u, _, _, _ = ds_run(cfg, "fp16_0u", steps=10, fp16=True)
            print(f"  fp16 stage 0, DeepSpeed 0.19.8 as released (loss, scale, skipped): "
                  f"{[(round(r['loss'], 4), r['scale'], r['skipped']) for r in u]}", flush=True)
        d, init, batches, _ = ds_run(cfg, f"fp16_{stage}", steps=10, fp16=True, scale_loss=stage == 0)
        z, out = zrun_run(cfg, init, batches)
        zs = [(r["scale"], r["skipped"]) for r in z["recs"]] if z else out[-400:]
        ds = [(r["scale"], r["skipped"]) for r in d]
        C.report(f"fp16 at stage {stage}: the loss scale and skipped steps of every step, as DeepSpeed's", zs == ds,
                 f"zrun {zs} deepspeed {ds}")
        print(f"  fp16 stage {stage} (loss, scale, skipped): deepspeed "
              f"{[(round(r['loss'], 4), r['scale'], r['skipped']) for r in d]}, zrun "
              f"{[(round(r['loss'], 4), r['scale'], r['skipped']) for r in z['recs']] if z else None}", flush=True)
    buffers_check()
    print(f"{C.failed} failed", flush=True)


def buffers_check():
    """5. What the 16-bit cast does to buffers: a Linear beside an fp32 buffer 1 + 2^-12 (bf16 rounds it to 1), a
    submodule's fp32 routing bias and an int64 buffer, on both sides: every dtype and the fp32 buffer's value
    after initialize, with and without data_types.buffer_dtype and keep_in_fp32_modules."""
    import deepspeed

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)
            self.moe = torch.nn.Module()
            self.moe.register_buffer("e_score_correction_bias", torch.ones(4))
            self.register_buffer("scale", torch.full((4,), 1.0 + 2 ** -12))
            self.register_buffer("index", torch.tensor([1, 2]))

    names = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16", torch.int64: "i64"}
    for prec, data_types in (("bf16", None), ("fp16", None), ("bf16", {"buffer_dtype": "bf16"}),
                             ("bf16", {"buffer_dtype": "fp16", "keep_in_fp32_modules": ["e_score*"]})):
        cfg = {"train_micro_batch_size_per_gpu": 1, prec: {"enabled": True}, "zero_optimization": {"stage": 2},
               "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}
        if data_types:
            cfg["data_types"] = data_types
        m = M()
        deepspeed.initialize(model=m, model_parameters=m.parameters(), config=json.loads(json.dumps(cfg)))
        ds = [names[m.lin.weight.dtype], names[m.scale.dtype], float(m.scale.float().max()), names[m.index.dtype],
              names[m.moe.e_score_correction_bias.dtype]]
        rc, out = C.zrun_lua(f"""
local zr = require "zrun"
local cjson = require "cjson"
local m = zr.nn.Module()
m.lin = zr.nn.Linear(4, 4)
m.moe = zr.nn.Module()
m.moe:register_buffer("e_score_correction_bias", zr.ones(4))
m:register_buffer("scale", zr.ones(4) * (1 + 2 ^ -12))
m:register_buffer("index", zr.tensor({{ 1, 2 }}, {{ dtype = "i64" }}))
zr.initialize{{ model = m, config = cjson.decode([[{json.dumps(cfg)}]]) }}
print(string.format("BUF %s %s %.17g %s %s", m.lin.weight:dtype(), m.scale:dtype(), m.scale:to("f32"):max():item(),
  m.index:dtype(), m.moe.e_score_correction_bias:dtype()))
""")
        line = next((x.split()[1:] for x in out.splitlines() if x.startswith("BUF ")), None)
        z = line and [line[0], line[1], float(line[2]), line[3], line[4]]
        C.report(f"{prec}{' with data_types ' + json.dumps(data_types) if data_types else ''}: the parameters and "
                 "buffers in DeepSpeed's dtypes after initialize", z == ds, f"zrun {z or out[-300:]} deepspeed {ds}")


if __name__ == "__main__":
    C.one_process_world()
    main()
