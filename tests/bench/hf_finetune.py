"""The Hugging Face side of tests/bench/finetune_vs_hf.sh: fine-tunes a model directory with the
transformers Trainer (bf16 mixed precision: fp32 weights and AdamW, bf16 autocast) on exactly the
token blocks zrun's recipe trained on, in zrun's order (the recipe's dump_blocks file), with the
same hyperparameters, and writes per-step loss / grad norm / lr and the eval loss before and after
as JSON.
    python3 tests/bench/hf_finetune.py MODEL_DIR BLOCKS.safetensors OUT_JSON LR WARMUP_RATIO SCHEDULER [DS_CONFIG [SCHED_KWARGS]]
BLOCKS.safetensors (zrun's dump_blocks): train_input_ids (N, T), eval_input_ids (M, T), train_order
(0-based rows of the whole run in the order zrun read them) and train_epoch_order (each epoch's rows, an
epoch a row: the Trainer reads epoch e's in its e-th epoch, so that it cuts them into micro-batches and
steps as zrun did, an epoch's last micro-batch and accumulation window shorter where the rows run out);
its metadata holds per_device_train_batch_size, gradient_accumulation_steps, max_steps and
dataloader_drop_last. Weight decay 0, betas
(0.9, 0.999), eps 1e-8 and clipping at 1.0, as configs/ds_config.json and the recipe set them.
SCHEDULER: any lr_scheduler_type (used where the DeepSpeed config has no scheduler), with SCHED_KWARGS
its lr_scheduler_kwargs as a JSON object ("-" or absent: none).
Rows of different lengths (the recipe's packing=false: -1 after each row's end in the file, the pad token in
its metadata) are padded per micro-batch by transformers' DataCollatorForLanguageModeling (labels -100 on the
pad token, as zrun's collator); rows with their own labels (train_labels / eval_labels in the file: sft_llama.lua's
dump_blocks) by a collator that pads the labels with -100, as TRL's does, and the eval loss is then also computed by hand as zrun's evaluation does it:
the unsmoothed cross-entropy summed over every counted token / their count (transformers averages its eval
batches' means). HF_EXTRA (environment): a JSON object of more TrainingArguments (e.g. label_smoothing_factor),
which also switches the eval to that by-hand loss; HF_SMOOTH_FP32=1: the LabelSmoother gets fp32 logits.
DS_CONFIG: train through DeepSpeed with that config (as the HF Trainer's deepspeed= argument; bf16
weights with fp32 master as zrun does, or fp16 ones with DeepSpeed's loss scaler where the config
enables fp16) instead of AMP; its optimizer runs as torch's AdamW
(torch_adam: the same update without building DeepSpeed's fused kernel); a config without an
"optimizer" section trains with the Trainer's own (optim adamw_torch_fused, from the arguments). Run under a launcher's
environment: RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29511."""
import json
import math
import sys
import time

import os

import torch
import torch.nn.functional as F
from safetensors import safe_open
from torch.utils.data import Dataset, Sampler
from transformers import (AutoModelForCausalLM, DataCollatorForLanguageModeling, PreTrainedTokenizerFast, Trainer,
                          TrainerCallback, TrainingArguments)


class Blocks(Dataset):
    def __init__(self, rows):
        self.rows = rows

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        t = torch.tensor(self.rows[i], dtype=torch.long)
        return {"input_ids": t, "labels": t.clone()}


class Rows(Blocks):
    """Rows of different lengths: the collator pads them and makes the labels."""

    def __getitem__(self, i):
        return {"input_ids": torch.tensor(self.rows[i], dtype=torch.long)}


class LabeledRows(Blocks):
    """Rows with their own labels (zrun's sft_llama.lua: -100 where the loss must not look, as TRL builds them)."""

    def __init__(self, rows, labels):
        self.rows, self.labels = rows, labels

    def __getitem__(self, i):
        return {"input_ids": torch.tensor(self.rows[i], dtype=torch.long), "labels": torch.tensor(self.labels[i], dtype=torch.long)}


