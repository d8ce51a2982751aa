#!/usr/bin/env python3
"""Trains with TRL's SFTTrainer and with zr.SFTTrainer from the same weights on the same rows, in the same order,
and compares the loss and gradient norm each logs at every step: TRL's own preparation of the rows (chat template,
assistant masks, prompt-completion masks, wrapped and bfd packing, padding-free batches whose sequences attend to
themselves only: transformers' sdpa with position_ids), its collator, its loss_type "dft", the token-mean loss across gradient
accumulation, TRL's defaults (gradient checkpointing on) against zrun's. A tiny Llama with the TinyLlama chat
tokenizer's vocabulary, fp32 on the CPU (TRL 1.10, transformers 5.17, torch 2.11: tests/golden/reference.sh).

usage: python3 tests/golden/check_sft_trl.py OUT_DIR [ZRUN] [DATA_DIR]     (prints PASS/FAIL lines)
"""
import json
import os
import sys
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_torch_files as C  # noqa: E402 (its OUT and ZRUN come from the same argv)
from make_chat_golden import GEN_TEMPLATE  # noqa: E402 (the generation-block template of the chat golden file)

warnings.filterwarnings("ignore")
DATA = sys.argv[3] if len(sys.argv) > 3 else "../shared/data"
TOK = f"{DATA}/tokenizers/tinyllama-1.1b-chat-v1.0"
WORDS = "the sky is blue and the grass is green while a river runs to the sea under old stone bridges".split()


def chat_rows(n):
    out = []
    for i in range(n):
        q = " ".join(WORDS[(i + k) % len(WORDS)] for k in range(3 + i % 5))
        a = " ".join(WORDS[(2 * i + k) % len(WORDS)] for k in range(2 + i % 7))
        msgs = [{"role": "user", "content": "Continue: " + q}, {"role": "assistant", "content": a}]
        if i % 3 == 0:
            msgs = [{"role": "system", "content": "Answer briefly."}] + msgs
        out.append({"messages": msgs})
    return out


def pc_rows(n):
    return [{"prompt": "Continue: " + " ".join(WORDS[i % 9: i % 9 + 4]) + " =>",
             "completion": " " + " ".join(WORDS[(i + 4) % 12: (i + 4) % 12 + 1 + i % 4])} for i in range(n)]


CASES = [
    ("messages, assistant_only_loss", chat_rows(48),
     {"assistant_only_loss": True, "chat_template_path": "gen"}),
    ("prompt-completion (completion_only_loss auto), max_length 24", pc_rows(48), {"max_length": 24}),
    ("text rows packed (wrapped, 64 tokens)", [{"text": r["prompt"] + r["completion"]} for r in pc_rows(96)],
     {"packing": True, "packing_strategy": "wrapped", "max_length": 64}),
    ("text rows packed (bfd, TRL's default, 64 tokens)", [{"text": r["prompt"] + r["completion"]} for r in pc_rows(96)],
     {"packing": True, "max_length": 64}),
    ("prompt-completion packed (bfd_split, 24 tokens)", pc_rows(96),
     {"packing": True, "packing_strategy": "bfd_split", "max_length": 24}),
    ("messages, assistant_only_loss, padding_free", chat_rows(48),
     {"assistant_only_loss": True, "chat_template_path": "gen", "padding_free": True, "max_length": None}),
    ("messages under a DeepSpeed ZeRO-2 file of \"auto\"s", chat_rows(48),
     {"assistant_only_loss": True, "chat_template_path": "gen", "deepspeed": "ds", "warmup_steps": 2}),
    ("prompt-completion, loss_type dft", pc_rows(48), {"max_length": 24, "loss_type": "dft"}),
    ("text rows packed (bfd, 64 tokens), loss_type dft", [{"text": r["prompt"] + r["completion"]} for r in pc_rows(96)],
     {"packing": True, "max_length": 64, "loss_type": "dft"}),
]
DS = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
      "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto", "betas": "auto", "eps": "auto"}},
      "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                   "warmup_num_steps": "auto"}},
      "bf16": {"enabled": "auto"}, "zero_optimization": {"stage": 2}}
