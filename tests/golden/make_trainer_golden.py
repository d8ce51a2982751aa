"""Writes tests/golden/trainer_epochs.json: what Hugging Face's Trainer does at the end of an epoch
whose rows do not fill the last micro-batch or the last accumulation window, for
tests/lua/test_trainer_epochs.lua.

Run on a machine with torch + transformers 5 (the GPU machine; the runs themselves are on the CPU):
    python3 tests/golden/make_trainer_golden.py tests/golden
    python3 -m torch.distributed.run --nproc_per_node 2 tests/golden/make_trainer_golden.py tests/golden
The second writes trainer_epochs_2ranks.json: RANK_CASES on two processes (gloo), each case's micro-batches
one list a process, the logged loss (the mean over the processes, as HF logs it) per step.

The model is llama_tiny (tests/golden/llama_tiny.{config.json,safetensors}: make_golden.py's weights),
float32, eager attention. The data: 18 rows of 6 to 16 token ids (written into the file), taken in
order (a SequentialSampler), padded on the right by the collator with labels -100 at the pads, so a
micro-batch's share of a step's tokens is not its share of the rows. Each case is one Trainer run
from the same weights (AdamW, linear schedule with 2 warmup steps, clipping at 1.0, logging every
step); the file keeps, per optimizer step, the loss (the sum of its micro-batches' training_step
values: what HF logs, unrounded), grad_norm, learning_rate and epoch (the unrounded TrainerState.epoch),
the rows of every micro-batch in the order the Trainer read them (the collator also sees the one
accelerate's loader reads ahead at the end: cut), the final train_loss and how far the weights moved
(sum of squared differences from the start).
Also "dealt": how accelerate's BatchSamplerShard (what the Trainer's loader becomes on several processes;
even_batches, its default) deals the micro-batches of rows 0..n-1 to each process, with and without
drop_last, for a few row counts, micro-batch sizes and process counts.
"""
import json
import os
import shutil
import sys
import tempfile

import torch
from safetensors.torch import load_file
from torch.utils.data import Dataset, SequentialSampler
from transformers import (LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments)
import transformers

N_ROWS, VOCAB, PAD = 18, 259, 0


def rows():
    out, x = [], 12345
    for i in range(N_ROWS):
        n = 6 + (i * 7) % 11
        r = []
        for _ in range(n):
            x = (x * 1103515245 + 12345) % 2147483648
            r.append(3 + x % (VOCAB - 3))
        out.append(r)
    return out


class Rows(Dataset):
    def __init__(self, rs):
        self.rs = rs

    def __len__(self):
        return len(self.rs)

    def __getitem__(self, i):
        return {"idx": i, "input_ids": self.rs[i]}


class Collate:
    """Right padding, labels -100 at the pads (DataCollatorForLanguageModeling(mlm=False) with a pad
    id no row uses); records each micro-batch's rows."""

    def __init__(self):
        self.seen = []

    def __call__(self, feats):
        self.seen.append([f["idx"] for f in feats])
        T = max(len(f["input_ids"]) for f in feats)
        ids = torch.full((len(feats), T), PAD, dtype=torch.long)
        mask = torch.zeros((len(feats), T), dtype=torch.long)
        for k, f in enumerate(feats):
            ids[k, : len(f["input_ids"])] = torch.tensor(f["input_ids"])
            mask[k, : len(f["input_ids"])] = 1
        labels = ids.masked_fill(mask == 0, -100)
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}


class InOrder(Trainer):
    """Rows in order; keeps each micro-batch's loss as training_step returns it (what HF sums into
    tr_loss: the logged loss is that sum over a step, rounded to 4 digits in log_history)."""
    mb_losses = None

    def _get_train_sampler(self, *args, **kwargs):
        return SequentialSampler(self.train_dataset)

    def training_step(self, *args, **kwargs):
        loss = super().training_step(*args, **kwargs)
        self.mb_losses.append(float(loss))
        return loss


class Steps(TrainerCallback):
    """Per optimizer step: the unrounded TrainerState.epoch and how many micro-batches had run."""

    def __init__(self, trainer_ref):
        self.epochs, self.ends, self.ref = [], [], trainer_ref

    def on_step_end(self, args, state, control, **kw):
        self.epochs.append(state.epoch)
        self.ends.append(len(self.ref[0].mb_losses))


def model(golden_dir):
    cfg = LlamaConfig.from_pretrained(golden_dir, attn_implementation="eager")  # reads config.json
    m = LlamaForCausalLM(cfg)
    g = load_file(os.path.join(golden_dir, "llama_tiny.safetensors"))
    sd = m.state_dict()
    m.load_state_dict({k: g[k] for k in sd})
    return m.float()


CASES = [
    # name, per_device_train_batch_size, gradient_accumulation_steps, num_train_epochs, max_steps, drop_last
    ("partial_micro_batch", 4, 1, 2, -1, False),   # 5 micro-batches an epoch, the last of 2 rows
    ("partial_window", 4, 2, 2, -1, False),        # 5 micro-batches: windows 2, 2, 1; 4 steps in all
    ("three_epochs", 4, 2, 3, -1, False),          # 6 steps: the third epoch never starts
    ("drop_last", 4, 2, 2, -1, True),              # 4 micro-batches an epoch, 2 steps
    ("max_steps", 3, 4, 1, 5, False),              # 6 micro-batches: windows 4, 2; 5 steps over 3 epochs
]
# Under torchrun with 2 processes (trainer_epochs_2ranks.json; gloo on the CPU): micro-batches dealt to the
# processes, the last round completed from the first rows, the step's token count summed over both.
RANK_CASES = [
    ("two_ranks_window", 1, 2, 2, -1, False),      # 18 micro-batches of 1: 9 a rank, windows 2, 2, 2, 2, 1
    ("two_ranks_round", 4, 2, 2, -1, False),       # 5 micro-batches of 4, the last of 2 rows: 3 a rank, the
                                                   # last round filled from rows 0-5; windows 2, 1
    ("two_ranks_drop_last", 4, 2, 2, -1, True),    # 4 micro-batches: 2 a rank, one step an epoch
]


