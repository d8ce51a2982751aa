"""Writes a random-init Hugging Face Llama model directory (or Mistral / Qwen2: the config's model_type picks
the class, as AutoModelForCausalLM), as transformers saves it today (the GPU machine has transformers 5.x):
config.json from a given config (e.g. Llama-3.2-1B's from shared/data), bf16 safetensors, and a tokenizer.json
copied beside it.
    python3 tests/bench/make_random_llama.py CONFIG_JSON TOKENIZER_JSON OUT_DIR [seed]
Used by tests/bench/finetune_vs_hf.sh; not part of the build or the test suite."""
import json
import shutil
import sys

import torch
from transformers import AutoConfig, AutoModelForCausalLM


def main():
    cfg_path, tok_path, out = sys.argv[1], sys.argv[2], sys.argv[3]
    seed = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    with open(cfg_path) as f:
        raw = json.load(f)
    raw.pop("torch_dtype", None)
    raw.pop("dtype", None)
    cfg = AutoConfig.for_model(raw.pop("model_type", "llama"), **raw)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    shutil.copy(tok_path, out + "/tokenizer.json")
    n = sum(p.numel() for p in model.parameters())
    print(f"wrote {out}: {n / 1e9:.3f}B parameters, bf16, config keys: {sorted(json.load(open(out + '/config.json')))}")


if __name__ == "__main__":
    main()
