"""Writes the golden reference files for zrun's Gemma 3 text models (model_type "gemma3_text") against transformers.

Run where torch + transformers (5.x) + safetensors are (the GPU machine, or a CPU one):
    python3 tests/golden/make_gemma3_golden.py tests/golden
As make_golden.py (its run and write_configs: weights, inputs, logits, loss, gradients, 5 AdamW steps; float32,
eager attention; config.json in transformers 5's and 4's layouts) for two tiny Gemma3ForCausalLM models whose norm
weights are drawn at random (transformers starts them at zero, where (1 + w) and w cannot be told apart), gate_proj's
and up_proj's large enough that the GELU's form matters:
  gemma3_a: tied, head_dim 32 with query_pre_attn_scalar 24 (the scale is not 1/sqrt(head_dim)), sliding window 8
    over 24 tokens in every other layer (sliding_window_pattern 2), the full layers' rope "linear" (factor 4) on
    theta 1e6 and the sliding ones' the local base 1e4, GELU-tanh gating, pad_token_id 0;
  gemma3_b: untied, attention_bias, the exact (erf) GELU, layer_types given, both ropes' thetas given.
gemma3_generate.json: gemma3_a's greedy continuation of a 5-token prompt by 14 tokens (past its window), and
gemma3_norm: one Gemma3RMSNorm in bfloat16 (x (64, 256), weight ~ N(0, 0.5)): its output and, for a given dy, the
gradients of x and the weight, which tell Gemma's one rounding ((x_hat * (1 + w)) in f32, then bf16) from Llama's two.
"""
import copy
import json
import os
import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_golden import run, write_configs  # noqa: E402


def legacy_gemma3(cfg):
    """config.json as transformers 4.5x wrote Gemma3TextConfig: rope_theta (full_attention's), rope_local_base_freq
    (sliding_attention's), rope_scaling (full_attention's when scaled) at the top level, torch_dtype for dtype."""
    old = copy.deepcopy(cfg)
    rope = old.pop("rope_parameters")
    full, slide = dict(rope["full_attention"]), dict(rope["sliding_attention"])
    old["rope_theta"] = full.pop("rope_theta")
    old["rope_local_base_freq"] = slide.pop("rope_theta")
    old["rope_scaling"] = full if full.get("rope_type", "default") != "default" else None
    if "dtype" in old:
        old["torch_dtype"] = old.pop("dtype")
    old["transformers_version"] = "4.53.0"
    return old


def random_norms(model, std):
    """The norms' weights ~ N(0, std), and gate_proj's and up_proj's ~ N(0, 0.25) so that the GELU sees values of
    order one (where its tanh and erf forms differ) and its output counts."""
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("norm.weight"):
                p.normal_(0.0, std)
            elif n.endswith("gate_proj.weight") or n.endswith("up_proj.weight"):
                p.normal_(0.0, 0.25)


def main(outdir):
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm

    os.makedirs(outdir, exist_ok=True)
    torch.manual_seed(17)
    acfg = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                num_key_value_heads=2, head_dim=32, vocab_size=101, rms_norm_eps=1e-6, query_pre_attn_scalar=24,
                sliding_window=8, sliding_window_pattern=2, max_position_embeddings=512,
                rope_parameters={"full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1000000.0},
                                 "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}})
    model = Gemma3ForCausalLM(Gemma3TextConfig(**acfg, attn_implementation="eager")).float()
    random_norms(model, 0.3)
    ids = torch.randint(1, 101, (2, 24))
    ids[1, 3] = 0  # the padding token: its embedding row is frozen (padding_idx)
    labels = ids.clone()
    labels[1, -4:] = -100
    t = run(model, ids, labels, f"{outdir}/gemma3_a.safetensors", {"config": acfg})
    model.eval()
    write_configs(model, outdir, "gemma3_a", ids, t["logits"], legacy=legacy_gemma3)
    # greedy generation past the window (8): a 5-token prompt and 14 new tokens, no eos
    model.generation_config.eos_token_id = None
    prompt = ids[0:1, :5]
    with torch.no_grad():
        gen = model.generate(prompt, max_new_tokens=14, do_sample=False)
    with open(f"{outdir}/gemma3_generate.json", "w") as f:
        json.dump({"prompt": prompt[0].tolist(), "ids": gen[0].tolist()}, f)
    print("gemma3_a greedy", gen[0].tolist())

    torch.manual_seed(8)
    bcfg = dict(hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=2,
                num_key_value_heads=1, head_dim=16, vocab_size=89, rms_norm_eps=1e-5, query_pre_attn_scalar=16,
                sliding_window=6, layer_types=["full_attention", "sliding_attention"], tie_word_embeddings=False,
                attention_bias=True, hidden_activation="gelu", max_position_embeddings=256,
                rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 50000.0},
                                 "sliding_attention": {"rope_type": "default", "rope_theta": 500.0}})
    model = Gemma3ForCausalLM(Gemma3TextConfig(**bcfg, attn_implementation="eager")).float()
    random_norms(model, 0.3)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith(".bias"):
                p.normal_(0.0, 0.05)
    ids = torch.randint(1, 89, (2, 18))
    labels = ids.clone()
    labels[0, 0] = -100
    t = run(model, ids, labels, f"{outdir}/gemma3_b.safetensors", {"config": bcfg})
    model.eval()
    write_configs(model, outdir, "gemma3_b", ids, t["logits"], legacy=legacy_gemma3)

    torch.manual_seed(9)
    norm = Gemma3RMSNorm(256, eps=1e-6).to(torch.bfloat16)
    with torch.no_grad():
        norm.weight.normal_(0.0, 0.5)
    x = (torch.randn(64, 256) * 3).to(torch.bfloat16).requires_grad_(True)
    dy = torch.randn(64, 256).to(torch.bfloat16)
    y = norm(x)
    y.backward(dy)
    save_file({"x": x.detach(), "weight": norm.weight.detach().clone(), "dy": dy, "y": y.detach(),
               "dx": x.grad, "dweight": norm.weight.grad},
              f"{outdir}/gemma3_norm.safetensors",
              metadata={"transformers": __import__("transformers").__version__, "torch": torch.__version__})
    print(f"{outdir}/gemma3_norm.safetensors")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/golden")