def pad_labeled(pad):
    """TRL's collator for rows with labels: input_ids padded with the pad token, labels with -100 (real eos tokens
    keep their labels even when pad == eos)."""
    def collate(batch):
        T = max(len(b["input_ids"]) for b in batch)
        ids = torch.full((len(batch), T), pad, dtype=torch.long)
        labels = torch.full((len(batch), T), -100, dtype=torch.long)
        mask = torch.zeros((len(batch), T), dtype=torch.long)
        for k, b in enumerate(batch):
            n = len(b["input_ids"])
            ids[k, :n], labels[k, :n], mask[k, :n] = b["input_ids"], b["labels"], 1
        return {"input_ids": ids, "labels": labels, "attention_mask": mask}
    return collate


def token_loss(model, rows, pad, bf16, labels=None):
    """zrun's evaluation: the cross-entropy summed over every counted token (labels that are not the pad token
    when rows are padded, pad None: every token; with labels, those that are not -100), divided by their count."""
    model.eval()
    tot, cnt = 0.0, 0
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
        for k, r in enumerate(rows):
            ids = torch.tensor([r], device="cuda")
            logits, tgt = model(input_ids=ids).logits.float()[0, :-1], ids[0, 1:]
            if labels is not None:
                tgt = torch.tensor(labels[k][1:], device="cuda")
                keep = tgt != -100
            else:
                keep = tgt != pad if pad is not None else torch.ones_like(tgt, dtype=torch.bool)
            tot += F.cross_entropy(logits[keep], tgt[keep], reduction="sum").item()
            cnt += int(keep.sum().item())
    model.train()
    return tot / cnt


class Epochs(Sampler):
    """zrun's rows of each epoch: epoch e (set_epoch, which the Trainer calls through accelerate's loader,
    else the count of epochs begun) reads epochs[e]."""

    def __init__(self, epochs):
        self.epochs, self.epoch = epochs, 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __iter__(self):
        e = self.epoch
        self.epoch += 1
        return iter(self.epochs[e])

    def __len__(self):
        return len(self.epochs[0])


