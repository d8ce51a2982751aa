#!/usr/bin/env python3
"""zr.Trainer next to transformers' Trainer over a matrix of TrainingArguments (schedules, warm-up, accumulation,
clipping, weight decay, optimizers, label smoothing, epochs and max_steps, evaluation and saving strategies,
logging options, random sampling, rows of one token): from the same weights on the same rows, each logged step's loss, learning
rate, gradient norm and epoch, each evaluation's loss, the checkpoints left in output_dir and the final
train_loss must agree; a resume whose recorded best checkpoint was deleted must go on as transformers' does. A tiny Llama in float32 on the CPU (torch 2.11, transformers 5.17: tests/golden/reference.sh).

usage: python3 tests/golden/check_trainer_matrix.py OUT_DIR [ZRUN]     (prints PASS/FAIL lines)
"""
import json
import os
import shutil
import sys
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_torch_files as C  # noqa: E402 (its OUT and ZRUN come from the same argv)

warnings.filterwarnings("ignore")
N, T = 40, 12
ONE_TOKEN = "one_token_rows"  # (a case's mark, not an argument: some of its training rows cut to their first token)

BASE = {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 1, "num_train_epochs": 2, "learning_rate": 3e-3,
        "logging_steps": 1, "save_strategy": "no", "seed": 5}
CASES = [c for c in [
    ("defaults (linear, random order)", {}),
    ("cosine, warmup_steps 3, accumulation 2", {"lr_scheduler_type": "cosine", "warmup_steps": 3, "gradient_accumulation_steps": 2}),
    ("cosine_with_restarts (2 cycles)", {"lr_scheduler_type": "cosine_with_restarts", "lr_scheduler_kwargs": {"num_cycles": 2}}),
    ("polynomial power 2, lr_end 1e-4", {"lr_scheduler_type": "polynomial", "lr_scheduler_kwargs": {"power": 2.0, "lr_end": 1e-4},
                                         "warmup_steps": 2}),
    ("constant_with_warmup, warmup_steps 0.25 (a ratio)", {"lr_scheduler_type": "constant_with_warmup", "warmup_steps": 0.25}),
    ("inverse_sqrt", {"lr_scheduler_type": "inverse_sqrt", "warmup_steps": 4}),
    ("cosine_with_min_lr (min_lr_rate 0.1)", {"lr_scheduler_type": "cosine_with_min_lr", "lr_scheduler_kwargs": {"min_lr_rate": 0.1}}),
    ("warmup_stable_decay", {"lr_scheduler_type": "warmup_stable_decay", "warmup_steps": 2,
                             "lr_scheduler_kwargs": {"num_decay_steps": 6, "num_stable_steps": 8}}),
    ("weight_decay 0.1, max_grad_norm 0.5, betas and eps", {"weight_decay": 0.1, "max_grad_norm": 0.5, "adam_beta1": 0.8,
                                                            "adam_beta2": 0.95, "adam_epsilon": 1e-6}),
    ("no clipping (max_grad_norm 0)", {"max_grad_norm": 0.0}),
    ("optim sgd", {"optim": "sgd", "learning_rate": 0.3}),
    ("optim adagrad", {"optim": "adagrad", "learning_rate": 1e-2}),
    ("label_smoothing_factor 0.1", {"label_smoothing_factor": 0.1}),
    ("max_steps 13 past the epochs, logging_steps 3, logging_first_step", {"max_steps": 13, "logging_steps": 3,
                                                                           "logging_first_step": True}),
    ("num_train_epochs 1.5, accumulation 3", {"num_train_epochs": 1.5, "gradient_accumulation_steps": 3}),
    ("eval and save every 4 steps, save_total_limit 2, best by eval_loss", {
        "eval_strategy": "steps", "eval_steps": 4, "save_strategy": "steps", "save_steps": 4, "save_total_limit": 2,
        "load_best_model_at_end": True, "metric_for_best_model": "eval_loss"}),
    ("eval and save by epoch, 3 epochs, save_total_limit 1", {"eval_strategy": "epoch", "save_strategy": "epoch",
                                                             "num_train_epochs": 3, "save_total_limit": 1}),
    ("data_seed 11, dataloader_drop_last, batch 3", {"data_seed": 11, "dataloader_drop_last": True,
                                                    "per_device_train_batch_size": 3}),
    ("save_strategy best by eval_loss, eval every 3 steps", {"eval_strategy": "steps", "eval_steps": 3,
                                                             "save_strategy": "best", "metric_for_best_model": "eval_loss"}),
    ("eval_on_start, logging by epoch, eval by epoch with eval_delay 1", {
        "eval_on_start": True, "logging_strategy": "epoch", "eval_strategy": "epoch", "eval_delay": 1}),
    ("load_best_model_at_end with save_total_limit 1, eval and save every 5 steps", {
        "eval_strategy": "steps", "eval_steps": 5, "save_strategy": "steps", "save_steps": 5, "save_total_limit": 1,
        "load_best_model_at_end": True}),
    ("metric_for_best_model \"loss\" (read as eval_loss), load_best, save_total_limit 2", {
        "eval_strategy": "steps", "eval_steps": 4, "save_strategy": "steps", "save_steps": 4,
        "metric_for_best_model": "loss", "load_best_model_at_end": True, "save_total_limit": 2}),
    # (ONE_TOKEN: rows of one token, an empty text with its BOS, that predict nothing: micro-batches of them only)
    ("one-token rows, micro-batch 1, accumulation 2", {"per_device_train_batch_size": 1, "gradient_accumulation_steps": 2,
                                                       "num_train_epochs": 1, ONE_TOKEN: True}),
    ("one-token rows, micro-batch 1, logging_steps 3", {"per_device_train_batch_size": 1, "num_train_epochs": 1,
                                                        "logging_steps": 3, ONE_TOKEN: True}),
] if not os.environ.get("CHECK_ONLY") or os.environ["CHECK_ONLY"] in c[0]]


