#!/usr/bin/env python3
"""zr.Trainer on 2 MPI ranks next to transformers' Trainer on 2 torchrun processes (gloo, the CPU): the same weights,
rows of varying length in transformers' random order dealt to the processes as accelerate deals them, the token
counts of a step summed over the processes (average_tokens_across_devices), gradient accumulation, an epoch whose
last round of micro-batches is short: each logged step's loss, learning rate, gradient norm and epoch, and the
evaluation loss. Float32 (torch 2.11, transformers 5.17: tests/golden/reference.sh).
Also, on the golden llama_tiny and rows in order (make_trainer_golden.py): the final train_loss of each process where
steps follow the last log, an evaluation with dataloader_drop_last, and TRL 1.10's SFTTrainer's training metrics
(num_tokens, mean_token_accuracy, entropy) where an epoch's last round is completed and its evaluations' batch statistics (tests/mpi/trainer_check.lua holds these
values: modes train_loss, hf_eval and sft_eval).

usage: python3 tests/golden/check_trainer_ranks.py OUT_DIR [ZRUN]     (launches both itself; PASS/FAIL lines)
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_torch_files as C  # noqa: E402 (its OUT and ZRUN come from the same argv)
import check_trainer_matrix as M  # noqa: E402 (rows, the collator, the comparisons)

ARGS = {"per_device_train_batch_size": 3, "gradient_accumulation_steps": 2, "num_train_epochs": 2, "learning_rate": 3e-3,
        "logging_steps": 1, "save_strategy": "no", "seed": 9, "eval_strategy": "epoch", "per_device_eval_batch_size": 8,
        "lr_scheduler_type": "cosine", "warmup_steps": 2}
N_TRAIN = 37  # (not a multiple of 2 ranks x 3 rows: the last round is completed from the first rows)


def hf_side():
    """Under torchrun: transformers' Trainer on this process's share; rank 0 writes the logs."""
    from transformers import Trainer, TrainingArguments
    train = M.rows(1, True)[:N_TRAIN]
    evalr = M.rows(2, True)[:16]
    m = M.C.tiny_llama(3)
    tr = Trainer(model=m, args=TrainingArguments(output_dir=f"{C.OUT}/ranks_hf", report_to=[], use_cpu=True,
                                                 ddp_backend="gloo", **ARGS),
                 train_dataset=M.Rows(train), eval_dataset=M.Rows(evalr), data_collator=M.pad)
    tr.train()
    if int(os.environ.get("RANK", "0")) == 0:
        with open(f"{C.OUT}/ranks_hf.json", "w") as f:
            json.dump(tr.state.log_history, f)


DS = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
      "zero_optimization": {"stage": 2}}
DS_ARGS = {"per_device_train_batch_size": 2, "max_steps": 6, "save_steps": 3, "logging_steps": 1, "seed": 4}


def hf_ds_side():
    """Under torchrun: transformers' Trainer + DeepSpeed ZeRO-2 on 2 processes, a checkpoint at step 3."""
    from transformers import Trainer, TrainingArguments
    m = M.C.tiny_llama(6)
    tr = Trainer(model=m, args=TrainingArguments(output_dir=f"{C.OUT}/ds2_hf", report_to=[], use_cpu=True,
                                                 deepspeed=f"{C.OUT}/ds2.json", ddp_backend="gloo", **DS_ARGS),
                 train_dataset=M.Rows(M.rows(3, True)), data_collator=M.pad)
    tr.train()
    if int(os.environ.get("RANK", "0")) == 0:
        with open(f"{C.OUT}/ds2_hf.json", "w") as f:
            json.dump(tr.state.log_history, f)


# train_loss: micro-batch 2, one epoch or max_steps 5 (transformers adds each process's own loss after the last log)
TL_CASES = [("max_steps 5, logging_steps 2", {"max_steps": 5, "logging_steps": 2}),
            ("logging_strategy no", {"logging_strategy": "no"}),
            ("logging_strategy no, average_tokens_across_devices false",
             {"logging_strategy": "no", "average_tokens_across_devices": False})]
