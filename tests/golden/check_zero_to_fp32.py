"""Checks that `zrun zero-to-fp32` output loads into Hugging Face transformers with
load_state_dict(strict=True) (a tied head aside: transformers ties lm_head.weight to the
embedding itself) and gives zrun's logits. Run where transformers is installed (the GPU machine, or tests/golden/reference.sh on the CPU):
    ./zrun tests/golden/save_zero_for_hf_check.lua DIR
    python3 tests/golden/check_zero_to_fp32.py DIR
Prints PASS/FAIL lines and "N passed, N failed"."""
import sys

import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM

d = sys.argv[1]
exp = load_file(f"{d}/expected.safetensors")
names = sorted({k.rsplit(".", 1)[0] for k in exp})
ok = 0
for name in names:
    try:
        cfg = AutoConfig.from_pretrained(f"{d}/{name}")
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation="eager").eval()
        sd = load_file(f"{d}/{name}/model.safetensors")
        tied = getattr(cfg, "tie_word_embeddings", False)
        if tied:  # the one key transformers does not need in the file: it ties the head itself
            sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
        model.load_state_dict(sd, strict=True)
        with torch.no_grad():
            logits = model(input_ids=exp[f"{name}.input_ids"]).logits
        diff = (logits - exp[f"{name}.logits"]).abs().max().item()
        if diff < 1e-4:
            print(f"PASS {name}: {len(sd) - (1 if tied else 0)} tensors load with strict=True, max logit diff {diff:.2e}")
            ok += 1
        else:
            print(f"FAIL {name}: max logit diff {diff:.3e}")
    except Exception as e:  # noqa: BLE001 - report any loading failure as a test failure
        print(f"FAIL {name}: {type(e).__name__}: {e}")
print(f"{ok} passed, {len(names) - ok} failed")