def rows(seed, vary):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(N):
        n = T - (i * 5) % 7 if vary else T
        out.append([int(x) for x in torch.randint(0, 96, (n,), generator=g)])
    return out


class Rows(torch.utils.data.Dataset):
    """Rows of token ids as a torch Dataset: {"input_ids": list} for pad() below, or with tensors=True tensors of
    input_ids and labels for transformers' default collator."""
    def __init__(self, r, tensors=False):
        self.r, self.tensors = r, tensors

    def __len__(self):
        return len(self.r)

    def __getitem__(self, i):
        if self.tensors:
            return {"input_ids": torch.tensor(self.r[i]), "labels": torch.tensor(self.r[i])}
        return {"input_ids": self.r[i]}


def pad(batch):
    t = max(len(x["input_ids"]) for x in batch)
    ids = torch.zeros(len(batch), t, dtype=torch.long)
    lab = torch.full((len(batch), t), -100, dtype=torch.long)
    mask = torch.zeros(len(batch), t, dtype=torch.long)
    for k, x in enumerate(batch):
        n = len(x["input_ids"])
        ids[k, :n] = lab[k, :n] = torch.tensor(x["input_ids"])
        mask[k, :n] = 1
    return {"input_ids": ids, "labels": lab, "attention_mask": mask}


def lua(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {lua(x)}" for k, x in v.items()) + " }"
    return json.dumps(v)


def trainer_lua(init, train, args, out_dir, evalr=None, extra=""):
    """Lua that builds `tr`, a zr.Trainer on the weights in init (float32), the rows train (and evalr) padded by the
    collator these checks give transformers (labels kept where a token equals the pad), with the arguments args."""
    largs = ", ".join(f"{a} = {lua(v)}" for a, v in sorted(args.items()))
    ev = f"\n  eval_dataset = ds(cjson.decode('{json.dumps(evalr)}'))," if evalr else ""
    return f"""
local zr = require "zrun"
local cjson = require "cjson"
local function ds(r) local o = {{}}; for i, x in ipairs(r) do o[i] = {{ input_ids = x }} end; return o end
local tr = zr.Trainer {{ model = zr.models.llama.from_pretrained("{init}", {{ dtype = "f32" }}),
  train_dataset = ds(cjson.decode('{json.dumps(train)}')),{ev}
  data_collator = zr.datasets.causal_lm_collator {{ pad_token_id = 0, mask_pad_token = false }},
  args = {{ output_dir = "{out_dir}", {largs}{extra} }} }}
"""


