#!/usr/bin/env python3
"""Checks zrun's reading of torch.save files and DeepSpeed checkpoints against the real torch and
DeepSpeed, where they are installed (the GPU machine, or the CPU through tests/golden/reference.sh; run from the repo root after `make`):

  1. torch.load reads tests/golden/torch_files (written by make_torch_files.py without torch) to
     the values the tests expect: the emulated format is torch's.
  2. Files written by the real torch.save (zip and the pre-1.6 format) and by transformers'
     save_pretrained(safe_serialization=False) (sharded pytorch_model-*.bin), read by zrun, equal
     the same tensors written as safetensors.
  3. A real DeepSpeed engine (a tiny random Llama, bf16 and fp32, ZeRO-2 and ZeRO-3, on this process's
     GPU, or on every GPU under `deepspeed --num_gpus N`) trains 3 steps and saves a checkpoint:
     `zrun zero-to-fp32` equals DeepSpeed's get_fp32_state_dict_from_zero_checkpoint exactly, and
     a zrun engine that loads the checkpoint continues with the losses DeepSpeed's next 3 steps
     have (the same batches; relative tolerance 1e-4 in fp32, 1e-2 in bf16: different kernels).
  4. transformers' Trainer saves a checkpoint (DeepSpeed ZeRO-2 bf16 inside, or none: optimizer.pt) and
     zr.Trainer resumes it with the losses the HF run logged after it.
  5. (a figure, not a check) the load time of a 1B bf16 model from pytorch_model.bin next to
     model.safetensors, zrun's and transformers'.

usage: python3 tests/golden/check_torch_files.py OUT_DIR [ZRUN]     (prints PASS/FAIL lines)
"""
import json
import os
import subprocess
import sys

import torch

OUT = sys.argv[1] if len(sys.argv) > 1 else "/tmp/torch_check"
ZRUN = sys.argv[2] if len(sys.argv) > 2 else "./zrun"
GOLD = "tests/golden/torch_files"
os.makedirs(OUT, exist_ok=True)
failed = 0


def report(name, ok, detail=""):
    global failed
    if torch.distributed.is_initialized() and torch.distributed.get_rank() != 0:
        return
    print(("PASS " if ok else "FAIL ") + name + ("" if ok else ": " + detail), flush=True)
    failed += 0 if ok else 1


def free_port():
    """A TCP port nothing listens on now (the system picks it): checks run beside other jobs."""
    import socket
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        return sk.getsockname()[1]


def one_process_world(port=None):
    """The environment of one process that is its own world (torch.distributed, and DeepSpeed, which otherwise
    looks for MPI): what is already set stays; the port, a free one unless given."""
    for k, v in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"), ("LOCAL_WORLD_SIZE", "1"),
                 ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", str(port or free_port()))):
        os.environ.setdefault(k, v)


def printed_losses(text):
    """What a zrun recipe printed: [(step, loss)] of its `step N/M | loss X` lines and [loss] of its
    `[zrun] eval at step` lines."""
    logs = [(int(x.split()[1].split("/")[0]), float(x.split("| loss ")[1].split()[0])) for x in text.splitlines()
            if x.startswith("step ") and "| loss" in x]
    evals = [float(x.split("loss ")[1].split()[0]) for x in text.splitlines() if x.startswith("[zrun] eval at step")]
    return logs, evals


