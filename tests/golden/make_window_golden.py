"""Writes the golden files for zrun's sliding-window attention from Hugging Face transformers (5.17,
float32, eager attention): models whose sliding_window is shorter than the sequences, so the window
masks keys (the script asserts that the logits differ from full causal attention's).

    python3 tests/golden/make_window_golden.py tests/golden

mistral_window: MistralForCausalLM (GQA 4/2, head_dim 16), sliding_window 5, rows of 19 tokens; its
packed form (position_ids restarting inside each row, as TRL's padding-free batches: transformers masks
each sequence to itself and the window inside it when no cache is made, use_cache=False, as in training
with TRL; the script asserts each sequence alone gives the same logits) in mistral_window_packed.
qwen2_window: Qwen2ForCausalLM with use_sliding_window true, sliding_window 6 and max_window_layers 1:
layer 0 attends fully, layer 1 through the window (Qwen2Config's layer_types), rows of 17 tokens.
qwen3_window: Qwen3ForCausalLM (q_norm / k_norm: the unfused path), use_sliding_window with max_window_layers 1
and a window of 6 over rows of 18.
phi3_window: Phi3ForCausalLM (fused qkv_proj / gate_up_proj, partial_rotary_factor 0.75: the unfused path),
sliding_window 7 over rows of 21 tokens.
Each file: the weights, input_ids (and position_ids), labels, logits, loss, every parameter's gradient
and 5 AdamW steps' losses and norms (make_golden.run).
"""
import os
import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_golden import run  # noqa: E402


def differs_from_causal(model, ids, position_ids=None):
    from transformers import AutoModelForCausalLM

    with torch.no_grad():
        a = model(input_ids=ids, position_ids=position_ids, use_cache=False).logits
        cfg = model.config.to_dict()
        cfg["sliding_window"] = None
        cfg.pop("layer_types", None)
        cfg["use_sliding_window"] = False
        full = AutoModelForCausalLM.from_config(type(model.config).from_dict(cfg), attn_implementation="eager").float()
        full.load_state_dict(model.state_dict())
        b = full.eval()(input_ids=ids, position_ids=position_ids, use_cache=False).logits
    d = (a - b).abs().max().item()
    print(f"window vs full causal attention: max logit difference {d:.3e}")
    assert d > 1e-3


def window_model(outdir, name, cls, config_cls, cfg, seed, shape, id_max, masked, layer_types=None, nudge=None):
    """NAME's golden file: a random model (torch seed SEED) of config CFG, input ids of SHAPE below ID_MAX, labels
    -100 at MASKED (a (row, slice) pair), make_golden.run's numbers; the window asserted to change the logits.
    nudge(name, p): draws parameters away from transformers' init (biases, norm weights) so they matter."""
    torch.manual_seed(seed)
    model = cls(config_cls(**cfg, attn_implementation="eager")).float()
    if layer_types:
        assert model.config.layer_types == layer_types, model.config.layer_types
    if nudge:
        with torch.no_grad():
            for n, p in model.named_parameters():
                nudge(n, p)
    ids = torch.randint(0, id_max, shape)
    labels = ids.clone()
    if masked:
        labels[masked[0], masked[1]] = -100
    run(model, ids, labels, f"{outdir}/{name}.safetensors", {"config": cfg})
    model.eval()
    differs_from_causal(model, ids)
    return model, ids, labels


def main(outdir):
    from transformers import (MistralConfig, MistralForCausalLM, Phi3Config, Phi3ForCausalLM, Qwen2Config,
                              Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)

    os.makedirs(outdir, exist_ok=True)
    mcfg = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, vocab_size=61, rms_norm_eps=1e-5, tie_word_embeddings=False,
                max_position_embeddings=64, sliding_window=5,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    model, ids, labels = window_model(outdir, "mistral_window", MistralForCausalLM, MistralConfig, mcfg, 53, (2, 19),
                                      61, (1, slice(-3, None)))

    # packed: row 0 holds sequences of 11 and 8 tokens, row 1 of 3 and 16 (positions restart at each)
    lens = [[11, 8], [3, 16]]
    pos = torch.tensor([[p for n in row for p in range(n)] for row in lens])
    with torch.no_grad():
        packed = model(input_ids=ids, position_ids=pos, use_cache=False).logits
        for b, row in enumerate(lens):
            at = 0
            for n in row:
                alone = model(input_ids=ids[b:b + 1, at:at + n]).logits
                dd = (alone - packed[b:b + 1, at:at + n]).abs().max().item()
                assert dd < 1e-5, "transformers packs"
                at += n
    differs_from_causal(model, ids, pos)
    model.train()
    out = model(input_ids=ids, position_ids=pos, labels=labels, use_cache=False)
    model.zero_grad()
    out.loss.backward()
    t = {"input_ids": ids, "position_ids": pos, "labels": labels, "logits": out.logits.detach(),
         "loss": out.loss.detach().reshape(1)}
    t.update({"grad." + n: p.grad.detach().clone() for n, p in model.named_parameters()})
    save_file({k: v.contiguous() for k, v in t.items()}, f"{outdir}/mistral_window_packed.safetensors",
              metadata={"transformers": __import__("transformers").__version__})
    print("mistral_window_packed loss", float(out.loss))

    def biases(n, p):
        if n.endswith(".bias"):
            p.normal_(0, 0.1)

    def norms(n, p):
        if n.endswith("_norm.weight"):
            p.normal_(1.0, 0.2)

    mixed = ["full_attention", "sliding_attention"]
    qcfg = dict(hidden_size=48, intermediate_size=40, num_hidden_layers=2, num_attention_heads=6,
                num_key_value_heads=2, vocab_size=67, rms_norm_eps=1e-6, tie_word_embeddings=True,
                max_position_embeddings=64, use_sliding_window=True, sliding_window=6, max_window_layers=1,
                rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
    window_model(outdir, "qwen2_window", Qwen2ForCausalLM, Qwen2Config, qcfg, 54, (2, 17), 67, (0, slice(None, 2)),
                 mixed, biases)
    q3cfg = dict(hidden_size=40, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, vocab_size=59, rms_norm_eps=1e-6, tie_word_embeddings=True,
                 max_position_embeddings=64, use_sliding_window=True, sliding_window=6, max_window_layers=1,
                 rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
    window_model(outdir, "qwen3_window", Qwen3ForCausalLM, Qwen3Config, q3cfg, 56, (2, 18), 59, None, mixed, norms)
    pcfg = dict(hidden_size=64, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=53, rms_norm_eps=1e-5, tie_word_embeddings=False,
                max_position_embeddings=64, original_max_position_embeddings=64, sliding_window=7,
                partial_rotary_factor=0.75, pad_token_id=50, bos_token_id=1, eos_token_id=51,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    window_model(outdir, "phi3_window", Phi3ForCausalLM, Phi3Config, pcfg, 55, (2, 21), 50, (1, slice(None, 4)))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/golden")