def close(a, b, rel, absol=1e-12):
    return a is not None and b is not None and abs(a - b) <= rel * abs(b) + absol


RESUMES = [
    ("random order, accumulation 2, cosine with warm-up, checkpoint mid-epoch",
     {"gradient_accumulation_steps": 2, "lr_scheduler_type": "cosine", "warmup_steps": 2, "num_train_epochs": 3}, 7, None),
    ("the same under a DeepSpeed ZeRO-2 file of autos", {"gradient_accumulation_steps": 2, "lr_scheduler_type": "cosine",
                                                          "warmup_steps": 2, "num_train_epochs": 3}, 7,
     {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
      "zero_optimization": {"stage": 2}, "bf16": {"enabled": False}}),
]


def resumes():
    """transformers trains with a checkpoint mid-epoch; zr.Trainer resumes from that checkpoint (transformers' own
    files: model, optimizer.pt or DeepSpeed's global_step folder, scheduler.pt, rng_state.pth, trainer_state.json) and
    must log the steps after it as transformers' uninterrupted run logged them."""
    from transformers import Trainer, TrainingArguments
    for k, (name, extra, at, ds) in enumerate(RESUMES):
        if os.environ.get("CHECK_ONLY") and os.environ["CHECK_ONLY"] not in name:
            continue
        args = dict(BASE, **extra, save_strategy="steps", save_steps=at)
        train = rows(100 + k, True)
        m = C.tiny_llama(50 + k)
        init = f"{C.OUT}/rinit{k}"
        m.save_pretrained(init)
        out = f"{C.OUT}/r{k}_hf"
        shutil.rmtree(out, ignore_errors=True)
        ds_path = None
        if ds:
            ds_path = f"{C.OUT}/r{k}_ds.json"
            with open(ds_path, "w") as f:
                json.dump(ds, f)
        tr = Trainer(model=m, args=TrainingArguments(output_dir=out, report_to=[], use_cpu=True, deepspeed=ds_path, **args),
                     train_dataset=Rows(train), data_collator=pad)
        tr.train()
        hf_logs = [(h["step"], h["loss"], h["learning_rate"], h.get("grad_norm")) for h in tr.state.log_history
                   if "loss" in h and h["step"] > at]
        dsl = f', deepspeed = "{ds_path}"' if ds_path else ""
        rc, text = C.zrun_lua(trainer_lua(init, train, args, f"{C.OUT}/r{k}_zrun", extra=dsl) + f"""
tr:train {{ resume_from_checkpoint = "{out}/checkpoint-{at}" }}
for _, h in ipairs(tr.state.log_history) do
  if h.loss and h.step > {at} then print(string.format("LOG %d %.17g %.17g %.17g", h.step, h.loss, h.learning_rate,
    h.grad_norm or -1)) end
end
""")
        z = [(int(p[1]), float(p[2]), float(p[3]), float(p[4])) for p in (x.split() for x in text.splitlines())
             if p and p[0] == "LOG"]
        ok = rc == 0 and [a[0] for a in z] == [b[0] for b in hf_logs] and all(
            close(a[1], b[1], 2e-5) and close(a[2], b[2], 1e-9, 1e-15) and close(a[3], b[3], 2e-3)
            for a, b in zip(z, hf_logs))
        if not ok or os.environ.get("CHECK_VERBOSE"):
            print(f"  resume {name}: transformers {[(b[0], round(b[1], 6)) for b in hf_logs]}\n"
                  f"  resume {name}: zrun {[(a[0], round(a[1], 6)) for a in z]}", flush=True)
        C.report(f"zr.Trainer resumes transformers' checkpoint-{at} and logs its next steps: {name}", ok, text[-400:])