def zrun_lua(code):
    path = os.path.join(OUT, "check.lua")
    with open(path, "w") as f:
        f.write(code)
    r = subprocess.run([ZRUN, path], capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


def compare_in_zrun(name, load_expr, ref_path, ref_dtype="f32"):
    """zrun loads a state dict (load_expr, Lua) and compares it with the safetensors file ref_path
    (its values rounded to ref_dtype first: a file saved in bf16 from the same fp32 weights)."""
    rc, out = zrun_lua(f"""
local zr = require "zrun"
local sd = {load_expr}
local ref = zr.load_safetensors("{ref_path}")
local n = 0
for k, v in pairs(ref) do
  n = n + 1
  assert(sd[k], "missing " .. k)
  local d = (sd[k]:to({{dtype = "f32"}}) - v:to({{dtype = "{ref_dtype}"}}):to({{dtype = "f32"}})):abs():max():item()
  assert(d == 0, k .. " differs by " .. d)
end
print("OK", n)
""")
    report(name, rc == 0 and "OK" in out, out[-600:])


def zrun_train(model_expr, load_line, batches, bf16, stage):
    """A zrun engine (AdamW lr 1e-3, the stage, bf16 or fp32) on model_expr (Lua), after load_line,
    trains on the batches; prints each loss."""
    return zrun_lua(f"""
local zr = require "zrun"
local cjson = require "cjson"
local m = {model_expr}
local engine = zr.initialize{{ model = m, config = {{ train_micro_batch_size_per_gpu = 2, bf16 = {{ enabled = {'true' if bf16 else 'false'} }},
  optimizer = {{ type = "AdamW", params = {{ lr = 1e-3, weight_decay = 0.0 }} }}, zero_optimization = {{ stage = {stage} }} }} }}
{load_line}
for _, b in ipairs(cjson.decode('{json.dumps([b.tolist() for b in batches])}')) do
  local t = zr.tensor(b, {{ dtype = "i64" }})
  local loss = engine(t, t).loss
  io.write(string.format("%.6f ", loss:item()))
  engine:backward(loss)
  engine:step()
end
print()
""")


def part1():
    import enum
    import types
    from safetensors.torch import load_file
    # values.pt's made-up IntEnum (deepspeed.runtime.zero.config.Color): give it a class to rebuild
    try:
        import deepspeed.runtime.zero.config as zc
    except ImportError:
        for name in ("deepspeed", "deepspeed.runtime", "deepspeed.runtime.zero", "deepspeed.runtime.zero.config",
                     "deepspeed.runtime.fp16", "deepspeed.runtime.fp16.loss_scaler"):
            sys.modules.setdefault(name, types.ModuleType(name))
        zc = sys.modules["deepspeed.runtime.zero.config"]
        sys.modules["deepspeed.runtime.fp16.loss_scaler"].DynamicLossScaler = type("DynamicLossScaler", (), {})
    zc.Color = enum.IntEnum("Color", {"red": 1, "blue": 3})
    zc.Color.__module__ = "deepspeed.runtime.zero.config"
    obj = torch.load(f"{GOLD}/values.pt", weights_only=False)
    ok = (obj["none"] is None and obj["text"] == "héllo ✓" and obj["raw"] == b"\x00\xff\x80abc"
          and list(obj["order"].keys()) == ["z", "a", "m", "b"] and obj["whole"].tolist()[1] == [4, 5, 6, 7]
          and obj["row1"].tolist() == [4, 5, 6, 7] and obj["column"].tolist() == [1, 5, 9]
          and obj["bf16"].dtype == torch.bfloat16 and obj["same"] is obj["whole"])
    report("torch.load reads the emulated values.pt", ok, repr(obj)[:400])
    leg = torch.load(f"{GOLD}/values_legacy.pt", weights_only=False)
    report("torch.load reads the emulated legacy file", leg["transposed"].tolist() == obj["transposed"].tolist())
    for d in ("llama_micro_bin", "llama_micro_sharded"):
        ref = load_file(f"{GOLD}/{d}/reference.safetensors")
        import glob
        sd = {}
        for p in sorted(glob.glob(f"{GOLD}/{d}/pytorch_model*.bin")):
            sd.update(torch.load(p, weights_only=True))
        ok = all(torch.equal(sd[k].float(), v) for k, v in ref.items())
        report(f"torch.load reads the emulated {d}", ok)
    for c in ("ds_zero2", "ds_zero2_aligned", "ds_zero3"):
        try:
            from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
            sd = get_fp32_state_dict_from_zero_checkpoint(f"{GOLD}/{c}")
            ref = load_file(f"{GOLD}/{c}/reference.safetensors")
            ok = all(torch.equal(sd[k].contiguous().float(), v) for k, v in ref.items() if k in sd)
            report(f"DeepSpeed's zero_to_fp32 reads the emulated {c}", ok and len(sd) >= len(ref) - 1)
        except Exception as e:  # noqa: BLE001 (the check reports what failed)
            report(f"DeepSpeed's zero_to_fp32 reads the emulated {c}", False, repr(e)[:400])


def tiny_llama(seed=0):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64)
    return LlamaForCausalLM(cfg)


