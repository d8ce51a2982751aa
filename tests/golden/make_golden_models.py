"""Writes the golden files for zrun's Mistral and Qwen2 (the Llama architecture's two neighbours)
from Hugging Face transformers, as make_golden.py does for Llama and GPT-2 (its run / write_configs).

    python3 tests/golden/make_golden_models.py tests/golden

mistral_tiny: MistralForCausalLM, GQA 4/2, an explicit head_dim (12, not hidden_size / heads = 8),
untied head, rope_theta 1e6 (Mistral v0.3's), sliding_window 24 over rows of exactly 24 tokens: the
longest rows the window leaves causal (transformers masks a key when q - k >= sliding_window), so the
golden logits are plain causal attention's; the script checks that 25 tokens would be masked.
qwen2_tiny: Qwen2ForCausalLM, biases on q/k/v (drawn at random, not zero, so they matter), none on
o_proj or the MLP, 7 query heads per kv head (as Qwen2.5-0.5B's 14/2 and 7B's 28/4), tied head, rope_theta 1e6, Qwen2.5's sliding-window fields (use_sliding_window
false: the window is off). NAME.legacy_config.json is the config in transformers 4's layout; for
qwen2 as Qwen2.5's files hold it (sliding_window 32768, max_window_layers, no layer_types).

hf_model_defaults.json: for a few minimal config.json files (only the required sizes), the fields
transformers 5 fills (AutoConfig.from_pretrained ... to_dict()), for zrun's defaults test.
"""
import json
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_golden import legacy_layout, run, write_configs  # noqa: E402


def randomize_biases(model, std):
    with torch.no_grad():  # transformers starts biases at zero; make them matter
        for n, p in model.named_parameters():
            if n.endswith(".bias"):
                p.normal_(0, std)


def window_matters(model, ids):
    """The logits of ids plus one more token differ from those of a model without the window: the
    window is real past its length (so zrun must refuse such rows, not compute full attention)."""
    from transformers import AutoModelForCausalLM

    longer = torch.cat([ids, ids[:, :1]], dim=1)
    with torch.no_grad():
        a = model(input_ids=longer).logits
        cfg = model.config.to_dict()
        cfg["sliding_window"] = None
        full = AutoModelForCausalLM.from_config(type(model.config).from_dict(cfg), attn_implementation="eager").float()
        full.load_state_dict(model.state_dict())
        b = full.eval()(input_ids=longer).logits
        same = full(input_ids=ids).logits
        at_window = (model(input_ids=ids).logits - same).abs().max().item()
    d = (a - b).abs().max().item()
    print(f"window: {ids.shape[1]} tokens differ from causal by {at_window:.2e}; {longer.shape[1]} tokens by {d:.2e}")
    assert at_window == 0 and d > 1e-3


def defaults(outdir):
    from transformers import AutoConfig

    # 32 heads: a multiple of both defaults of num_key_value_heads (Mistral 8, Qwen2 32)
    sizes = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=32, vocab_size=100)
    cases = {
        "mistral": dict(model_type="mistral", **sizes),
        "mistral_sliding_window_null": dict(model_type="mistral", sliding_window=None, **sizes),
        "qwen2": dict(model_type="qwen2", **sizes),
        "qwen2_use_sliding_window": dict(model_type="qwen2", use_sliding_window=True, max_window_layers=1, **sizes),
    }
    keys = ["num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps", "initializer_range",
            "tie_word_embeddings", "sliding_window", "use_sliding_window", "max_window_layers", "layer_types",
            "rope_parameters", "hidden_act", "attention_dropout", "attention_bias", "mlp_bias"]
    out = {}
    with tempfile.TemporaryDirectory() as d:
        for name, cfg in cases.items():
            with open(f"{d}/config.json", "w") as f:
                json.dump(cfg, f)
            full = AutoConfig.from_pretrained(d).to_dict()
            out[name] = {"config": cfg, "transformers": {k: full.get(k) for k in keys if k in full}}
    with open(f"{outdir}/hf_model_defaults.json", "w") as f:
        f.write(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print("hf_model_defaults.json:", json.dumps(out, sort_keys=True))


def qwen2_legacy(cfg):
    old = legacy_layout(cfg)
    old.pop("layer_types", None)
    old["sliding_window"] = 32768
    return old


def main(outdir):
    from transformers import MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

    os.makedirs(outdir, exist_ok=True)
    torch.manual_seed(3)
    mcfg = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=12, vocab_size=61, rms_norm_eps=1e-5, tie_word_embeddings=False,
                max_position_embeddings=64, sliding_window=24,
                rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
    model = MistralForCausalLM(MistralConfig(**mcfg, attn_implementation="eager")).float()
    ids = torch.randint(0, 61, (2, 24))
    labels = ids.clone()
    labels[1, -5:] = -100
    t = run(model, ids, labels, f"{outdir}/mistral_tiny.safetensors", {"config": mcfg})
    model.eval()
    window_matters(model, ids)
    write_configs(model, outdir, "mistral_tiny", ids, t["logits"])

    torch.manual_seed(4)
    qcfg = dict(hidden_size=56, intermediate_size=48, num_hidden_layers=2, num_attention_heads=7,
                num_key_value_heads=1, vocab_size=67, rms_norm_eps=1e-6, tie_word_embeddings=True,
                max_position_embeddings=128, use_sliding_window=False, sliding_window=32768, max_window_layers=21,
                rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
    model = Qwen2ForCausalLM(Qwen2Config(**qcfg, attn_implementation="eager")).float()
    randomize_biases(model, 0.1)
    ids = torch.randint(0, 67, (2, 32))
    labels = ids.clone()
    labels[0, -6:] = -100
    labels[1, 2] = -100
    t = run(model, ids, labels, f"{outdir}/qwen2_tiny.safetensors", {"config": qcfg})
    model.eval()
    write_configs(model, outdir, "qwen2_tiny", ids, t["logits"], legacy=qwen2_legacy)

    defaults(outdir)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/golden")