def best_gone():
    """A run resumed from its own checkpoint whose recorded best checkpoint was deleted (to save space, or the
    checkpoint copied to another machine): transformers drops best_model_checkpoint with a warning and trains on,
    load_best_model_at_end loading nothing; zr.Trainer must do the same (it failed after the last step)."""
    from transformers import Trainer, TrainingArguments
    args = dict(BASE, eval_strategy="steps", eval_steps=5, save_strategy="steps", save_steps=5, learning_rate=1e-2,
                load_best_model_at_end=True)  # (the eval loss rises after step 10 at this rate)
    train, evalr = rows(300, False), rows(301, False)[:8]
    init = f"{C.OUT}/binit"
    C.tiny_llama(60).save_pretrained(init)
    out, zout = f"{C.OUT}/bg_hf", f"{C.OUT}/bg_zrun"
    got = {}
    for side in ("hf", "zrun"):
        d = out if side == "hf" else zout
        shutil.rmtree(d, ignore_errors=True)
        for attempt in (0, 1):
            if side == "hf":
                from transformers import LlamaForCausalLM
                tr = Trainer(model=LlamaForCausalLM.from_pretrained(init), args=TrainingArguments(
                    output_dir=d, report_to=[], use_cpu=True, disable_tqdm=True, **args),
                    train_dataset=Rows(train), eval_dataset=Rows(evalr), data_collator=pad)
                tr.train(resume_from_checkpoint=d + "/checkpoint-15" if attempt else None)
                res = (tr.state.global_step, tr.state.best_global_step, tr.state.best_model_checkpoint)
                rc = 0
            else:
                rc, text = C.zrun_lua(trainer_lua(init, train, args, d, evalr) + f"""
tr:train {{ resume_from_checkpoint = {json.dumps(d + "/checkpoint-15") if attempt else "false"} }}
print("RES " .. tr.state.global_step .. " " .. tostring(tr.state.best_global_step) .. " " .. tostring(tr.state.best_model_checkpoint))
""")
                line = [x.split() for x in text.splitlines() if x.startswith("RES ")]
                res = (int(line[0][1]), int(line[0][2]), None if line[0][3] == "nil" else line[0][3]) if line else text[-300:]
            if attempt == 0:  # the best (before step 15) and the checkpoint after the one resumed go
                best = json.load(open(f"{d}/checkpoint-15/trainer_state.json"))["best_model_checkpoint"]
                if best and not best.endswith("/checkpoint-15"):
                    shutil.rmtree(best)
                shutil.rmtree(f"{d}/checkpoint-20")
        st = json.load(open(f"{d}/checkpoint-20/trainer_state.json")) if os.path.isdir(f"{d}/checkpoint-20") else {}
        got[side] = (rc, res, st.get("best_model_checkpoint"), st.get("best_global_step"),
                     sorted(x for x in os.listdir(d) if x.startswith("checkpoint-")))
    ok = got["hf"][1:] == got["zrun"][1:] and got["zrun"][0] == 0 and got["hf"][1][0] == 20 and got["hf"][1][1] < 15 and got["hf"][1][2] is None
    C.report("a resume whose recorded best checkpoint is gone drops it and trains on, as transformers does", ok,
             f"transformers {got['hf']} zrun {got['zrun']}")


