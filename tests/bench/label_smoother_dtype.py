"""How much transformers' LabelSmoother moves when it gets bf16 logits (as under DeepSpeed bf16) instead of fp32:
the first optimizer step of a finetune_vs_hf.sh padded-rows run (its dump_blocks file), its micro-batches padded as
DataCollatorForLanguageModeling pads them, the step's loss with num_items_in_batch over all of them, as the Trainer
logs it, with the smoother over bf16 logits and over the same logits in fp32.
    python3 tests/bench/label_smoother_dtype.py MODEL_DIR BLOCKS.safetensors [EPS]"""
import sys

import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM
from transformers.trainer_pt_utils import LabelSmoother


def main():
    model_dir, blocks = sys.argv[1], sys.argv[2]
    eps = float(sys.argv[3]) if len(sys.argv) > 3 else 0.1
    with safe_open(blocks, "pt") as f:
        meta, train, order = f.metadata(), f.get_tensor("train_input_ids"), f.get_tensor("train_order")
    mbs, gas, pad = int(meta["per_device_train_batch_size"]), int(meta["gradient_accumulation_steps"]), int(meta["pad_token_id"])
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).cuda().eval()
    batches = []
    for m in range(gas):
        rows = [[v for v in train[i].tolist() if v >= 0] for i in order[m * mbs:(m + 1) * mbs].tolist()]
        T = max(len(r) for r in rows)
        ids = torch.tensor([r + [pad] * (T - len(r)) for r in rows], device="cuda")
        mask = torch.tensor([[1] * len(r) + [0] * (T - len(r)) for r in rows], device="cuda")
        labels = ids.clone()
        labels[labels == pad] = -100
        batches.append((ids, mask, labels))
    n = sum(int((lb[:, 1:] != -100).sum()) for _, _, lb in batches)
    smoother = LabelSmoother(epsilon=eps)
    tot = {"bf16": 0.0, "fp32": 0.0}
    with torch.no_grad():
        for ids, mask, labels in batches:
            logits = model(input_ids=ids, attention_mask=mask).logits
            tot["bf16"] += smoother({"logits": logits}, labels, shift_labels=True, num_items_in_batch=n).item()
            tot["fp32"] += smoother({"logits": logits.float()}, labels, shift_labels=True, num_items_in_batch=n).item()
    print(f"label smoother, step 1 ({gas} micro-batches, {n} tokens, eps {eps}): bf16 logits {tot['bf16']:.4f}, "
          f"fp32 logits {tot['fp32']:.4f} ({100 * (tot['bf16'] / tot['fp32'] - 1):+.2f}%)")


if __name__ == "__main__":
    main()
