"""Writes the golden files for zrun's Qwen3 (Qwen3ForCausalLM: Llama's architecture with an RMSNorm over
each head of q and k before the rope) from Hugging Face transformers, as make_golden_models.py does for
Mistral and Qwen2 (make_golden.py's run / write_configs).

    /tmp/zrun-ref/bin/python tests/golden/make_golden_qwen3.py tests/golden

qwen3_tiny: GQA 4/2, head_dim 16 (not hidden_size / heads = 10), tied head, no biases (attention_bias
false, Qwen3's default), rope_theta 1e6, the window fields as Qwen3-0.6B's config.json holds them
(use_sliding_window false, sliding_window null); q_norm and k_norm weights drawn around 1 (transformers
starts them at ones) so that each norm's weight matters and a swapped pair would show.
qwen3_bias: attention_bias true (biases on q/k/v/o, drawn at random), 6 query heads over 3 kv heads,
head_dim 8 (hidden 32), untied head, use_sliding_window true with sliding_window 24 from layer 1 on
(max_window_layers 1) over rows of exactly 24 tokens: causal attention (the script checks that 25 tokens
would be masked, so zrun must refuse them).
qwen3_tiny_lora.safetensors: PEFT 0.21's LoRA on qwen3_tiny (LoraConfig(r=4, lora_alpha=8, lora_dropout=0),
PEFT's default targets for qwen3, q_proj and v_proj), lora_B drawn at random (PEFT starts it at zero):
the adapter weights under zrun's names (base_model.model.<module>.lora_A.weight), logits, loss and every
adapter gradient on qwen3_tiny's batch.
qwen3_defaults.json: for minimal config.json files (only the required sizes), the fields transformers 5
fills (AutoConfig.from_pretrained ... to_dict()), for zrun's defaults test.
"""
import json
import os
import sys
import tempfile

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_golden import run, write_configs  # noqa: E402


def randomize(model, bias_std, norm_std):
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith(".bias"):
                p.normal_(0, bias_std)
            elif n.endswith("q_norm.weight") or n.endswith("k_norm.weight"):
                p.normal_(1, norm_std)


def window_matters(model, ids):
    """As make_golden_models.window_matters, the model without the window being use_sliding_window false (and its
    layer_types filled again): rows of ids are causal, one token more is masked in the sliding layer."""
    from transformers import AutoModelForCausalLM

    longer = torch.cat([ids, ids[:, :1]], dim=1)
    cfg = model.config.to_dict()
    cfg.update(use_sliding_window=False, layer_types=None)
    full = AutoModelForCausalLM.from_config(type(model.config).from_dict(cfg), attn_implementation="eager").float()
    full.load_state_dict(model.state_dict())
    full.eval()
    with torch.no_grad():
        at_window = (model(input_ids=ids).logits - full(input_ids=ids).logits).abs().max().item()
        d = (model(input_ids=longer).logits - full(input_ids=longer).logits).abs().max().item()
    print(f"window: {ids.shape[1]} tokens differ from causal by {at_window:.2e}; {longer.shape[1]} tokens by {d:.2e}")
    assert at_window == 0 and d > 1e-4  # (one key of one query in one layer: small, far above rounding)


def defaults(outdir):
    from transformers import AutoConfig

    sizes = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=32, vocab_size=100)
    cases = {
        "qwen3": dict(model_type="qwen3", **sizes),
        "qwen3_use_sliding_window": dict(model_type="qwen3", use_sliding_window=True, max_window_layers=1, **sizes),
        "qwen3_kv_null": dict(model_type="qwen3", num_key_value_heads=None, **sizes),
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
    with open(f"{outdir}/qwen3_defaults.json", "w") as f:
        f.write(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print("qwen3_defaults.json:", json.dumps(out, sort_keys=True))


def lora(model, ids, labels, out_path):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(6)
    pm = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0))
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05)
    pm.train()
    out = pm(input_ids=ids, labels=labels)
    out.loss.backward()
    tensors = {}
    for n, p in pm.named_parameters():
        if "lora_" in n:
            name = n.replace(".default.", ".")
            tensors[name] = p.detach().clone()
            tensors["grad." + name] = p.grad.detach().clone()
    targets = sorted({n.split(".lora_")[0].rsplit(".", 1)[1] for n in tensors})
    tensors["logits"] = out.logits.detach()
    tensors["loss"] = out.loss.detach().reshape(1)
    tensors = {k: v.contiguous() for k, v in tensors.items()}
    import peft
    save_file(tensors, out_path, metadata={"peft": peft.__version__, "targets": json.dumps(targets),
                                           "lora": json.dumps({"r": 4, "lora_alpha": 8, "lora_dropout": 0})})
    print(out_path, "targets", targets, "loss", float(out.loss))
    pm.unload()


def main(outdir):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    os.makedirs(outdir, exist_ok=True)
    torch.manual_seed(7)
    cfg = dict(hidden_size=40, intermediate_size=56, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, head_dim=16, vocab_size=71, rms_norm_eps=1e-6, tie_word_embeddings=True,
               max_position_embeddings=128, use_sliding_window=False, sliding_window=None, max_window_layers=28,
               rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
    model = Qwen3ForCausalLM(Qwen3Config(**cfg, attn_implementation="eager")).float()
    randomize(model, 0.1, 0.3)
    ids = torch.randint(0, 71, (2, 32))
    labels = ids.clone()
    labels[0, -6:] = -100
    labels[1, 2] = -100
    t = run(model, ids, labels, f"{outdir}/qwen3_tiny.safetensors", {"config": cfg})
    model.eval()
    write_configs(model, outdir, "qwen3_tiny", ids, t["logits"])
    lora(model, ids, labels, f"{outdir}/qwen3_tiny_lora.safetensors")

    torch.manual_seed(8)
    cfg = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=6,
               num_key_value_heads=3, head_dim=8, vocab_size=53, rms_norm_eps=1e-5, tie_word_embeddings=False,
               attention_bias=True, max_position_embeddings=64, use_sliding_window=True, sliding_window=24,
               max_window_layers=1, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    model = Qwen3ForCausalLM(Qwen3Config(**cfg, attn_implementation="eager")).float()
    randomize(model, 0.1, 0.3)
    ids = torch.randint(0, 53, (2, 24))
    labels = ids.clone()
    labels[1, -5:] = -100
    t = run(model, ids, labels, f"{outdir}/qwen3_bias.safetensors", {"config": cfg})
    model.eval()
    window_matters(model, ids)
    write_configs(model, outdir, "qwen3_bias", ids, t["logits"])

    defaults(outdir)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/golden")
