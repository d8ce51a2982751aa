"""Writes the golden files for zrun's Phi-3 (Phi3ForCausalLM) from transformers 5.17, as make_golden.py does for
Llama (its run / write_configs), on the CPU in float32 with eager attention:

    /tmp/zrun-ref/bin/python tests/golden/make_phi3_golden.py tests/golden

phi3_tiny: Phi-3-mini-4k's shape in small: fused qkv_proj / gate_up_proj, GQA 4/2, untied head, pad_token_id 66
  inside a 70 vocabulary (Phi-3's 32000 in 32064), sliding_window 24 over rows of 24 tokens (the longest the
  window leaves causal; the script checks that 25 tokens would be masked).
phi3_partial: Phi-4-mini's in small: partial_rotary_factor 0.75 (12 of 16 channels rotated), tied head, longrope
  over rows of 40 tokens past original_max_position_embeddings 16 (the long factors).
phi3_longrope / phi3_longrope_short: Phi-3.5-mini's in small: the whole head rotated, longrope, the same weights
  over 40 tokens (long factors) and 12 tokens (short factors); the attention factor from
  max_position_embeddings / original_max_position_embeddings (no factor given, as Phi-3.5's config.json).
phi3_generate.json: greedy generate() of each (every 2-D weight times 16, as make_generate_golden.py): a
  prompt of 7 tokens, 24 and 30 new tokens (phi3_tiny's 37 pass its window) and a left-padded batch. For
  longrope past original_max_position_embeddings the reference is generate(use_cache=False), the whole rows'
  forward each step: transformers 5.17's cached generate drops its cache at that step
  (Phi3ForCausalLM.prepare_inputs_for_generation) and then sees only the new token (checked and recorded here
  as "cached_differs").
phi3_defaults.json: what Phi3Config fills for minimal config.json files.
"""
import json
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_golden import run, write_configs  # noqa: E402
from make_golden_models import window_matters  # noqa: E402
from make_generate_golden import left_pad  # noqa: E402

SHORT = [1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0]
LONG = [1.5, 2.0, 4.0, 8.0, 12.0, 16.0, 24.0, 32.0]


def build(cfg):
    from transformers import Phi3Config, Phi3ForCausalLM

    return Phi3ForCausalLM(Phi3Config(**cfg, attn_implementation="eager")).float()


def labels_of(ids, k):
    labels = ids.clone()
    labels[0, -k:] = -100
    labels[1, 1] = -100
    return labels


def generate_cases(model, name):
    g = torch.Generator().manual_seed(99)
    V = model.config.vocab_size
    single = torch.randint(3, V - 4, (1, 7), generator=g)
    rows = [torch.randint(3, V - 4, (n,), generator=g) for n in (5, 9, 3)]
    out = {}
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(16)
        longrope = model.config.rope_parameters.get("rope_type") == "longrope"
        for case, n in (("single", 24), ("long", 30)):
            ref = model.generate(single, do_sample=False, max_new_tokens=n, eos_token_id=None, use_cache=False)
            cached = model.generate(single, do_sample=False, max_new_tokens=n, eos_token_id=None)
            crosses = longrope and single.shape[1] + n > model.config.original_max_position_embeddings
            if not crosses:
                assert torch.equal(ref, cached), f"{name} {case}: cached generate differs without crossing"
            out[case] = {"input_ids": single.tolist(), "max_new_tokens": n, "eos_token_id": False,
                         "output": ref.tolist(), "cached_differs": bool(not torch.equal(ref, cached))}
        ids, mask = left_pad(rows, 0)
        g2 = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=6, pad_token_id=0,
                            eos_token_id=None)
        out["batch"] = {"input_ids": ids.tolist(), "attention_mask": mask.tolist(), "max_new_tokens": 6,
                        "pad_token_id": 0, "eos_token_id": False, "output": g2.tolist()}
    print(name, {k: (v["output"], v.get("cached_differs")) for k, v in out.items()})
    return out


