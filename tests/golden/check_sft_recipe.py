#!/usr/bin/env python3
"""recipes/sft_llama.lua as a user runs it (a .jsonl of chat rows, a DeepSpeed file, SFTConfig keys on the command
line) next to TRL's SFTTrainer with the same file and arguments on the same rows, split as the recipe splits them
(the first validation_split_percentage % evaluate): every logged loss and each evaluation. A tiny Llama with the
TinyLlama chat tokenizer's vocabulary, float32, on the CPU (TRL 1.10: tests/golden/reference.sh).

usage: python3 tests/golden/check_sft_recipe.py OUT_DIR [ZRUN] [DATA_DIR]     (prints PASS/FAIL lines)
"""
import json
import os
import subprocess
import sys
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_torch_files as C  # noqa: E402 (its OUT and ZRUN come from the same argv)
import check_sft_trl as S  # noqa: E402 (the chat rows and the template)

warnings.filterwarnings("ignore")
DATA = sys.argv[3] if len(sys.argv) > 3 else "../shared/data"
ARGS = {"max_steps": 6, "logging_steps": 1, "eval_steps": 3, "learning_rate": 1e-3, "per_device_train_batch_size": 4,
        "gradient_accumulation_steps": 2, "per_device_eval_batch_size": 4, "save_strategy": "no", "warmup_steps": 2,
        "assistant_only_loss": True}


def main():
    from datasets import Dataset
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
    from trl import SFTConfig, SFTTrainer
    os.makedirs(C.OUT, exist_ok=True)
    tokdir = f"{DATA}/tokenizers/tinyllama-1.1b-chat-v1.0"
    tok = AutoTokenizer.from_pretrained(tokdir)
    torch.manual_seed(1)
    m = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256))
    model_dir = f"{C.OUT}/sftr_model"
    m.save_pretrained(model_dir)
    rows = S.chat_rows(80)
    data = f"{C.OUT}/sftr_rows.jsonl"
    with open(data, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    tpl = f"{C.OUT}/sftr_gen.jinja"
    with open(tpl, "w") as f:
        f.write(S.GEN_TEMPLATE)
    n_eval = max(1, int(len(rows) * 5 / 100 + 0.5))  # (the recipe's validation_split_percentage 5)
    ds_file = os.path.join(os.getcwd(), "configs/zero2.json")
    tr = SFTTrainer(model=m, processing_class=tok, train_dataset=Dataset.from_list(rows[n_eval:]),
                    eval_dataset=Dataset.from_list(rows[:n_eval]),
                    args=SFTConfig(output_dir=f"{C.OUT}/sftr_trl", report_to="none", bf16=False, use_cpu=True,
                                   deepspeed=ds_file, eval_strategy="steps", eval_on_start=True,
                                   chat_template_path=tpl, **ARGS))
    tr.train()
    hf_logs = [(h["step"], h["loss"]) for h in tr.state.log_history if "loss" in h]
    hf_evals = [h["eval_loss"] for h in tr.state.log_history if "eval_loss" in h]
    cmd = [C.ZRUN, "recipes/sft_llama.lua", f"model={model_dir}", f"tokenizer={tokdir}", f"data={data}", "--config",
           "configs/zero2.json", f"chat_template_path={tpl}", f"output_dir={C.OUT}/sftr_zrun", "precision=fp32",
           "bf16=false"] + [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in ARGS.items()]
    r = subprocess.run(cmd, capture_output=True, text=True)
    text = r.stdout + r.stderr
    z_logs, z_evals = C.printed_losses(text)
    print(f"  losses: TRL {[(s, round(v, 4)) for s, v in hf_logs]}\n  losses: zrun {z_logs}\n"
          f"  evaluations: TRL {[round(x, 4) for x in hf_evals]}, zrun {z_evals}", flush=True)
    C.report("recipes/sft_llama.lua, as a user runs it, logs TRL's SFTTrainer losses on the same .jsonl",
             r.returncode == 0 and [a for a, _ in z_logs] == [a for a, _ in hf_logs] and all(
                 abs(b - d) <= 1e-4 * abs(d) + 1e-4 for (_, b), (_, d) in zip(z_logs, hf_logs)), text[-500:])
    C.report("and its evaluations (at the start, steps 3 and 6)", len(z_evals) == len(hf_evals) and all(
        abs(a - b) <= 1e-4 * abs(b) + 1e-4 for a, b in zip(z_evals, hf_evals)), f"zrun {z_evals} TRL {hf_evals}")
    print(f"{C.failed} failed", flush=True)
    sys.exit(1 if C.failed else 0)


if __name__ == "__main__":
    C.one_process_world()
    main()
