"""Checks that model directories written by zrun's save_pretrained load in Hugging Face transformers
and give zrun's logits. Run where transformers is installed (the GPU machine, or tests/golden/reference.sh on the CPU):
    ./zrun tests/golden/save_for_hf_check.lua DIR          # on the dev machine
    python3 tests/golden/check_hf_save.py DIR              # DIR holds <name>/ and expected.safetensors
Prints PASS/FAIL lines (with the rope parameters transformers resolved) and "N passed, N failed"."""
import os
import sys

import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM

d = sys.argv[1]
exp = load_file(f"{d}/expected.safetensors")
names = sorted({k.rsplit(".", 1)[0] for k in exp})
results = []


def check(what, fn):
    """Runs fn() -> (passed, message) and prints PASS/FAIL message; any exception fails the check."""
    try:
        good, msg = fn()
    except Exception as e:  # noqa: BLE001 - report any loading failure as a test failure
        good, msg = False, f"{what}: {type(e).__name__}: {e}"
    print(("PASS " if good else "FAIL ") + msg)
    results.append(good)


def model_dir(name):
    cfg = AutoConfig.from_pretrained(f"{d}/{name}")
    model = AutoModelForCausalLM.from_pretrained(f"{d}/{name}", dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    with torch.no_grad():
        logits = model(input_ids=exp[f"{name}.input_ids"]).logits
    diff = (logits - exp[f"{name}.logits"]).abs().max().item()
    rope = getattr(cfg, "rope_parameters", None)
    if diff < 1e-4:
        return True, f"transformers loads zrun's {name} directory (max logit diff {diff:.2e}; rope {rope})"
    return False, f"{name}: max logit diff {diff:.3e} (rope {rope})"


for name in names:
    check(name, lambda: model_dir(name))


# generation_config.json: a model directory's own generation settings survive zrun's from_pretrained -> save_pretrained
# (transformers' save_pretrained writes model.generation_config back), as transformers reads them
def generation():
    want, got = (AutoModelForCausalLM.from_pretrained(f"{d}/generation/{w}").generation_config.to_diff_dict()
                 for w in ("src", "out"))
    want.pop("transformers_version", None)
    got.pop("transformers_version", None)
    if want == got:
        return True, f"transformers reads the generation_config.json zrun saves as the source's ({want})"
    return False, f"generation_config: source {want}, zrun's save {got}"


if os.path.isdir(f"{d}/generation"):
    check("generation_config", generation)


# a tokenizer saved alone: AutoTokenizer reads zrun's folder as the source (class, special tokens, ids)
def tokenizer():
    from transformers import AutoTokenizer
    src = open(f"{d}/tokenizer/source.txt").read().strip()
    text = "Hello world <|endoftext|> zrun's tokenizer: 1234 ünïcode"
    want, got = ((type(t).__name__, t.bos_token, t.eos_token, t.unk_token, t.model_max_length, t(text).input_ids)
                 for t in (AutoTokenizer.from_pretrained(w) for w in (src, f"{d}/tokenizer")))
    if want == got:
        return True, f"AutoTokenizer reads the tokenizer zrun saved as its source ({want[:5]})"
    return False, f"tokenizer: source {want}, zrun's save {got}"


if os.path.isfile(f"{d}/tokenizer/source.txt"):
    check("tokenizer", tokenizer)
print(f"{sum(results)} passed, {len(results) - sum(results)} failed")
