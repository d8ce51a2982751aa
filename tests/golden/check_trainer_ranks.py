#!/usr/bin/env python3
"""zr.Trainer on 2 MPI ranks next to transformers' Trainer on 2 torchrun processes (gloo, the CPU): the same weights,
rows of varying length in transformers' random order dealt to the processes as accelerate deals them, the token
counts of a step summed over the processes (average_tokens_across_devices), gradient accumulation, an epoch whose
last round of micro-batches is short: each logged step's loss, learning rate, gradient norm and epoch, and the
evaluation loss. Float32 (torch 2.11, transformers 5.17: tests/golden/reference.sh).

usage: python3 tests/golden/check_trainer_ranks.py OUT_DIR [ZRUN]     (launches both itself; PASS/FAIL lines)
"""
import json
import os
import subprocess
import sys

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


def torchrun(env, side, what):
    """This file on 2 torchrun processes (side: "hf" or "hf_ds"); the log history rank 0 wrote, or None (reported)."""
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
    print(f"{C.failed} failed", flush=True)
    sys.exit(1 if C.failed else 0)


if __name__ == "__main__":
    if len(sys.argv) > 3 and sys.argv[3] == "hf":
        hf_side()
    elif len(sys.argv) > 3 and sys.argv[3] == "hf_ds":
        hf_ds_side()
    else:
        main()
