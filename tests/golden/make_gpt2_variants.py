"""Writes tests/golden/gpt2_variants.safetensors: GPT2LMHeadModel (transformers 5.17, float32, CPU,
eager attention, train mode with every dropout 0) for each GPT2Config field that changes the
computation, on one tiny shape. For variant V it holds V.<param> (the initial weights), V.logits,
V.loss and V.grad.<param>; the inputs input_ids and labels (-100 entries) are shared, and the
metadata maps each variant to its config (JSON). Also tests/golden/gpt2_openai_bin/: the "gelu_new" base
variant as openai-community/gpt2's pytorch_model.bin holds it (torch.save, no "transformer." prefix, no
lm_head, the causal-mask buffers h.N.attn.bias (float, then bool) and h.N.attn.masked_bias) with a
transformers-4 config.json (n_ctx, no dtype); "openai_bin.logits" are transformers 5.17's logits from
that directory (eval). Read by tests/lua/test_gpt2_variants.lua.
    /tmp/zrun-ref/bin/python tests/golden/make_gpt2_variants.py tests/golden
"""
import json
import sys

import torch
from safetensors.torch import save_file

BASE = dict(n_embd=8, n_layer=2, n_head=2, vocab_size=23, n_positions=12, resid_pdrop=0.0, embd_pdrop=0.0,
            attn_pdrop=0.0, initializer_range=0.5)
VARIANTS = {
    "gelu": dict(activation_function="gelu"),
    "gelu_pytorch_tanh": dict(activation_function="gelu_pytorch_tanh"),
    "relu": dict(activation_function="relu"),
    "silu": dict(activation_function="silu"),
    "quick_gelu": dict(activation_function="quick_gelu"),
    "n_inner": dict(n_inner=20),
    "unscaled": dict(scale_attn_weights=False),
    "inverse_layer_idx": dict(scale_attn_by_inverse_layer_idx=True),
    "reorder_upcast": dict(reorder_and_upcast_attn=True, scale_attn_by_inverse_layer_idx=True),
    "layer_norm_epsilon": dict(layer_norm_epsilon=0.5),
    "untied": dict(tie_word_embeddings=False),
}


def openai_bin(outdir, ids):
    """Writes outdir/gpt2_openai_bin (see above) and returns transformers' logits loading it."""
    import os
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(1)
    model = GPT2LMHeadModel(GPT2Config(**BASE)).float()
    d = f"{outdir}/gpt2_openai_bin"
    os.makedirs(d, exist_ok=True)
    sd = {k.replace("transformer.", ""): v.clone() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    P = BASE["n_positions"]
    sd["h.0.attn.bias"] = torch.tril(torch.ones(P, P)).view(1, 1, P, P)
    sd["h.1.attn.bias"] = torch.tril(torch.ones(P, P, dtype=torch.bool)).view(1, 1, P, P)
    for i in range(BASE["n_layer"]):
        sd[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    torch.save(sd, f"{d}/pytorch_model.bin")
    cfg = dict(BASE, model_type="gpt2", architectures=["GPT2LMHeadModel"], n_ctx=BASE["n_positions"],
               activation_function="gelu_new", transformers_version="4.26.0")
    with open(f"{d}/config.json", "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
    back = GPT2LMHeadModel.from_pretrained(d, attn_implementation="eager").eval()
    with torch.no_grad():
        return back(input_ids=ids).logits


def main(outdir):
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    ids = torch.randint(0, BASE["vocab_size"], (2, 9))
    labels = ids.clone()
    labels[0, -3:] = -100
    tensors = {"input_ids": ids, "labels": labels}
    meta = {"transformers": __import__("transformers").__version__, "torch": torch.__version__}
    for name, extra in VARIANTS.items():
        torch.manual_seed(1)
        cfg = dict(BASE, **extra)
        model = GPT2LMHeadModel(GPT2Config(**cfg, attn_implementation="eager")).float()
        with torch.no_grad():  # biases and LayerNorm weights start at 0 / 1: make them matter
            for n, p in model.named_parameters():
                if n.endswith(".bias") or ".ln_" in n:
                    p.add_(torch.randn_like(p) * 0.1)
        model.train()
        for n, p in model.named_parameters():
            tensors[f"{name}.{n}"] = p.detach().clone()
        out = model(input_ids=ids, labels=labels)
        out.loss.backward()
        for n, p in model.named_parameters():
            tensors[f"{name}.grad.{n}"] = p.grad.detach().clone()
        tensors[f"{name}.logits"] = out.logits.detach()
        tensors[f"{name}.loss"] = out.loss.detach().reshape(1)
        meta[name] = json.dumps(cfg)
        print(name, float(out.loss))
    tensors["openai_bin.logits"] = openai_bin(outdir, ids)
    save_file({k: v.contiguous() for k, v in tensors.items()}, f"{outdir}/gpt2_variants.safetensors", metadata=meta)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/golden")