COMMON = {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2, "max_steps": 6, "learning_rate": 1e-3,
          "lr_scheduler_type": "constant", "logging_steps": 1, "train_sampling_strategy": "sequential", "seed": 3,
          "eval_strategy": "steps", "eval_steps": 3, "per_device_eval_batch_size": 3}


def lua_value(v):
    if v is None:
        return "false"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    return json.dumps(v)


def main():
    from datasets import Dataset
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
    from trl import SFTConfig, SFTTrainer
    os.makedirs(C.OUT, exist_ok=True)
    saved_tokenizer()  # (first: a DeepSpeed run leaves accelerate's state in DeepSpeed's mode for the process)
    tpl = os.path.join(C.OUT, "gen.jinja")
    with open(tpl, "w") as f:
        f.write(GEN_TEMPLATE)
    ds = os.path.join(C.OUT, "ds_zero2_auto.json")
    with open(ds, "w") as f:
        json.dump(DS, f)
    for k, (name, rows, opts) in enumerate(CASES):
        tok = AutoTokenizer.from_pretrained(TOK)
        torch.manual_seed(k)
        m = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                         tie_word_embeddings=False))
        init = f"{C.OUT}/sft_init{k}"
        m.save_pretrained(init)
        args = dict(COMMON, **opts)
        if args.get("chat_template_path") == "gen":
            args["chat_template_path"] = tpl
        if args.get("deepspeed") == "ds":
            args["deepspeed"] = ds
        cfg = SFTConfig(output_dir=f"{C.OUT}/sft_trl{k}", report_to="none", bf16=False, use_cpu=True,
                        save_strategy="no", **args)
        tr = SFTTrainer(model=m, args=cfg, train_dataset=Dataset.from_list(rows), processing_class=tok,
                        eval_dataset=Dataset.from_list(rows[:10]))
        tr.train()
        trl_log = [(h["step"], h["loss"], h["grad_norm"], h.get("num_tokens"), h["entropy"], h["mean_token_accuracy"])
                   for h in tr.state.log_history if "loss" in h]
        trl_eval = [(h["step"], h["eval_entropy"], h["eval_mean_token_accuracy"]) for h in tr.state.log_history
                    if "eval_entropy" in h]
        rows_path = f"{C.OUT}/sft_rows{k}.json"
        with open(rows_path, "w") as f:
            json.dump(rows, f)
        lua_args = ", ".join(f"{a} = {lua_value(v)}" for a, v in sorted(args.items()))
        rc, out = C.zrun_lua(f"""
local zr = require "zrun"
local cjson = require "cjson"
local f = assert(io.open("{rows_path}")); local rows = cjson.decode(f:read("*a")); f:close()
local ev = {{}}
for i = 1, 10 do ev[i] = rows[i] end
local tr = zr.SFTTrainer {{ model = zr.models.llama.from_pretrained("{init}", {{ dtype = "f32" }}),
  processing_class = zr.tokenizers.load("{TOK}"), train_dataset = zr.datasets.Dataset.from_rows(rows),
  eval_dataset = zr.datasets.Dataset.from_rows(ev),
  args = {{ output_dir = "{C.OUT}/sft_zrun{k}", bf16 = false, save_strategy = "no", {lua_args} }} }}
tr:train()
for _, h in ipairs(tr.state.log_history) do
  if h.loss and h.grad_norm then
    print(string.format("LOG %d %.7f %.7f %d %.7f %.7f", h.step, h.loss, h.grad_norm, h.num_tokens or -1, h.entropy or -1,
      h.mean_token_accuracy or -1))
  end
  if h.eval_entropy then print(string.format("EVAL %d %.7f %.7f", h.step, h.eval_entropy, h.eval_mean_token_accuracy)) end
end
""")
        z = [(int(x.split()[1]), float(x.split()[2]), float(x.split()[3]), int(x.split()[4]), float(x.split()[5]),
              float(x.split()[6])) for x in out.splitlines() if x.startswith("LOG ")]
        print(f"  {name}: TRL {[(s, round(l, 6), round(g, 6), t, round(en, 6), round(ac, 4)) for s, l, g, t, en, ac in trl_log]}\n"
              f"  {name}: zrun {[(s, round(l, 6), round(g, 6), t, round(en, 6), round(ac, 4)) for s, l, g, t, en, ac in z]}",
              flush=True)
        # (the gradient norm within 5e-4: transformers' without DeepSpeed logs ~5e-5 to 1.5e-4 below the norm of the
        # same gradients in float64, which zrun's equals at step 1; under DeepSpeed both agree to 6 digits)
        ok = rc == 0 and len(z) == len(trl_log) and all(
            a[0] == b[0] and abs(a[1] - b[1]) <= 2e-4 * abs(b[1]) and abs(a[2] - b[2]) <= 5e-4 * abs(b[2]) + 1e-6
            and a[3] == b[3] and abs(a[4] - b[4]) <= 1e-4 * abs(b[4]) and abs(a[5] - b[5]) <= 1e-6
            for a, b in zip(z, trl_log))
        C.report(f"zr.SFTTrainer logs TRL's SFTTrainer losses, gradient norms, num_tokens, entropy and mean_token_accuracy, "
                 f"step by step ({name})", ok,
                 out[-600:])
        # the evaluations' eval_entropy and eval_mean_token_accuracy: TRL's means over the evaluation batches
        ze = [(int(x.split()[1]), float(x.split()[2]), float(x.split()[3])) for x in out.splitlines() if x.startswith("EVAL ")]
        print(f"  {name}: TRL eval {[(s, round(en, 6), round(ac, 4)) for s, en, ac in trl_eval]}\n"
              f"  {name}: zrun eval {[(s, round(en, 6), round(ac, 4)) for s, en, ac in ze]}", flush=True)
        ok = rc == 0 and len(ze) == len(trl_eval) > 0 and all(
            a[0] == b[0] and abs(a[1] - b[1]) <= 1e-4 * abs(b[1]) and abs(a[2] - b[2]) <= 1e-6 for a, b in zip(ze, trl_eval))
        C.report(f"zr.SFTTrainer's evaluations log TRL's eval_entropy and eval_mean_token_accuracy ({name})", ok, out[-300:])
    print(f"{C.failed} failed")
    sys.exit(1 if C.failed else 0)


