"""Checks that a model directory written by zrun (zr.hf.save_pretrained) loads in Hugging Face
transformers and gives zrun's logits. Run where transformers is installed (the GPU machine):
    python3 tests/golden/check_hf_save.py DIR     # DIR holds model/ and expected.safetensors
Prints PASS/FAIL lines and "N passed, N failed"."""
import sys

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

d = sys.argv[1]
exp = load_file(f"{d}/expected.safetensors")
ok = 0
for name in ("llama", "gpt2"):
    try:
        model = AutoModelForCausalLM.from_pretrained(f"{d}/{name}", torch_dtype=torch.float32,
                                                     attn_implementation="eager").eval()
        with torch.no_grad():
            logits = model(input_ids=exp[f"{name}.input_ids"]).logits
        diff = (logits - exp[f"{name}.logits"]).abs().max().item()
        if diff < 1e-4:
            print(f"PASS transformers loads zrun's {name} directory (max logit diff {diff:.2e})")
            ok += 1
        else:
            print(f"FAIL {name}: max logit diff {diff:.3e}")
    except Exception as e:  # noqa: BLE001 - report any loading failure as a test failure
        print(f"FAIL {name}: {type(e).__name__}: {e}")
print(f"{ok} passed, {2 - ok} failed")
