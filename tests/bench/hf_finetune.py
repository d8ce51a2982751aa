"""The Hugging Face side of tests/bench/finetune_vs_hf.sh: fine-tunes a model directory with the
transformers Trainer (bf16 mixed precision: fp32 weights and AdamW, bf16 autocast) on exactly the
token blocks zrun's recipe trained on, in zrun's order, with the same hyperparameters, and writes
per-step loss / grad norm / lr and the eval loss before and after as JSON.
    python3 tests/bench/hf_finetune.py MODEL_DIR DATA_JSON OUT_JSON
DATA_JSON (written by the bench script): {"train": [[ids...]...], "eval": [[ids...]...],
"order": [train row indices, 0-based, in the order zrun consumed them], "mbs", "gas", "lr",
"warmup_steps", "max_steps", "max_grad_norm", "weight_decay", "betas", "eps"}."""
import json
import math
import sys
import time

import torch
from torch.utils.data import Dataset, Sampler
from transformers import AutoModelForCausalLM, Trainer, TrainerCallback, TrainingArguments


class Blocks(Dataset):
    def __init__(self, rows):
        self.rows = rows

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        t = torch.tensor(self.rows[i], dtype=torch.long)
        return {"input_ids": t, "labels": t.clone()}


class Fixed(Sampler):
    """zrun's order, as one long sequence (epoch boundaries included)."""

    def __init__(self, order):
        self.order = order

    def __iter__(self):
        return iter(self.order)

    def __len__(self):
        return len(self.order)


class InOrder(Trainer):
    order = None

    def _get_train_sampler(self, *args, **kwargs):
        return Fixed(self.order)


class Record(TrainerCallback):
    def __init__(self):
        self.steps = []
        self.t0 = None

    def on_train_begin(self, args, state, control, **kw):
        torch.cuda.synchronize()
        self.t0 = time.time()

    def on_log(self, args, state, control, logs=None, **kw):
        if logs and "loss" in logs:
            self.steps.append({"step": state.global_step, "loss": logs["loss"], "grad_norm": logs.get("grad_norm"),
                               "lr": logs.get("learning_rate")})


def main():
    model_dir, data_path, out_path = sys.argv[1:4]
    d = json.load(open(data_path))
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa").cuda()
    args = TrainingArguments(
        output_dir="/tmp/hf_finetune_out", per_device_train_batch_size=d["mbs"], per_device_eval_batch_size=d["mbs"],
        gradient_accumulation_steps=d["gas"], learning_rate=d["lr"], weight_decay=d["weight_decay"],
        adam_beta1=d["betas"][0], adam_beta2=d["betas"][1], adam_epsilon=d["eps"], max_grad_norm=d["max_grad_norm"],
        max_steps=d["max_steps"], warmup_steps=d["warmup_steps"], lr_scheduler_type="linear", bf16=True,
        logging_steps=1, save_strategy="no", eval_strategy="no", report_to=[], dataloader_drop_last=True,
        seed=42, disable_tqdm=True)
    rec = Record()
    InOrder.order = d["order"]
    tr = InOrder(model=model, args=args, train_dataset=Blocks(d["train"]), eval_dataset=Blocks(d["eval"]), callbacks=[rec])
    before = tr.evaluate()["eval_loss"]
    t0 = time.time()
    tr.train()
    torch.cuda.synchronize()
    secs = time.time() - t0
    after = tr.evaluate()["eval_loss"]
    tokens = d["max_steps"] * d["mbs"] * d["gas"] * len(d["train"][0])
    res = {"steps": rec.steps, "eval_loss_before": before, "eval_loss_after": after,
           "perplexity_before": math.exp(before), "perplexity_after": math.exp(after),
           "train_seconds": secs, "tokens_per_s": tokens / secs}
    json.dump(res, open(out_path, "w"))
    print(f"hf: eval loss {before:.4f} -> {after:.4f} (perplexity {math.exp(before):.1f} -> {math.exp(after):.1f}), "
          f"{tokens / secs:.0f} tokens/s over {secs:.1f} s")


if __name__ == "__main__":
    main()