def part2():
    from safetensors.torch import save_file
    m = tiny_llama()
    sd = {k: v.contiguous() for k, v in m.state_dict().items()}
    save_file(sd, f"{OUT}/ref.safetensors")
    torch.save(sd, f"{OUT}/zip.pt")
    torch.save(sd, f"{OUT}/legacy.pt", _use_new_zipfile_serialization=False)
    torch.save({k: v.bfloat16() for k, v in sd.items()}, f"{OUT}/bf16.pt")
    for f in ("zip.pt", "legacy.pt", "bf16.pt"):
        compare_in_zrun(f"zrun reads torch.save's {f}",
                        f'(function() local tf = require "zrun.torch_file"; local v = tf.open_state_dict("{OUT}/{f}"); '
                        f'local t = {{}}; for _, k in ipairs(v:keys()) do t[k] = v:get(k) end; return t end)()',
                        f"{OUT}/ref.safetensors", "bf16" if f == "bf16.pt" else "f32")
    d = f"{OUT}/hf_bin"
    m.save_pretrained(d, safe_serialization=False, max_shard_size="100KB")
    compare_in_zrun("zrun's from_pretrained reads save_pretrained(safe_serialization=False) shards",
                    f'(function() local m = require("zrun").models.llama.from_pretrained("{d}"); local t = {{}}; '
                    f'for k, p in m:named_parameters() do t[k] = p end; return t end)()', f"{OUT}/ref.safetensors")