# TRL: trained on the first 13 rows (13 mod (2 x 2) = 1: the step reading an epoch's last micro-batch keeps process 0's
# metrics), and on all 18 for 6 steps, then evaluated on the first n rows in batches of bs
SFT_TRAIN = {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 2, "num_train_epochs": 3,
             "learning_rate": 5e-3, "logging_steps": 1, "lr_scheduler_type": "constant", "seed": 0}
SFT_EVAL_TRAIN = {"per_device_train_batch_size": 2, "max_steps": 6, "learning_rate": 5e-3, "logging_steps": 1,
                  "lr_scheduler_type": "constant", "seed": 0}
SFT_EVALS = [(7, 3), (13, 4), (3, 4), (9, 2), (5, 1)]
TOK = os.path.join(os.environ.get("ZRUN_TEST_DATA", "../shared/data"), "tokenizers/tinyllama-1.1b-chat-v1.0")


def golden_model():
    """make_trainer_golden's llama_tiny (float32, eager attention) and its 18 rows."""
    import make_trainer_golden as G
    with tempfile.TemporaryDirectory() as d:
        with open("tests/golden/llama_tiny.config.json") as f:
            cfg = json.load(f)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f)
        shutil.copy("tests/golden/llama_tiny.safetensors", d)
        return G.model(d), G.rows()


def golden_side():
    """Under torchrun: transformers' train_loss of each process (TL_CASES) and an evaluate() with dataloader_drop_last,
    then TRL's SFTTrainer (SFT_TRAIN's logs, SFT_EVALS' evaluations); rank 0 writes them."""
    import torch
    import torch.distributed as dist
    import make_trainer_golden as G
    from transformers import Trainer, TrainingArguments
    out = {"train_loss": {}}
    for name, kw in TL_CASES:
        m, rs = golden_model()
        with tempfile.TemporaryDirectory() as od:
            args = dict(output_dir=od, per_device_train_batch_size=2, num_train_epochs=1, learning_rate=5e-3,
                        lr_scheduler_type="linear", warmup_steps=2, weight_decay=0.1, max_grad_norm=1.0, save_strategy="no",
                        report_to=[], use_cpu=True, seed=0, remove_unused_columns=False, ddp_backend="gloo", **kw)
            tr = G.InOrder(model=m, args=TrainingArguments(**args), train_dataset=G.Rows(rs), data_collator=G.Collate())
            tr.mb_losses = []
            every = [None] * dist.get_world_size()
            dist.all_gather_object(every, tr.train().training_loss)
        out["train_loss"][name] = every
    m, rs = golden_model()  # evaluate() with dataloader_drop_last: 13 rows in batches of 4, the last round dropped
    with tempfile.TemporaryDirectory() as od:
        args = TrainingArguments(output_dir=od, report_to=[], use_cpu=True, per_device_eval_batch_size=4,
                                 dataloader_drop_last=True, remove_unused_columns=False, ddp_backend="gloo")
        tr = Trainer(model=m, args=args, eval_dataset=G.Rows(rs[:13]), data_collator=G.Collate())
        out["eval_drop_last"] = tr.evaluate()["eval_loss"]
    if os.path.isdir(TOK):
        from datasets import Dataset
        from transformers import AutoTokenizer
        from trl import SFTConfig, SFTTrainer

        class InOrder(SFTTrainer):
            def _get_train_sampler(self, *a, **k):
                return torch.utils.data.SequentialSampler(self.train_dataset)

        def sft(n_rows, kw, od):
            m, rs = golden_model()
            cfg = SFTConfig(output_dir=od, report_to="none", bf16=False, use_cpu=True, save_strategy="no",
                            ddp_backend="gloo", **kw)
            tr = InOrder(model=m, args=cfg, train_dataset=Dataset.from_list([{"input_ids": r} for r in rs[:n_rows]]),
                         processing_class=AutoTokenizer.from_pretrained(TOK))
            tr.train()
            return tr, rs
        with tempfile.TemporaryDirectory() as od:
            tr, _ = sft(13, SFT_TRAIN, od)
            out["sft_logs"] = [[h["step"], h["loss"], h["num_tokens"], h["mean_token_accuracy"], h["entropy"]]
                               for h in tr.state.log_history if "loss" in h]
            tr, rs = sft(18, SFT_EVAL_TRAIN, od)
            out["sft_evals"] = []
            for n, bs in SFT_EVALS:
                tr.args.per_device_eval_batch_size = bs
                r = tr.evaluate(eval_dataset=Dataset.from_list([{"input_ids": x} for x in rs[:n]]))
                out["sft_evals"].append([n, bs, r["eval_mean_token_accuracy"], r["eval_entropy"]])
    if dist.get_rank() == 0:
        with open(f"{C.OUT}/golden_ranks.json", "w") as f:
            json.dump(out, f)