def saved_tokenizer():
    """eos_token (and the pad token TRL sets) in the tokenizer save_model writes: what AutoTokenizer reads back from
    TRL's output and from zrun's, for GPT-2 (no pad token: TRL pads with the new eos) and TinyLlama (its own pad)."""
    from datasets import Dataset
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
    from trl import SFTConfig, SFTTrainer
    for name, eos in (("gpt2", "!"), ("tinyllama-1.1b-chat-v1.0", "<unk>")):
        d = f"{DATA}/tokenizers/{name}"
        tok = AutoTokenizer.from_pretrained(d)
        m = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1))
        out = f"{C.OUT}/eos_{name}"
        tr = SFTTrainer(model=m, processing_class=tok, train_dataset=Dataset.from_list([{"text": "a b"}]),
                        args=SFTConfig(output_dir=out + "_trl", report_to="none", bf16=False, use_cpu=True, eos_token=eos,
                                       max_steps=1, save_strategy="no"))
        tr.save_model()
        rc, text = C.zrun_lua(f"""
local zr = require "zrun"
local tok = zr.tokenizers.load("{d}")
local cfg = zr.models.llama.config("zrun/tiny-llama")
cfg.vocab_size = tok:vocab_size()
local tr = zr.SFTTrainer {{ model = zr.models.llama.LlamaForCausalLM(cfg), processing_class = tok,
  train_dataset = {{ {{ text = "a b" }} }},
  args = {{ output_dir = "{out}_zrun", bf16 = false, save_strategy = "no", max_steps = 1, eos_token = "{eos}" }} }}
tr:save_model()
""")
        got = []
        for side in ("trl", "zrun"):
            try:
                t = AutoTokenizer.from_pretrained(f"{out}_{side}")
                got.append((t.eos_token, t.pad_token))
            except Exception as e:  # noqa: BLE001
                got.append(repr(e)[:200])
        print(f"  saved tokenizer {name}: TRL (eos, pad) {got[0]}, zrun {got[1]}", flush=True)
        C.report(f"the tokenizer saved after eos_token = {eos!r} ({name}) reads back as TRL's", rc == 0 and got[0] == got[1],
                 text[-300:])


if __name__ == "__main__":
    C.one_process_world()
    main()