def defaults(outdir):
    from transformers import AutoConfig

    sizes = dict(model_type="phi3", hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 vocab_size=32064)
    cases = {
        "phi3": sizes,
        "phi3_nulls": dict(sizes, pad_token_id=None, sliding_window=None, num_key_value_heads=None),
        "phi3_longrope": dict(sizes, max_position_embeddings=131072, original_max_position_embeddings=4096,
                              rope_scaling={"type": "longrope", "short_factor": SHORT, "long_factor": LONG}),
        "phi3_partial": dict(sizes, partial_rotary_factor=0.75,
                             rope_scaling={"type": "longrope", "short_factor": SHORT[:6], "long_factor": LONG[:6]}),
    }
    keys = ["num_key_value_heads", "max_position_embeddings", "original_max_position_embeddings", "rms_norm_eps",
            "initializer_range", "tie_word_embeddings", "sliding_window", "rope_parameters", "hidden_act",
            "attention_dropout", "resid_pdrop", "embd_pdrop", "bos_token_id", "eos_token_id", "pad_token_id"]
    out = {}
    with tempfile.TemporaryDirectory() as d:
        for name, cfg in cases.items():
            with open(f"{d}/config.json", "w") as f:
                json.dump(cfg, f)
            full = AutoConfig.from_pretrained(d).to_dict()
            out[name] = {"config": cfg, "transformers": {k: full.get(k) for k in keys}}
    with open(f"{outdir}/phi3_defaults.json", "w") as f:
        f.write(json.dumps(out, indent=1, sort_keys=True) + "\n")


def main(outdir):
    os.makedirs(outdir, exist_ok=True)
    gen = {}

    torch.manual_seed(21)
    cfg = dict(hidden_size=48, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
               vocab_size=70, rms_norm_eps=1e-5, tie_word_embeddings=False, max_position_embeddings=64,
               original_max_position_embeddings=64, sliding_window=24, pad_token_id=66, bos_token_id=1,
               eos_token_id=67, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    model = build(cfg)
    ids = torch.randint(0, 66, (2, 24))
    t = run(model, ids, labels_of(ids, 5), f"{outdir}/phi3_tiny.safetensors", {"config": cfg})
    model.eval()
    window_matters(model, ids)
    write_configs(model, outdir, "phi3_tiny", ids, t["logits"])
    gen["phi3_tiny"] = generate_cases(model, "phi3_tiny")

    torch.manual_seed(22)
    cfg = dict(hidden_size=64, intermediate_size=56, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
               vocab_size=73, rms_norm_eps=1e-5, tie_word_embeddings=True, max_position_embeddings=64,
               original_max_position_embeddings=16, pad_token_id=72, bos_token_id=72, eos_token_id=72,
               partial_rotary_factor=0.75,
               rope_parameters={"rope_type": "longrope", "rope_theta": 250000.0, "partial_rotary_factor": 0.75,
                                "short_factor": SHORT[:6], "long_factor": LONG[:6]})
    model = build(cfg)
    ids = torch.randint(0, 72, (2, 40))
    t = run(model, ids, labels_of(ids, 6), f"{outdir}/phi3_partial.safetensors", {"config": cfg})
    model.eval()
    write_configs(model, outdir, "phi3_partial", ids, t["logits"])
    gen["phi3_partial"] = generate_cases(model, "phi3_partial")

    cfg = dict(hidden_size=64, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
               vocab_size=71, rms_norm_eps=1e-5, tie_word_embeddings=False, max_position_embeddings=64,
               original_max_position_embeddings=16, pad_token_id=70, bos_token_id=1, eos_token_id=70,
               rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": SHORT,
                                "long_factor": LONG})
    for name, T in (("phi3_longrope", 40), ("phi3_longrope_short", 12)):
        torch.manual_seed(23)
        model = build(cfg)
        ids = torch.randint(0, 70, (2, T))
        t = run(model, ids, labels_of(ids, 3), f"{outdir}/{name}.safetensors", {"config": cfg})
        model.eval()
        write_configs(model, outdir, name, ids, t["logits"])
    gen["phi3_longrope"] = generate_cases(model, "phi3_longrope")

    import transformers
    gen["transformers"] = transformers.__version__
    with open(os.path.join(outdir, "phi3_generate.json"), "w") as f:
        json.dump(gen, f, indent=None, separators=(",", ":"), sort_keys=True)
        f.write("\n")
    defaults(outdir)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/golden")