def zrun_2ranks(env, script):
    """script on 2 zrun ranks: under mpirun where there is one, else joined over TCP as torchrun starts them;
    (exit status, both ranks' output)."""
    if shutil.which("mpirun"):
        r = subprocess.run(["mpirun", "-np", "2", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", C.ZRUN,
                            script], env=env, capture_output=True, text=True)
        return r.returncode, r.stdout + r.stderr
    port = str(C.free_port())
    ps = [subprocess.Popen([C.ZRUN, script], env=dict(env, RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r),
                                                       LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=port),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(2)]
    outs = [p.communicate()[0] for p in ps]
    return max(p.returncode for p in ps), "".join(outs)


def golden_ranks(env):
    """golden_side on 2 torchrun processes next to zrun on 2 ranks: train_loss of each rank, SFTTrainer's metrics."""
    if torchrun(env, "golden", "transformers' and TRL's golden runs") is None:
        return
    with open(f"{C.OUT}/golden_ranks.json") as f:
        ref = json.load(f)
    script = f"{C.OUT}/golden_ranks.lua"
    with open(script, "w") as f:
        f.write(f"""
local zr = require "zrun"
local cjson = require "cjson"
local TG = dofile("tests/lua/trainer_golden.lua")
local g = TG.load("trainer_epochs_2ranks.json")
local rank = zr.dist.rank()
for _, c in ipairs(cjson.decode('{json.dumps([[n, kw] for n, kw in TL_CASES])}')) do
  local a = TG.args(g, {{ per_device_train_batch_size = 2, gradient_accumulation_steps = 1, num_train_epochs = 1,
    max_steps = -1 }}, "{C.OUT}/golden_tl")
  for k, v in pairs(c[2]) do a[k] = v end
  local t = zr.Trainer {{ model = g.model(), train_dataset = g.dataset,
    data_collator = zr.datasets.causal_lm_collator {{ pad_token_id = g.pad }}, args = a }}
  local both = zr.tensor({{ 0, 0 }}, {{ dtype = "f64" }}) -- (each rank's, printed by rank 0: lines of two ranks interleave)
  both[rank + 1] = t:train().train_loss
  zr.dist.all_reduce(both, "sum")
  if rank == 0 then print(string.format("TL %.17g %.17g %s", both[1], both[2], c[1])) end
end
local rows = {{}}
for i, r in ipairs(g.rows) do rows[i] = {{ input_ids = r }} end
local ev = {{}}
for i = 1, 13 do ev[i] = rows[i] end
local r = zr.Trainer {{ model = g.model(), data_collator = zr.datasets.causal_lm_collator {{ pad_token_id = g.pad }},
  args = {{ output_dir = "{C.OUT}/golden_ev", per_device_eval_batch_size = 4, dataloader_drop_last = true }} }}:evaluate(
  zr.datasets.Dataset.from_rows(ev))
if rank == 0 then print(string.format("EVDROP %.17g", r.eval_loss)) end
local function sft(n, kw)
  local a = cjson.decode(kw)
  a.output_dir, a.bf16, a.save_strategy, a.train_sampling_strategy = "{C.OUT}/golden_sft", false, "no", "sequential"
  local first = {{}}
  for i = 1, n do first[i] = rows[i] end
  local t = zr.SFTTrainer {{ model = g.model(), processing_class = zr.tokenizers.ByteTokenizer.new(),
    train_dataset = zr.datasets.Dataset.from_rows(first), args = a }}
  t:train()
  return t
end
local t = sft(13, '{json.dumps(SFT_TRAIN)}')
for _, h in ipairs(t.state.log_history) do
  if h.loss and rank == 0 then
    print(string.format("SFTLOG %d %.17g %d %.17g %.17g", h.step, h.loss, h.num_tokens, h.mean_token_accuracy, h.entropy))
  end
end
t = sft(18, '{json.dumps(SFT_EVAL_TRAIN)}')
for _, c in ipairs(cjson.decode('{json.dumps(SFT_EVALS)}')) do
  local ev = {{}}
  for i = 1, c[1] do ev[i] = rows[i] end
  t.args.per_device_eval_batch_size = c[2]
  local r = t:evaluate(zr.datasets.Dataset.from_rows(ev))
  if rank == 0 then
    print(string.format("SFTEVAL %d %d %.17g %.17g", c[1], c[2], r.eval_mean_token_accuracy, r.eval_entropy))
  end
end
""")
    rc, out = zrun_2ranks(env, script)
    lines = [x.split() for x in out.splitlines()]
    tl = {}
    for p in lines:
        if p and p[0] == "TL":
            tl[" ".join(p[3:])] = [float(p[1]), float(p[2])]
    for name, _ in TL_CASES:
        got, want = tl.get(name), ref["train_loss"][name]
        print(f"  train_loss ({name}): transformers' processes {want}, zrun's ranks {got}", flush=True)
        C.report(f"train_loss on 2 ranks ({name}): each rank's own, as transformers' processes", rc == 0 and got is not None
                 and all(M.close(a, b, 2e-6) for a, b in zip(got, want)), out[-400:])
    ev = [float(p[1]) for p in lines if p and p[0] == "EVDROP"]
    print(f"  evaluate() with dataloader_drop_last: transformers {ref['eval_drop_last']}, zrun {ev}", flush=True)
    C.report("evaluate() with dataloader_drop_last on 2 ranks reads the rows transformers' does (its eval_loss)",
             rc == 0 and len(ev) == 1 and M.close(ev[0], ref["eval_drop_last"], 1e-6), out[-400:])
    if "sft_logs" not in ref:
        print(f"SKIP TRL's SFTTrainer on 2 processes: no tokenizer at {TOK} (set ZRUN_TEST_DATA)")
        return
    logs = [[int(p[1]), float(p[2]), int(p[3]), float(p[4]), float(p[5])] for p in lines if p and p[0] == "SFTLOG"]
    print(f"  SFT logs: TRL {ref['sft_logs']}\n  SFT logs: zrun {logs}", flush=True)
    C.report("SFTTrainer on 2 ranks logs TRL's loss, num_tokens, mean_token_accuracy and entropy (an epoch's last round "
             "completed)", rc == 0 and len(logs) == len(ref["sft_logs"]) and all(
                 a[0] == b[0] and M.close(a[1], b[1], 2e-5) and a[2] == b[2] and M.close(a[3], b[3], 1e-6, 1e-6)
                 and M.close(a[4], b[4], 1e-5) for a, b in zip(logs, ref["sft_logs"])), out[-400:])
    evals = [[int(p[1]), int(p[2]), float(p[3]), float(p[4])] for p in lines if p and p[0] == "SFTEVAL"]
    print(f"  SFT evaluations: TRL {ref['sft_evals']}\n  SFT evaluations: zrun {evals}", flush=True)
    C.report("SFTTrainer's evaluations on 2 ranks: TRL's eval_mean_token_accuracy and eval_entropy (batches dealt as "
             "accelerate deals them)", rc == 0 and len(evals) == len(ref["sft_evals"]) and all(
                 a[:2] == b[:2] and M.close(a[2], b[2], 1e-6, 1e-6) and M.close(a[3], b[3], 1e-5)
                 for a, b in zip(evals, ref["sft_evals"])), out[-400:])