def part3():
    import deepspeed
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    from safetensors.torch import save_file
    # (stage 0: no ZeRO; in bf16 DeepSpeed wraps its FusedAdam in FP16_Optimizer, in fp32 saves the optimizer's
    # own state; stage 1 in bf16 with fp32 gradient accumulation: BF16_Optimizer)
    for stage, bf16, acc32 in ((2, True, False), (3, True, False), (2, False, False), (3, False, False),
                               (0, True, False), (0, False, False), (1, True, True)):
        m = tiny_llama(1)
        tag = f"{stage}{'bf16' if bf16 else 'fp32'}{'acc32' if acc32 else ''}"
        m.save_pretrained(f"{OUT}/init{tag}")  # (zrun trains the same weights from the start: a reference curve)
        cfg = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "bf16": {"enabled": bf16},
               "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.0}},
               "zero_optimization": {"stage": stage}, "steps_per_print": 1000}
        if acc32:
            cfg["data_types"] = {"grad_accum_dtype": "fp32"}
        eng, _, _, _ = deepspeed.initialize(model=m, model_parameters=m.parameters(), config=cfg)
        g = torch.Generator().manual_seed(5)
        batches = [torch.randint(0, 96, (2, 16), generator=g) for _ in range(6)]
        before = []
        with open(f"{OUT}/batches{tag}.json", "w") as f:  # (to replay the run elsewhere, with the checkpoint)
            json.dump([b.tolist() for b in batches], f)
        for b in batches[:3]:
            b = b.to(eng.device)
            loss = eng(input_ids=b, labels=b).loss
            before.append(float(loss.detach()))
            eng.backward(loss)
            eng.step()
        print(f"deepspeed {tag}: {type(eng.optimizer).__name__}", flush=True)
        ck = f"{OUT}/ds_stage{tag}"
        eng.save_checkpoint(ck)
        after = []
        for b in batches[3:]:
            b = b.to(eng.device)
            loss = eng(input_ids=b, labels=b).loss
            after.append(float(loss.detach()))
            eng.backward(loss)
            eng.step()
        if torch.distributed.get_rank() == 0:
            subprocess.run([ZRUN, "zero-to-fp32", ck, f"{OUT}/zrun{tag}.safetensors"], check=False)
            print(f"  files: {sorted(os.listdir(f'{ck}/global_step3'))}", flush=True)
            if stage > 0 and not acc32:
                sd = get_fp32_state_dict_from_zero_checkpoint(ck)
                save_file({k: v.contiguous().float() for k, v in sd.items()}, f"{OUT}/ds{tag}_ref.safetensors")
                compare_in_zrun(f"zrun zero-to-fp32 equals DeepSpeed's on a real ZeRO-{stage} checkpoint ({tag})",
                                f'require("zrun").load_safetensors("{OUT}/zrun{tag}.safetensors")',
                                f"{OUT}/ds{tag}_ref.safetensors")
            else:  # zero_to_fp32.py reads neither checkpoints without ZeRO nor BF16_Optimizer's: the master, rounded,
                # is the saved module
                ms = torch.load(f"{ck}/global_step3/mp_rank_00_model_states.pt", weights_only=False)
                mod, opt = ms["module"], ms["optimizer"]
                save_file({k: v.contiguous().float() for k, v in mod.items()}, f"{OUT}/ds{tag}_ref.safetensors")
                compare_in_zrun(f"zrun zero-to-fp32 of a real checkpoint without ZeRO ({tag}), rounded to the module's "
                                f"dtype, is its module",
                                f'(function() local t = require("zrun").load_safetensors("{OUT}/zrun{tag}.safetensors"); '
                                f'for k, v in pairs(t) do t[k] = v:to({{ dtype = "{"bf16" if bf16 else "f32"}" }}) end; '
                                f'return t end)()', f"{OUT}/ds{tag}_ref.safetensors")
                if bf16 and isinstance(opt, dict) and "fp32_groups_flat" in opt:  # the master itself
                    flat = torch.cat([t.float().flatten() for t in opt["fp32_groups_flat"]])
                    rc, out = zrun_lua(f"""
local zr = require "zrun"
local t = zr.load_safetensors("{OUT}/zrun{tag}.safetensors")
local m = zr.models.llama.LlamaForCausalLM(zr.models.llama.config("{OUT}/init{tag}"))
local s = 0
for k, p in m:named_parameters() do s = s + t[k]:to({{ dtype = "f64" }}):sum():item() end
print(string.format("SUM %.9e", s))
""")
                    got = [float(x.split()[1]) for x in out.splitlines() if x.startswith("SUM")]
                    want = float(flat.double().sum())
                    report(f"zrun's fp32 master of FP16_Optimizer's checkpoint ({tag}) sums as fp32_groups_flat",
                           bool(got) and abs(got[0] - want) <= 1e-9 * max(1.0, abs(want)), f"{got} vs {want}: {out[-300:]}")
            m.config.save_pretrained(f"{OUT}/cfg{tag}")
            # the same checkpoint made universal by DeepSpeed's ds_to_universal.py, loaded by tag below
            uc = subprocess.run([sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder",
                                 f"{ck}/global_step3", "--output_folder", f"{ck}/global_step3_universal"]
                                + (["--inject_missing_state"] if stage <= 2 else []),
                                capture_output=True, text=True) if stage > 0 else None
            # zrun from the same initial weights through all six batches: how far zrun's own kernels and
            # optimizer stray from DeepSpeed's in this precision (the tolerance below is judged against it)
            rc, out = zrun_train(f'zr.models.llama.from_pretrained("{OUT}/init{tag}", {{ dtype = "f32" }})', "", batches,
                                 bf16, stage)
            print(f"  {tag} deepspeed {[round(x, 6) for x in before + after]}\n  {tag} zrun from the start {out.strip()[-200:]}",
                  flush=True)
            for load_tag in (["nil"] + (['"global_step3_universal"'] if uc and uc.returncode == 0 else [])):
              rc, out = zrun_train(f'zr.models.llama.LlamaForCausalLM(zr.models.llama.config("{OUT}/cfg{tag}"))',
                                   f'engine:load_checkpoint("{ck}", {load_tag})', batches[3:], bf16, stage)
              got = [float(x) for x in out.split()[-3:]] if rc == 0 else []
              print(f"  {tag} zrun resumed {got}", flush=True)
              tol = 1e-2 if bf16 else 1e-4
              ok = len(got) == 3 and all(abs(a - b) <= tol * abs(b) for a, b in zip(got, after))
              what = "universal " if load_tag != "nil" else ""
              report(f"zrun continues a real ZeRO-{stage} run ({tag}) from its {what}checkpoint with DeepSpeed's losses",
                     ok, f"zrun {got} deepspeed {after}: {out[-400:]}")
            if uc and uc.returncode != 0:
                report(f"ds_to_universal.py on the ZeRO-{stage} checkpoint ({tag})", False, uc.stderr[-400:])