def main():
    from transformers import Trainer, TrainingArguments
    os.makedirs(C.OUT, exist_ok=True)
    for k, (name, extra) in enumerate(CASES):
        args = dict(BASE, **extra)
        one_token = args.pop(ONE_TOKEN, False)
        vary = k % 2 == 1  # (every other case pads rows of varying length)
        train, evalr = rows(2 * k, vary), rows(2 * k + 1, vary)[:8]
        if one_token:  # (transformers trains through them: their micro-batches count no token)
            train = [r[:1] if i % 5 in (0, 3) else r for i, r in enumerate(train)]
        m = C.tiny_llama(k)
        init = f"{C.OUT}/minit{k}"
        m.save_pretrained(init)
        out = f"{C.OUT}/m{k}_hf"
        shutil.rmtree(out, ignore_errors=True)
        tr = Trainer(model=m, args=TrainingArguments(output_dir=out, report_to=[], use_cpu=True, **args),
                     train_dataset=Rows(train), eval_dataset=Rows(evalr), data_collator=pad)
        res = tr.train()
        hf_logs = [(h["step"], h["loss"], h["learning_rate"], h.get("grad_norm"), h["epoch"])
                   for h in tr.state.log_history if "loss" in h]
        hf_evals = [(h["step"], h["eval_loss"]) for h in tr.state.log_history if "eval_loss" in h]
        hf_ckpts = sorted(d for d in os.listdir(out) if d.startswith("checkpoint-")) if os.path.isdir(out) else []
        zout = f"{C.OUT}/m{k}_zrun"
        shutil.rmtree(zout, ignore_errors=True)
        rc, text = C.zrun_lua(trainer_lua(init, train, args, zout, evalr) + """
local r = tr:train()
for _, h in ipairs(tr.state.log_history) do
  if h.loss then print(string.format("LOG %d %.17g %.17g %s %.17g", h.step, h.loss, h.learning_rate,
    h.grad_norm and string.format("%.17g", h.grad_norm) or "nil", h.epoch)) end
  if h.eval_loss then print(string.format("EVAL %d %.17g", h.step, h.eval_loss)) end
end
print(string.format("TRAIN_LOSS %.17g", r.metrics.train_loss))
""")
        z_logs, z_evals, z_train = [], [], None
        for line in text.splitlines():
            p = line.split()
            if p and p[0] == "LOG":
                z_logs.append((int(p[1]), float(p[2]), float(p[3]), None if p[4] == "nil" else float(p[4]), float(p[5])))
            elif p and p[0] == "EVAL":
                z_evals.append((int(p[1]), float(p[2])))
            elif p and p[0] == "TRAIN_LOSS":
                z_train = float(p[1])
        z_ckpts = sorted(d for d in os.listdir(zout) if d.startswith("checkpoint-")) if os.path.isdir(zout) else []
        bad = []
        if rc != 0:
            bad.append("zrun failed: " + text[-300:])
        if [s[0] for s in z_logs] != [s[0] for s in hf_logs]:
            bad.append(f"logged steps zrun {[s[0] for s in z_logs]} transformers {[s[0] for s in hf_logs]}")
        for a, b in zip(z_logs, hf_logs):
            if not close(a[1], b[1], 2e-5):
                bad.append(f"step {b[0]} loss zrun {a[1]} transformers {b[1]}")
            if not close(a[2], b[2], 1e-9, 1e-15):
                bad.append(f"step {b[0]} learning_rate zrun {a[2]} transformers {b[2]}")
            if (a[3] is None) != (b[3] is None) or (b[3] is not None and not close(a[3], b[3], 2e-3)):
                bad.append(f"step {b[0]} grad_norm zrun {a[3]} transformers {b[3]}")
            if not close(a[4], b[4], 1e-9):
                bad.append(f"step {b[0]} epoch zrun {a[4]} transformers {b[4]}")
        if [e[0] for e in z_evals] != [e[0] for e in hf_evals] or not all(
                close(a[1], b[1], 2e-5) for a, b in zip(z_evals, hf_evals)):
            bad.append(f"evaluations zrun {z_evals} transformers {hf_evals}")
        if z_ckpts != hf_ckpts:
            bad.append(f"checkpoints left zrun {z_ckpts} transformers {hf_ckpts}")
        if not close(z_train, res.training_loss, 2e-5):
            bad.append(f"train_loss zrun {z_train} transformers {res.training_loss}")
        C.report(f"zr.Trainer = transformers' Trainer: {name}", not bad, "; ".join(bad[:4]))
        if bad and os.environ.get("CHECK_VERBOSE"):
            for a, b in zip(z_logs, hf_logs):
                print(f"    step {b[0]}: loss {a[1]:.9f} / {b[1]:.9f} ({(a[1] - b[1]) / b[1]:+.2e}), "
                      f"grad_norm {a[3]} / {b[3]}", flush=True)
    if not os.environ.get("CHECK_ONLY") or os.environ["CHECK_ONLY"] in "best checkpoint gone":
        best_gone()
    resumes()  # (last: a DeepSpeed run leaves accelerate's state in DeepSpeed's mode for the process)
    print(f"{C.failed} failed", flush=True)
    sys.exit(1 if C.failed else 0)


if __name__ == "__main__":
    C.one_process_world()
    main()
