#!/usr/bin/env python3
"""The README's recipe as a user runs it, next to transformers' run_clm.py pipeline + DeepSpeed on the same files:
`zrun recipes/finetune_llama.lua model=DIR tokenizer=GPT2 data=wiki.valid.raw --config configs/zero2.json ...` against
the rows of WikiText-2's validation file as the hub's wikitext dataset holds them (each line with its newline, blank
lines empty), run_clm's split of a dataset without a validation split (the first 5% of the lines evaluate), its
tokenize_function and group_texts, transformers' Trainer with the same DeepSpeed file and TrainingArguments, in
transformers' random order: every logged loss, the evaluations and the number of blocks. A tiny Llama with GPT-2's
vocabulary (no BOS: run_clm's blank lines add nothing, docs/migrating.md), float32, on the CPU (tests/golden/reference.sh).

usage: python3 tests/golden/check_recipe_clm.py OUT_DIR [ZRUN] [DATA_DIR]     (prints PASS/FAIL lines)
"""
import math
import os
import subprocess
import sys
import warnings
from itertools import chain

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_torch_files as C  # noqa: E402 (its OUT and ZRUN come from the same argv)

warnings.filterwarnings("ignore")
DATA = sys.argv[3] if len(sys.argv) > 3 else "../shared/data"
BLOCK, STEPS = 128, 12
ARGS = {"max_steps": STEPS, "logging_steps": 1, "eval_steps": 6, "learning_rate": 1e-3, "save_strategy": "no",
        "per_device_train_batch_size": 4, "gradient_accumulation_steps": 2, "per_device_eval_batch_size": 4}


def main():
    import datasets
    from transformers import (AutoTokenizer, LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments,
                              default_data_collator)
    datasets.disable_progress_bars()
    os.makedirs(C.OUT, exist_ok=True)
    wiki = f"{DATA}/wikitext-2-raw/wiki.valid.raw"
    tok = AutoTokenizer.from_pretrained(f"{DATA}/tokenizers/gpt2")
    torch.manual_seed(0)
    m = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=BLOCK))
    model_dir = f"{C.OUT}/clm_model"
    m.save_pretrained(model_dir)
    # the hub's wikitext rows: each line with its "\n", blank lines "" (what `load_dataset("wikitext", ...)` gives)
    with open(wiki, encoding="utf-8") as f:
        lines = [ln if ln.strip() else "" for ln in f.read().split("\n")[:-1]]
        lines = [ln + "\n" if ln else "" for ln in lines]
    raw = datasets.Dataset.from_dict({"text": lines})
    n = len(raw)
    # run_clm without a validation split: split=f"train[:{p}%]" and f"train[{p}%:]" (datasets' percent slicing)
    p = 5
    cut = datasets.ReadInstruction("train", to=p, unit="%").to_absolute({"train": n})[0].to
    raw_eval, raw_train = raw.select(range(cut)), raw.select(range(cut, n))

    def tokenize(ex):
        return tok(ex["text"])

    def group_texts(examples):  # run_clm's
        concatenated = {k: list(chain(*examples[k])) for k in examples.keys()}
        total = (len(concatenated[list(examples.keys())[0]]) // BLOCK) * BLOCK
        result = {k: [t[i: i + BLOCK] for i in range(0, total, BLOCK)] for k, t in concatenated.items()}
        result["labels"] = result["input_ids"].copy()
        return result
    blocks = {}
    for name, d in (("train", raw_train), ("eval", raw_eval)):
        blocks[name] = d.map(tokenize, batched=True, remove_columns=["text"]).map(group_texts, batched=True)
    out = f"{C.OUT}/clm_hf"
    tr = Trainer(model=m, args=TrainingArguments(output_dir=out, report_to=[], use_cpu=True,
                                                 deepspeed=os.path.join(os.getcwd(), "configs/zero2.json"),
                                                 eval_strategy="steps", eval_on_start=True, warmup_steps=0.05,
                                                 weight_decay=0.0, **ARGS),
                 train_dataset=blocks["train"], eval_dataset=blocks["eval"], data_collator=default_data_collator)
    tr.train()  # (eval_on_start: the recipe evaluates before training; DeepSpeed's ZeRO-2 cannot before train())
    hf_logs = [(h["step"], h["loss"]) for h in tr.state.log_history if "loss" in h]
    hf_evals = [h["eval_loss"] for h in tr.state.log_history if "eval_loss" in h]
    cmd = [C.ZRUN, "recipes/finetune_llama.lua", f"model={model_dir}", f"tokenizer={DATA}/tokenizers/gpt2",
           f"data={wiki}", "--config", "configs/zero2.json", f"block_size={BLOCK}", f"output_dir={C.OUT}/clm_zrun",
           "precision=fp32"] + [f"{k}={v}" for k, v in ARGS.items()]
    r = subprocess.run(cmd, capture_output=True, text=True)
    text = r.stdout + r.stderr
    z_logs, z_evals = C.printed_losses(text)
    n_blocks = None
    for line in text.splitlines():
        if "training blocks and" in line:
            n_blocks = int(line.split("] ")[1].split()[0])
    print(f"  blocks: transformers {len(blocks['train'])} train / {len(blocks['eval'])} eval, zrun {n_blocks} train\n"
          f"  losses: transformers {[(s, round(l, 4)) for s, l in hf_logs]}\n"
          f"  losses: zrun {z_logs}\n  evaluations: transformers {[round(x, 4) for x in hf_evals]}, zrun {z_evals}",
          flush=True)
    C.report("the recipe makes run_clm's blocks from WikiText-2's validation file (GPT-2's tokenizer)",
             r.returncode == 0 and n_blocks == len(blocks["train"]), text[-400:])
    C.report("the recipe, as the README runs it, logs the losses of run_clm's pipeline + transformers + DeepSpeed",
             len(z_logs) == len(hf_logs) and all(a[0] == b[0] and abs(a[1] - b[1]) <= 1e-4 * abs(b[1]) + 1e-4
                                                 for a, b in zip(z_logs, hf_logs)), text[-400:])
    C.report("and its evaluations (before, at step 6, at step 12)", len(z_evals) == len(hf_evals) and all(
        abs(a - b) <= 1e-4 * abs(b) + 1e-4 for a, b in zip(z_evals, hf_evals)),
        f"zrun {z_evals} transformers {hf_evals}; perplexity {[math.exp(x) for x in hf_evals]}")
    print(f"{C.failed} failed", flush=True)
    sys.exit(1 if C.failed else 0)


if __name__ == "__main__":
    C.one_process_world()
    main()