def part4():
    """Load time of a 1B bf16 model from pytorch_model.bin next to model.safetensors (the same
    tensors), zrun's from_pretrained to cuda, warm page cache; and transformers' for the .bin."""
    import time
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg_path = ".gpu/llama32_1b_config.json"
    if not os.path.exists(cfg_path):
        return
    cfg = LlamaConfig.from_pretrained(cfg_path)
    cfg.torch_dtype = torch.bfloat16
    with torch.device("cuda"):
        m = LlamaForCausalLM(cfg).to(torch.bfloat16)
    for name, safe in (("st", True), ("bin", False)):
        d = f"{OUT}/big_{name}"
        m.save_pretrained(d, safe_serialization=safe, max_shard_size="100GB")
    del m
    rows = []
    for name in ("st", "bin"):
        d = f"{OUT}/big_{name}"
        rc, out = zrun_lua(f"""
local zr = require "zrun"
local best = math.huge
for _ = 1, 3 do
  local t0 = zr._C.now and zr._C.now() or os.clock()
  local m = zr.models.llama.from_pretrained("{d}", {{ dtype = "bf16", device = "cuda" }})
  zr.cuda.synchronize()
  local t = (zr._C.now and zr._C.now() or os.clock()) - t0
  if t < best then best = t end
  m = nil; collectgarbage()
end
print(string.format("TIME %.3f", best))
""")
        t = [float(x.split()[1]) for x in out.splitlines() if x.startswith("TIME")]
        rows.append((name, t[0] if t else None, out[-300:] if not t else ""))
    best = None
    for _ in range(3):
        t0 = time.perf_counter()
        hm = LlamaForCausalLM.from_pretrained(f"{OUT}/big_bin", dtype=torch.bfloat16, device_map="cuda")
        torch.cuda.synchronize()
        best = min(best or 1e9, time.perf_counter() - t0)
        del hm
    print(f"| load 1B bf16 to cuda | zrun model.safetensors {rows[0][1]} s | zrun pytorch_model.bin {rows[1][1]} s "
          f"| transformers pytorch_model.bin {best:.3f} s |", rows[0][2], rows[1][2], flush=True)