class InOrder(Trainer):
    epochs = None

    def _get_train_sampler(self, *args, **kwargs):
        return Epochs(self.epochs)


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
    model_dir, blocks_path, out_path = sys.argv[1:4]
    lr, warmup_ratio, sched = float(sys.argv[4]), float(sys.argv[5]), sys.argv[6]
    ds = None
    if len(sys.argv) > 7:
        ds = json.load(open(sys.argv[7]))
        if "optimizer" in ds:
            ds["optimizer"].setdefault("params", {})["torch_adam"] = True
    kwargs = json.loads(sys.argv[8]) if len(sys.argv) > 8 and sys.argv[8] != "-" else None
    with safe_open(blocks_path, "pt") as f:
        meta = f.metadata()
        train, evals, order = f.get_tensor("train_input_ids"), f.get_tensor("eval_input_ids"), f.get_tensor("train_order")
        epochs = f.get_tensor("train_epoch_order").tolist()
        keys = f.keys()
        train_labels = f.get_tensor("train_labels").tolist() if "train_labels" in keys else None
        eval_labels = f.get_tensor("eval_labels").tolist() if "eval_labels" in keys else None
    fp16 = bool(ds and ds.get("fp16", {}).get("enabled") is True)
    extra = json.loads(os.environ.get("HF_EXTRA") or "{}")
    train_rows = [[v for v in r if v >= 0] for r in train.tolist()]
    eval_rows = [[v for v in r if v >= 0] for r in evals.tolist()]
    if train_labels is not None:  # cut each row's labels to its length
        train_labels = [l[: len(r)] for l, r in zip(train_labels, train_rows)]
        eval_labels = [l[: len(r)] for l, r in zip(eval_labels, eval_rows)]
    ragged = any(len(r) != train.shape[1] for r in train_rows + eval_rows)
    pad = int(meta["pad_token_id"]) if ragged else None
    by_hand = ragged or bool(extra) or train_labels is not None
    mbs, gas, steps = int(meta["per_device_train_batch_size"]), int(meta["gradient_accumulation_steps"]), int(meta["max_steps"])
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa").cuda()
    drop_last = meta["dataloader_drop_last"] == "true"
    args = TrainingArguments(
        # eval batches of 1: dataloader_drop_last (where the recipe drops a last partial micro-batch in training)
        # applies to the eval loader too, and would leave out the last len % mbs blocks that zrun's evaluation counts
        output_dir="/tmp/hf_finetune_out", per_device_train_batch_size=mbs, per_device_eval_batch_size=1,
        gradient_accumulation_steps=gas, learning_rate=lr, weight_decay=0.0, adam_beta1=0.9, adam_beta2=0.999,
        adam_epsilon=1e-8, max_grad_norm=1.0, max_steps=steps, warmup_steps=math.ceil(warmup_ratio * steps), lr_scheduler_type=sched,
        lr_scheduler_kwargs=kwargs,
        bf16=not fp16, fp16=fp16, logging_steps=1, save_strategy="no", eval_strategy="no", report_to=[], dataloader_drop_last=drop_last,
        seed=42, disable_tqdm=True, deepspeed=ds, **extra)
    rec = Record()
    InOrder.epochs = epochs
    collator = None
    if ragged:
        tok = PreTrainedTokenizerFast(tokenizer_file=model_dir + "/tokenizer.json")
        tok.pad_token = tok.convert_ids_to_tokens(pad)
        collator = DataCollatorForLanguageModeling(tok, mlm=False)
    if train_labels is not None:
        train_ds, eval_ds = LabeledRows(train_rows, train_labels), LabeledRows(eval_rows, eval_labels)
        collator = pad_labeled(pad if pad is not None else 0)
    else:
        kind = Rows if ragged else Blocks
        train_ds, eval_ds = kind(train_rows), kind(eval_rows)
    tr = InOrder(model=model, args=args, train_dataset=train_ds, eval_dataset=eval_ds,
                 data_collator=collator, callbacks=[rec])
    if os.environ.get("HF_SMOOTH_FP32") and tr.label_smoother is not None:
        # transformers' LabelSmoother over the model's logits as they come (bf16 under DeepSpeed bf16: its
        # log_softmax output rounded to bf16); HF_SMOOTH_FP32=1 gives it the logits in fp32, the same formula
        smoother = tr.label_smoother
        tr.label_smoother = lambda out, labels, **kw: smoother({"logits": out["logits"].float()}, labels, **kw)
        print("hf: LabelSmoother over fp32 logits")
    if by_hand:
        print(f"hf: eval by hand over {len(eval_rows)} rows (token-weighted, unsmoothed), extra arguments {extra}")
    # (HF + DeepSpeed below stage 3 cannot evaluate before training starts the engine)
    before = (token_loss(model, eval_rows, pad, not fp16, eval_labels) if by_hand else
              float("nan") if ds else tr.evaluate()["eval_loss"])
    t0 = time.time()
    tr.train()
    torch.cuda.synchronize()
    secs = time.time() - t0
    after = token_loss(tr.model, eval_rows, pad, not fp16, eval_labels) if by_hand else tr.evaluate()["eval_loss"]
    skipped = getattr(tr.model_wrapped, "skipped_steps", None)  # DeepSpeed's engine: fp16 overflow steps
    if skipped is not None:
        print(f"hf: DeepSpeed skipped {skipped} steps")
    tokens = sum(len(train_rows[i]) for i in order.tolist())
    res = {"steps": rec.steps, "eval_loss_before": before, "eval_loss_after": after,
           "perplexity_before": math.exp(before), "perplexity_after": math.exp(after),
           "train_seconds": secs, "tokens_per_s": tokens / secs, "skipped_steps": skipped}
    json.dump(res, open(out_path, "w"))
    print(f"hf: eval loss {before:.4f} -> {after:.4f} (perplexity {math.exp(before):.2f} -> {math.exp(after):.2f}), "
          f"{tokens / secs:.0f} tokens/s over {secs:.1f} s")


if __name__ == "__main__":
    main()
