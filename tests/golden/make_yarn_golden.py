"""Writes the golden reference files for zrun's YaRN rope (rope_type "yarn") parity with transformers.

Run where torch + transformers (5.x) + safetensors are (the GPU machine, or a CPU one):
    python3 tests/golden/make_yarn_golden.py tests/golden
As make_golden.py (its run and write_configs: weights, inputs, logits, loss, gradients, 5 AdamW steps; float32,
eager attention; config.json in transformers 5's and 4's layouts), for two tiny models whose sequences run past
original_max_position_embeddings, so that the blend of the frequencies and the attention factor both move the
logits: qwen2_yarn (Qwen2, head_dim 32, factor 4 over 64 original positions, 96 tokens; attention_factor from factor)
and llama_yarn (Llama, head_dim 16, factor 8 over 256, mscale / mscale_all_dim 1 / 0.5 (DeepSeek's form), beta_fast 16,
beta_slow 2, truncate false: the correction range 0.69 .. 2.23, which truncation would make 0 .. 3).
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_golden import run, write_configs  # noqa: E402


def main(outdir):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    os.makedirs(outdir, exist_ok=True)
    torch.manual_seed(5)
    qcfg = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                num_key_value_heads=1, vocab_size=101, rms_norm_eps=1e-6, tie_word_embeddings=True,
                max_position_embeddings=256, use_sliding_window=False,
                rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                 "original_max_position_embeddings": 64})
    model = Qwen2ForCausalLM(Qwen2Config(**qcfg, attn_implementation="eager")).float()
    ids = torch.randint(0, 101, (2, 96))
    labels = ids.clone()
    labels[1, -5:] = -100
    t = run(model, ids, labels, f"{outdir}/qwen2_yarn.safetensors", {"config": qcfg})
    model.eval()
    write_configs(model, outdir, "qwen2_yarn", ids, t["logits"])

    torch.manual_seed(6)
    lcfg = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, vocab_size=89, rms_norm_eps=1e-5, tie_word_embeddings=False,
                max_position_embeddings=2048,
                rope_parameters={"rope_type": "yarn", "rope_theta": 50000.0, "factor": 8.0,
                                 "original_max_position_embeddings": 256, "mscale": 1.0, "mscale_all_dim": 0.5,
                                 "beta_fast": 16.0, "beta_slow": 2.0, "truncate": False})
    model = LlamaForCausalLM(LlamaConfig(**lcfg, attn_implementation="eager")).float()
    ids = torch.randint(0, 89, (2, 80))
    labels = ids.clone()
    labels[0, 2] = -100
    t = run(model, ids, labels, f"{outdir}/llama_yarn.safetensors", {"config": lcfg})
    model.eval()
    write_configs(model, outdir, "llama_yarn", ids, t["logits"])


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/golden")
