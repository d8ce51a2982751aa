#!/usr/bin/env python3
"""zrun's engine next to DeepSpeed 0.19.8's over a matrix of DeepSpeed configs (optimizers and their parameters,
every scheduler DeepSpeed ships,  clipping, accumulation through train_batch_size, ZeRO stages 0-3, the fp16 loss
scaler): deepspeed.initialize and zr.initialize on the same file, the same weights and the same batches; every
micro-step's loss, and after every optimizer step the learning rate(s) and the global gradient norm must agree.
A tiny Llama on the CPU (DeepSpeed's CPU accelerator, one process: tests/golden/reference.sh).

usage: python3 tests/golden/check_ds_matrix.py OUT_DIR [ZRUN]     (prints PASS/FAIL lines)
"""
import json
import os
import sys
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_torch_files as C  # noqa: E402 (its OUT and ZRUN come from the same argv)

warnings.filterwarnings("ignore")
STEPS = 8
BASE = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "steps_per_print": 1000,
        "optimizer": {"type": "AdamW", "params": {"lr": 2e-3, "weight_decay": 0.01}}, "zero_optimization": {"stage": 2}}
WLR = {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 2e-3, "warmup_num_steps": 3}}
CASES = [
    ("AdamW, ZeRO-2 (clipping at DeepSpeed's default 1.0)", {}),
    ("Adam (adam_w_mode default) with betas, eps, weight_decay, ZeRO-1",
     {"optimizer": {"type": "Adam", "params": {"lr": 1e-3, "betas": [0.8, 0.95], "eps": 1e-6, "weight_decay": 0.1}},
      "zero_optimization": {"stage": 1}}),
    ("WarmupLR, log warm-up", {"scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 1e-5, "warmup_max_lr": 2e-3,
                                                                            "warmup_num_steps": 4, "warmup_type": "log"}}}),
    ("WarmupLR linear, no clipping", dict(scheduler=WLR, gradient_clipping=0.0)),
    ("WarmupDecayLR", {"scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 2e-3,
                                                                         "warmup_num_steps": 2, "total_num_steps": 8}}}),
    ("WarmupCosineLR", {"scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 8, "warmup_num_steps": 2,
                                                                           "warmup_min_ratio": 0.1, "cos_min_ratio": 0.01}}}),
    ("OneCycle (learning rate cycle and decay)",
     {"scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 1e-4, "cycle_max_lr": 2e-3, "cycle_first_step_size": 3,
                                                   "cycle_momentum": False, "decay_step_size": 2, "decay_lr_rate": 0.1}}}),
    ("OneCycle with its momentum cycle (beta1 0.85-0.95, beta2 pinned at 0.99)",
     {"scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 1e-4, "cycle_max_lr": 2e-3, "cycle_first_step_size": 3,
                                                   "cycle_momentum": True, "cycle_min_mom": 0.85, "cycle_max_mom": 0.95,
                                                   "decay_step_size": 2, "decay_lr_rate": 0.1, "decay_mom_rate": 0.05}}}),
    ("LRRangeTest", {"scheduler": {"type": "LRRangeTest", "params": {"lr_range_test_min_lr": 1e-4,
                                                                     "lr_range_test_step_size": 2,
                                                                     "lr_range_test_step_rate": 1.5,
                                                                     "lr_range_test_staircase": True}}}),
    ("accumulation from train_batch_size 8 (4 micro-steps a step), clipping 0.3",
     {"train_batch_size": 8, "gradient_accumulation_steps": None, "gradient_clipping": 0.3}),
    ("ZeRO-3, WarmupLR", dict(scheduler=WLR, zero_optimization={"stage": 3})),
    ("no ZeRO (stage 0), fp32", {"zero_optimization": {"stage": 0}}),
    ("ZeRO-2, optimizer offloaded to the CPU (DeepSpeedCPUAdam)",
     {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}),
    ("ZeRO-3, parameters and optimizer offloaded, WarmupLR", dict(scheduler=WLR, zero_optimization={
        "stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}})),
    ("SGD with momentum (zero_allow_untested_optimizer)",
     {"optimizer": {"type": "SGD", "params": {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.001}},
      "zero_allow_untested_optimizer": True}),
    ("fp16 at ZeRO-2: loss scale 2^8 initial, window 2", {"fp16": {"enabled": True, "initial_scale_power": 8,
                                                                   "loss_scale_window": 2, "hysteresis": 1}}),
    ("bf16 at ZeRO-2", {"bf16": {"enabled": True}}),
]


def main():
    import deepspeed
    os.makedirs(C.OUT, exist_ok=True)
    g = torch.Generator().manual_seed(7)
    batches = [torch.randint(0, 96, (2, 16), generator=g) for _ in range(4 * STEPS)]
    for k, (name, extra) in enumerate(CASES):
        if os.environ.get("CHECK_ONLY") and os.environ["CHECK_ONLY"] not in name:
            continue
        cfg = dict(BASE)
        cfg.update(extra)
        cfg = {a: v for a, v in cfg.items() if v is not None}  # (None: the key left out, DeepSpeed derives it)
        gas = 4 if cfg.get("train_batch_size") == 8 else 1
        path = f"{C.OUT}/dsm{k}.json"
        with open(path, "w") as f:
            json.dump(cfg, f)
        m = C.tiny_llama(k)
        init = f"{C.OUT}/dsm_init{k}"
        m.save_pretrained(init)
        half = cfg.get("fp16", {}).get("enabled") or cfg.get("bf16", {}).get("enabled")
        ds_cfg = json.loads(json.dumps(cfg))
        try:
            eng, _, _, _ = deepspeed.initialize(model=m, model_parameters=m.parameters(), config=ds_cfg)
            ds_loss, ds_steps = [], []
            for i, b in enumerate(batches[:gas * STEPS]):
                b = b.to(eng.device)
                loss = eng(input_ids=b, labels=b).loss
                ds_loss.append(float(loss.detach()))
                eng.backward(loss)
                eng.step()
                if (i + 1) % gas == 0:
                    gn = eng.get_global_grad_norm()
                    ds_steps.append(([float(x) for x in eng.get_lr()], None if gn is None else float(gn),
                                     int(eng.skipped_steps)))
        except Exception as e:  # noqa: BLE001 (the check reports what DeepSpeed said)
            C.report(f"DeepSpeed and zrun, {name}", False, "DeepSpeed: " + repr(e)[:300])
            continue
        rc, text = C.zrun_lua(f"""
local zr = require "zrun"
local cjson = require "cjson"
local m = zr.models.llama.from_pretrained("{init}", {{ dtype = "f32" }})
local engine = zr.initialize {{ model = m, config = "{path}" }}
for i, b in ipairs(cjson.decode('{json.dumps([b.tolist() for b in batches[:gas * STEPS]])}')) do
  local t = zr.tensor(b, {{ dtype = "i64" }})
  local loss = engine(t, t).loss
  print(string.format("LOSS %.17g", loss:item()))
  engine:backward(loss)
  engine:step()
  if i % {gas} == 0 then
    local lrs = {{}}
    for j, v in ipairs(engine:get_lr()) do lrs[j] = string.format("%.17g", v) end
    print(string.format("STEP %s %s %d", table.concat(lrs, ","), tostring(engine:get_global_grad_norm()),
      engine.skipped_steps or 0))
  end
end
""")
        z_loss = [float(x.split()[1]) for x in text.splitlines() if x.startswith("LOSS ")]
        z_steps = []
        for x in text.splitlines():
            if x.startswith("STEP "):
                p = x.split()
                z_steps.append(([float(v) for v in p[1].split(",")], None if p[2] == "nil" else float(p[2]), int(p[3])))
        tol = 2e-3 if half else 2e-5
        bad = [] if rc == 0 else ["zrun failed: " + text[-300:]]
        if len(z_loss) != len(ds_loss) or not all(abs(a - b) <= tol * abs(b) for a, b in zip(z_loss, ds_loss)):
            bad.append(f"losses zrun {[round(x, 6) for x in z_loss]} DeepSpeed {[round(x, 6) for x in ds_loss]}")
        for s, (a, b) in enumerate(zip(z_steps, ds_steps)):
            lr_ok = len(a[0]) >= 1 and all(abs(x - y) <= 1e-9 * abs(y) + 1e-15 for x, y in zip(a[0], b[0]))
            gn_ok = (b[1] is None) or (a[1] is not None and (a[1] == b[1] or abs(a[1] - b[1]) <= (2e-2 if half else 2e-4) * abs(b[1])))
            if not (lr_ok and gn_ok and a[2] == b[2]):
                bad.append(f"step {s + 1}: lr {a[0]} vs {b[0]}, grad norm {a[1]} vs {b[1]}, skipped {a[2]} vs {b[2]}")
        if len(z_steps) != len(ds_steps):
            bad.append(f"{len(z_steps)} optimizer steps against {len(ds_steps)}")
        C.report(f"DeepSpeed and zrun, {name}", not bad, "; ".join(bad[:3]))
    print(f"{C.failed} failed", flush=True)
    sys.exit(1 if C.failed else 0)


if __name__ == "__main__":
    C.one_process_world()
    main()