def part5():
    """transformers' Trainer (a tiny Llama; every row the same, so the data order does not matter; linear
    schedule; a loss logged every step) saves checkpoint-3 of 6 steps with DeepSpeed ZeRO-2 bf16 inside, and
    again without DeepSpeed in fp32 (optimizer.pt); zr.Trainer resumes each and logs steps 4-6 with the
    losses the HF run logged (relative tolerance 1e-2 in bf16, 1e-3 in fp32; HF rounds them to 4 digits)."""
    from transformers import Trainer, TrainingArguments
    row = [int(x) for x in torch.randint(0, 96, (16,), generator=torch.Generator().manual_seed(9))]

    class Rows(torch.utils.data.Dataset):
        def __len__(self):
            return 64

        def __getitem__(self, i):
            return {"input_ids": torch.tensor(row), "labels": torch.tensor(row)}
    ds_cfg = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
              "gradient_clipping": "auto", "bf16": {"enabled": "auto"}, "zero_optimization": {"stage": 2},
              "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto"}}}
    for name, bf16, ds in (("hf_ds_zero2_bf16", True, ds_cfg), ("hf_plain_fp32", False, None)):
        out = f"{OUT}/{name}"
        m = tiny_llama(3)
        m.config.save_pretrained(f"{OUT}/cfg_{name}")
        args = TrainingArguments(output_dir=out, per_device_train_batch_size=2, max_steps=6, learning_rate=1e-3,
                                 weight_decay=0.0, logging_steps=1, save_steps=3, bf16=bf16, deepspeed=ds,
                                 report_to=[], lr_scheduler_type="linear", warmup_steps=0, save_only_model=False,
                                 use_cpu=not torch.cuda.is_available())  # (a CPU venv serves too)
        tr = Trainer(model=m, args=args, train_dataset=Rows())
        tr.train()
        hf = {h["step"]: h["loss"] for h in tr.state.log_history if "loss" in h}
        dsl = "" if ds is None else (', deepspeed = { train_micro_batch_size_per_gpu = "auto", gradient_accumulation_steps = '
                                     '"auto", gradient_clipping = "auto", bf16 = { enabled = "auto" }, zero_optimization = '
                                     '{ stage = 2 }, optimizer = { type = "AdamW", params = { lr = "auto", weight_decay = "auto" } } }')
        rc, text = zrun_lua(f"""
local zr = require "zrun"
local rows = {{}}
for i = 1, 64 do rows[i] = {{ input_ids = {{ {", ".join(map(str, row))} }} }} end
local m = zr.models.llama.LlamaForCausalLM(zr.models.llama.config("{OUT}/cfg_{name}"))
local tr = zr.Trainer {{ model = m, train_dataset = zr.datasets.Dataset.from_rows(rows), args = {{ output_dir = "{out}_zrun",
  per_device_train_batch_size = 2, max_steps = 6, learning_rate = 1e-3, weight_decay = 0.0, logging_steps = 1,
  save_strategy = "no", bf16 = {'true' if bf16 else 'false'}, lr_scheduler_type = "linear"{dsl} }} }}
tr:train {{ resume_from_checkpoint = "{out}/checkpoint-3" }}
for _, h in ipairs(tr.state.log_history) do
  if h.loss then print(string.format("STEP %d %.6f", h.step, h.loss)) end
end
""")
        got = {int(x.split()[1]): float(x.split()[2]) for x in text.splitlines() if x.startswith("STEP")}
        print(f"  {name}: transformers {hf}\n  {name}: zrun resumed {got}", flush=True)
        tol = 1e-2 if bf16 else 1e-3
        ok = rc == 0 and all(k in got and abs(got[k] - hf[k]) <= tol * abs(hf[k]) + 1e-4 for k in (4, 5, 6))
        report(f"zr.Trainer resumes a real transformers Trainer checkpoint ({name}) with its losses", ok, text[-500:])


if __name__ == "__main__":
    # (CHECK_NO_FIGURE=1 leaves out part4's figure, which takes a minute)
    for part in (part1, part2, part3, part5) + (() if os.environ.get("CHECK_NO_FIGURE") else (part4,)):
        try:
            if part is part3 and not torch.distributed.is_initialized():
                one_process_world()
            part()
        except Exception as e:  # noqa: BLE001
            report(part.__name__, False, repr(e)[:600])
    print(f"{failed} failed")
    sys.exit(1 if failed else 0)