def torchrun(env, side, what):
    """This file on 2 torchrun processes (side: "hf", "hf_ds" or "golden"); the log history rank 0 wrote (golden: True),
    or None (reported)."""
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                        str(C.free_port()),
                        os.path.abspath(__file__), C.OUT, C.ZRUN, side], env=env, capture_output=True, text=True)
    if r.returncode != 0:
        out = r.stdout + r.stderr
        # (the first lines that say why a process died, then the tail: torchrun's summary alone names only the signal)
        why = [l for l in out.splitlines() if any(k in l for k in ("Error", "error:", "what():", "terminate", "Abort",
                                                                   "Traceback", "Gloo", "gloo"))][:12]
        C.report(f"{what} on 2 torchrun processes ran", False, "\n".join(why) + "\n...\n" + out[-800:])
        return None
    if side == "golden":
        return True
    with open(f"{C.OUT}/{'ranks_hf' if side == 'hf' else 'ds2_hf'}.json") as f:
        return json.load(f)


def ds_resume(env):
    """transformers + DeepSpeed ZeRO-2 on 2 torchrun processes save checkpoint-3 (one optimizer shard a process);
    zr.Trainer resumes it on 2 MPI ranks, and on 1 rank with 2 micro-batches a step (the same rows a step: the
    checkpoint resharded), and logs steps 4-6 as transformers did."""
    with open(f"{C.OUT}/ds2.json", "w") as f:
        json.dump(DS, f)
    M.C.tiny_llama(6).save_pretrained(f"{C.OUT}/ds2_init")
    hist = torchrun(env, "hf_ds", "transformers + DeepSpeed")
    if hist is None:
        return
    hf = [(h["step"], h["loss"]) for h in hist if "loss" in h and h["step"] > 3]
    for ranks, gas in ((2, 1), (1, 2)):
        args = dict(DS_ARGS, gradient_accumulation_steps=gas)
        script = f"{C.OUT}/ds2_{ranks}.lua"
        with open(script, "w") as f:
            f.write(M.trainer_lua(f"{C.OUT}/ds2_init", M.rows(3, True), args, f"{C.OUT}/ds2_zrun{ranks}",
                                  extra=f', deepspeed = "{C.OUT}/ds2.json"') + f"""
tr:train {{ resume_from_checkpoint = "{C.OUT}/ds2_hf/checkpoint-3" }}
if zr.dist.rank() == 0 then
  for _, h in ipairs(tr.state.log_history) do
    if h.loss and h.step > 3 then print(string.format("LOG %d %.17g", h.step, h.loss)) end
  end
end
""")
        cmd = ["mpirun", "-np", "2", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", C.ZRUN, script] \
            if ranks == 2 else [C.ZRUN, script]
        z = subprocess.run(cmd, env=env, capture_output=True, text=True)
        got = [(int(p[1]), float(p[2])) for p in (x.split() for x in z.stdout.splitlines()) if p and p[0] == "LOG"]
        print(f"  resumed on {ranks} rank(s): transformers {[(a, round(b, 6)) for a, b in hf]}, zrun "
              f"{[(a, round(b, 6)) for a, b in got]}", flush=True)
        ok = z.returncode == 0 and [a for a, _ in got] == [a for a, _ in hf] and all(
            M.close(b, d, 2e-5) for (_, b), (_, d) in zip(got, hf))
        C.report(f"zr.Trainer on {ranks} rank(s) (accumulation {gas}) resumes transformers + DeepSpeed's 2-process "
                 "ZeRO-2 checkpoint with its losses", ok, (z.stdout + z.stderr)[-400:])


def main():
    os.makedirs(C.OUT, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                                           "MASTER_ADDR", "MASTER_PORT")}
    hist = torchrun(env, "hf", "transformers' Trainer")
    if hist is None:
        return
    hf_logs = [(h["step"], h["loss"], h["learning_rate"], h.get("grad_norm"), h["epoch"]) for h in hist if "loss" in h]
    hf_evals = [(h["step"], h["eval_loss"]) for h in hist if "eval_loss" in h]
    init = f"{C.OUT}/ranks_init"
    M.C.tiny_llama(3).save_pretrained(init)
    script = f"{C.OUT}/ranks.lua"
    with open(script, "w") as f:
        f.write(M.trainer_lua(init, M.rows(1, True)[:N_TRAIN], ARGS, f"{C.OUT}/ranks_zrun", M.rows(2, True)[:16]) + """
tr:train()
if zr.dist.rank() == 0 then
  for _, h in ipairs(tr.state.log_history) do
    if h.loss then print(string.format("LOG %d %.17g %.17g %.17g %.17g", h.step, h.loss, h.learning_rate, h.grad_norm, h.epoch)) end
    if h.eval_loss then print(string.format("EVAL %d %.17g", h.step, h.eval_loss)) end
  end
end
""")
    r = subprocess.run(["mpirun", "-np", "2", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", C.ZRUN, script],
                       env=env, capture_output=True, text=True)
    z_logs, z_evals = [], []
    for line in r.stdout.splitlines():
        p = line.split()
        if p and p[0] == "LOG":
            z_logs.append((int(p[1]), float(p[2]), float(p[3]), float(p[4]), float(p[5])))
        elif p and p[0] == "EVAL":
            z_evals.append((int(p[1]), float(p[2])))
    bad = [] if r.returncode == 0 else ["zrun failed: " + (r.stdout + r.stderr)[-400:]]
    if [a[0] for a in z_logs] != [b[0] for b in hf_logs]:
        bad.append(f"logged steps zrun {[a[0] for a in z_logs]} transformers {[b[0] for b in hf_logs]}")
    for a, b in zip(z_logs, hf_logs):
        if not (M.close(a[1], b[1], 2e-5) and M.close(a[2], b[2], 1e-9, 1e-15) and M.close(a[3], b[3], 2e-3)
                and M.close(a[4], b[4], 1e-9)):
            bad.append(f"step {b[0]}: zrun {a[1:]} transformers {b[1:]}")
    print(f"  2 ranks: transformers {[(b[0], round(b[1], 6)) for b in hf_logs]} evals {hf_evals}\n"
          f"  2 ranks: zrun {[(a[0], round(a[1], 6)) for a in z_logs]} evals {z_evals}", flush=True)
    C.report("zr.Trainer on 2 MPI ranks logs what transformers' Trainer logs on 2 torchrun processes", not bad,
             "; ".join(bad[:3]))
    # (evaluation: transformers averages its batches' mean losses, zrun the tokens': equal here only when each
    # process's evaluation rows form one batch, which per_device_eval_batch_size 8 with 16 rows on 2 ranks gives)
    C.report("the evaluation loss on 2 ranks, as transformers'", [e[0] for e in z_evals] == [e[0] for e in hf_evals]
             and all(M.close(a[1], b[1], 2e-5) for a, b in zip(z_evals, hf_evals)), f"zrun {z_evals} hf {hf_evals}")
    ds_resume(env)
    golden_ranks(env)
    print(f"{C.failed} failed", flush=True)
    sys.exit(1 if C.failed else 0)


if __name__ == "__main__":
    if len(sys.argv) > 3 and sys.argv[3] == "hf":
        hf_side()
    elif len(sys.argv) > 3 and sys.argv[3] == "hf_ds":
        hf_ds_side()
    elif len(sys.argv) > 3 and sys.argv[3] == "golden":
        golden_side()
    elif len(sys.argv) > 3 and sys.argv[3] == "golden_only":  # (just these checks: python3 ... OUT ZRUN golden_only)
        os.makedirs(C.OUT, exist_ok=True)
        golden_ranks({k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK",
                                                                      "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")})
        sys.exit(1 if C.failed else 0)
    else:
        main()
