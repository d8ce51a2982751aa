"""Writes tests/golden/generate.json: transformers' generate() on the tiny golden models, for
tests/lua/test_generate.lua (zrun's model:generate).

    /tmp/zrun-ref/bin/python tests/golden/make_generate_golden.py tests/golden

Each model (llama_tiny, mistral_tiny, qwen2_tiny, qwen3_tiny, gpt2_tiny) is built from NAME.config.json with the
weights of NAME.safetensors, every 2-D weight times WEIGHT_SCALE (below), float32 on the CPU, transformers' default attention (what a user's
generate() runs), and generates greedily (do_sample=False):
  single:  one prompt, max_new_tokens 24, the config's eos_token_id (transformers' default);
  default: the same prompt without max_new_tokens (transformers 5: 20 new tokens);
  batch:   three prompts of 5, 9 and 3 tokens, left-padded with an attention_mask, pad_token_id 0,
           eos_token_id a token row 0 generates after a few steps (chosen from a run without it), so
           that row finishes early and is padded with pad_token_id;
  long:    the single prompt, 30 new tokens, no eos (37 tokens: past mistral_tiny's sliding_window 24);
  penalty: the single prompt with repetition_penalty 1.3.
Then the logits processors on one fixed row of 16 scores (TemperatureLogitsWarper 0.7, TopKLogitsWarper 5,
TopPLogitsWarper 0.8 and 0.3, RepetitionPenaltyLogitsProcessor 1.5 over a few ids), for the unit tests of
zrun.generation's processor functions; a filtered score (-inf) is written as null.
"""
import json
import math
import os
import sys
import tempfile

import torch
from safetensors import safe_open
from safetensors.torch import save_file

MODELS = ["llama_tiny", "mistral_tiny", "qwen2_tiny", "qwen3_tiny", "gpt2_tiny"]
# Every 2-D weight (projections, embeddings, heads) times this: at the golden files' init (std 0.02) the
# tiny models repeat one token within a few steps, with top-2 logit margins of 1e-4 to 1e-2; times 16
# they wander through the vocabulary with margins near 1, a test of every step rather than of one.
WEIGHT_SCALE = 16


def load(golden, name):
    from transformers import AutoModelForCausalLM

    with open(os.path.join(golden, name + ".config.json")) as f:
        config_text = f.read()
    d = tempfile.mkdtemp()
    with open(os.path.join(d, "config.json"), "w") as f:
        f.write(config_text)
    with safe_open(os.path.join(golden, name + ".safetensors"), "pt") as f:
        sd = {k: f.get_tensor(k) for k in f.keys() if not k.startswith("grad.") and k not in
              ("input_ids", "labels", "logits", "loss", "adamw_losses", "adamw_grad_norms")}
    save_file(sd, os.path.join(d, "model.safetensors"))
    model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    with torch.no_grad():  # (the golden weights' small init makes the tiny models repeat one token)
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(WEIGHT_SCALE)
    return model


def prompts(vocab):
    g = torch.Generator().manual_seed(1234)
    single = torch.randint(3, vocab, (1, 7), generator=g)
    rows = [torch.randint(3, vocab, (n,), generator=g) for n in (5, 9, 3)]
    return single, rows


def left_pad(rows, pad):
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = r
        mask[i, width - len(r):] = 1
    return ids, mask


def model_cases(model):
    single, rows = prompts(model.config.vocab_size)
    out = {}
    with torch.no_grad():
        g = model.generate(single, do_sample=False, max_new_tokens=24)
        out["single"] = {"input_ids": single.tolist(), "max_new_tokens": 24, "output": g.tolist()}
        g = model.generate(single, do_sample=False)
        out["default"] = {"input_ids": single.tolist(), "output": g.tolist()}
        ids, mask = left_pad(rows, 0)
        free = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=12, pad_token_id=0,
                              eos_token_id=None)
        eos = int(free[0, ids.shape[1] + 3])  # row 0's 4th new token: it stops there
        g = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=12, pad_token_id=0,
                           eos_token_id=eos)
        out["batch"] = {"input_ids": ids.tolist(), "attention_mask": mask.tolist(), "max_new_tokens": 12,
                        "pad_token_id": 0, "eos_token_id": eos, "output": g.tolist()}
        g = model.generate(single, do_sample=False, max_new_tokens=30, eos_token_id=None)
        assert g.shape[1] == single.shape[1] + 30
        out["long"] = {"input_ids": single.tolist(), "max_new_tokens": 30, "eos_token_id": False, "output": g.tolist()}
        g = model.generate(single, do_sample=False, max_new_tokens=24, repetition_penalty=1.3)
        out["penalty"] = {"input_ids": single.tolist(), "max_new_tokens": 24, "repetition_penalty": 1.3,
                          "output": g.tolist()}
    return out


def nulls(t):
    return [None if math.isinf(v) else v for v in t.tolist()]


def processors():
    from transformers.generation.logits_process import (RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper,
                                                        TopKLogitsWarper, TopPLogitsWarper)

    g = torch.Generator().manual_seed(7)
    row = (torch.randn(1, 16, generator=g) * 2).float()
    ids = torch.tensor([[3, 5, 5, 11]])
    out = {"scores": row[0].tolist(), "input_ids": ids[0].tolist()}
    out["temperature_0.7"] = nulls(TemperatureLogitsWarper(0.7)(ids, row.clone())[0])
    out["top_k_5"] = nulls(TopKLogitsWarper(5)(ids, row.clone())[0])
    out["top_p_0.8"] = nulls(TopPLogitsWarper(0.8)(ids, row.clone())[0])
    out["top_p_0.3"] = nulls(TopPLogitsWarper(0.3)(ids, row.clone())[0])
    out["repetition_penalty_1.5"] = nulls(RepetitionPenaltyLogitsProcessor(1.5)(ids, row.clone())[0])
    return out


def main(golden):
    import transformers

    out = {"transformers": transformers.__version__, "torch": torch.__version__, "weight_scale": WEIGHT_SCALE,
           "processors": processors()}
    for name in MODELS:
        out[name] = model_cases(load(golden, name))
        print(name, {k: v["output"] for k, v in out[name].items()})
    with open(os.path.join(golden, "generate.json"), "w") as f:
        json.dump(out, f, indent=None, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/golden")