def train_case(cfg_dir, rs, name, bs, gas, epochs, max_steps, drop_last):
    m = model(cfg_dir)
    p0 = [p.detach().clone() for p in m.parameters()]
    col, ref = Collate(), []
    cb = Steps(ref)
    with tempfile.TemporaryDirectory() as od:
        args = TrainingArguments(output_dir=od, per_device_train_batch_size=bs, gradient_accumulation_steps=gas,
                                 num_train_epochs=epochs, max_steps=max_steps, dataloader_drop_last=drop_last,
                                 learning_rate=5e-3, lr_scheduler_type="linear", warmup_steps=2,
                                 weight_decay=0.1, max_grad_norm=1.0, logging_steps=1, save_strategy="no",
                                 report_to=[], use_cpu=True, seed=0, remove_unused_columns=False,
                                 optim="adamw_torch", dataloader_num_workers=0,
                                 ddp_backend="gloo" if int(os.environ.get("WORLD_SIZE", "1")) > 1 else None)
        tr = InOrder(model=m, args=args, train_dataset=Rows(rs), data_collator=col, callbacks=[cb])
        tr.mb_losses = []
        ref.append(tr)
        res = tr.train()
    steps = [h for h in tr.state.log_history if "loss" in h and "grad_norm" in h]
    assert len(steps) == tr.state.global_step == len(cb.ends), (len(steps), tr.state.global_step, len(cb.ends))
    step_loss, a = [], 0
    for b in cb.ends:
        step_loss.append(sum(tr.mb_losses[a:b]))
        a = b
    moved = sum(float(((p.detach() - q) ** 2).sum()) for p, q in zip(m.parameters(), p0))
    case = {"name": name, "per_device_train_batch_size": bs, "gradient_accumulation_steps": gas,
            "num_train_epochs": epochs, "max_steps": max_steps, "dataloader_drop_last": drop_last,
            "global_step": tr.state.global_step, "state_max_steps": tr.state.max_steps,
            "loss": step_loss, "logged_loss": [h["loss"] for h in steps],
            "grad_norm": [float(h["grad_norm"]) for h in steps],
            "learning_rate": [h["learning_rate"] for h in steps], "epoch": cb.epochs,
            "micro_batches": col.seen[: cb.ends[-1]], "step_ends": cb.ends, "train_loss": res.training_loss,
            "moved": moved}
    print(name, "steps", tr.state.global_step, "micro-batches", [len(b) for b in case["micro_batches"]],
          "loss", ["%.4f" % v for v in case["logged_loss"]])
    return case


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else "tests/golden"
    torch.manual_seed(0)
    rs = rows()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    with tempfile.TemporaryDirectory() as cfg_dir:
        with open(os.path.join(out_dir, "llama_tiny.config.json")) as f:
            cfg = json.load(f)
        with open(os.path.join(cfg_dir, "config.json"), "w") as f:
            json.dump(cfg, f)
        shutil.copy(os.path.join(out_dir, "llama_tiny.safetensors"), cfg_dir)
        result = {"transformers": transformers.__version__, "torch": torch.__version__, "rows": rs, "pad": PAD,
                  "learning_rate": 5e-3, "warmup_steps": 2, "weight_decay": 0.1, "max_grad_norm": 1.0, "cases": []}
        if world > 1:
            import torch.distributed as dist
            for c in RANK_CASES:
                case = train_case(cfg_dir, rs, *c)
                every = [None] * world
                dist.all_gather_object(every, case["micro_batches"])
                case["micro_batches"] = every  # one list a rank
                del case["loss"]  # (this process's share; logged_loss is the mean over the processes, as HF logs it)
                result["cases"].append(case)
            result["processes"] = world
            if dist.get_rank() == 0:
                with open(os.path.join(out_dir, "trainer_epochs_%dranks.json" % world), "w") as f:
                    json.dump(result, f, indent=1)
                    f.write("\n")
            return
        for c in CASES:
            result["cases"].append(train_case(cfg_dir, rs, *c))
    from accelerate.data_loader import BatchSamplerShard
    from torch.utils.data import BatchSampler
    import accelerate
    result["accelerate"] = accelerate.__version__
    result["dealt"] = []
    for n, bs, procs in [(10, 3, 2), (10, 3, 3), (3, 2, 3), (12, 3, 2), (13, 4, 4), (9, 1, 2), (7, 2, 4)]:
        for drop_last in (False, True):
            ranks = [list(BatchSamplerShard(BatchSampler(range(n), bs, drop_last), num_processes=procs, process_index=r))
                     for r in range(procs)]
            result["dealt"].append({"rows": n, "batch_size": bs, "processes": procs, "drop_last": drop_last,
                                    "ranks": ranks})
    with open(os.path.join(out_dir, "trainer_epochs.json"), "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
