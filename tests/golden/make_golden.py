"""Writes the golden reference files for zrun's model parity tests with Hugging Face transformers.

Run on a machine with torch + transformers (5.x) + safetensors (the GPU machine):
    python3 tests/golden/make_golden.py tests/golden
For each model it writes NAME.safetensors: the initial weights under Hugging Face names, the inputs
(input_ids, labels with -100 entries), the logits, the loss, every parameter gradient
("grad.<name>"), and the losses of 5 AdamW steps with gradient clipping; all float32 on the CPU,
eager attention, so zrun's CPU path must match to fp32 rounding. Next to it, NAME.config.json is
the config.json that transformers' save_pretrained writes (transformers 5: rope_parameters,
"dtype"), and NAME.legacy_config.json the same model in the layout transformers 4 wrote
(top-level rope_theta and rope_scaling, "torch_dtype"); the script checks that transformers loads
both to the same logits.

Models: llama_tiny (GQA 4/2, untied head, rope_theta 500000 with llama3 scaling over 64 positions,
past original_max_position_embeddings=32, so theta and scaling both move the logits), llama_linear
(linear rope scaling, attention and MLP biases, tied head, head_dim from hidden_size) and gpt2_tiny.
"""
import copy
import json
import os
import sys
import tempfile

import torch
from safetensors.torch import save_file


def run(model, input_ids, labels, out_path, extra_meta):
    model.train()
    out = model(input_ids=input_ids, labels=labels)
    out.loss.backward()
    tensors = {n: p.detach().clone() for n, p in model.named_parameters()}
    init = {n: p.detach().clone() for n, p in model.named_parameters()}
    tensors.update({"grad." + n: p.grad.detach().clone() for n, p in model.named_parameters()})
    tensors["input_ids"] = input_ids
    tensors["labels"] = labels
    tensors["logits"] = out.logits.detach()
    tensors["loss"] = out.loss.detach().reshape(1)
    # 5 optimizer steps from the initial weights: AdamW + global-norm clipping at 1.0.
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(init[n])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    losses, norms = [], []
    for _ in range(5):
        opt.zero_grad(set_to_none=True)
        loss = model(input_ids=input_ids, labels=labels).loss
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)))
        opt.step()
        losses.append(float(loss))
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(init[n])
    tensors["adamw_losses"] = torch.tensor(losses, dtype=torch.float64)
    tensors["adamw_grad_norms"] = torch.tensor(norms, dtype=torch.float64)
    tensors = {k: v.contiguous() for k, v in tensors.items()}
    meta = {"transformers": __import__("transformers").__version__, "torch": torch.__version__}
    meta.update({k: json.dumps(v) for k, v in extra_meta.items()})
    save_file(tensors, out_path, metadata=meta)
    print(out_path, "loss", float(out.loss), "adamw losses", losses)
    return tensors


def legacy_layout(cfg):
    """config.json as transformers 4.x wrote it: rope_theta and rope_scaling at the top level
    (no rope_scaling for the default rope), torch_dtype instead of dtype."""
    old = copy.deepcopy(cfg)
    rope = old.pop("rope_parameters", None)
    if rope is not None:
        rope = dict(rope)
        old["rope_theta"] = rope.pop("rope_theta")
        old["rope_scaling"] = rope if rope.get("rope_type", "default") != "default" else None
    if "dtype" in old:
        old["torch_dtype"] = old.pop("dtype")
    old["transformers_version"] = "4.46.0"
    return old


def write_configs(model, outdir, name, input_ids, logits, legacy=legacy_layout):
    """Saves the model with save_pretrained, keeps its config.json, writes the legacy variant
    (legacy(config)), and checks that transformers loads both (with the saved weights) to the
    logits of the original."""
    from transformers import AutoConfig, AutoModelForCausalLM

    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d)
        with open(f"{d}/config.json") as f:
            text = f.read()
        new = json.loads(text)
        with open(f"{outdir}/{name}.config.json", "w") as f:
            f.write(text)
        old = legacy(new)
        with open(f"{outdir}/{name}.legacy_config.json", "w") as f:
            f.write(json.dumps(old, indent=2, sort_keys=True) + "\n")
        for label, cfg in (("transformers-5 config.json", new), ("legacy config.json", old)):
            with open(f"{d}/config.json", "w") as f:
                json.dump(cfg, f)
            back = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
            with torch.no_grad():
                diff = (back(input_ids=input_ids).logits - logits).abs().max().item()
            rp = getattr(AutoConfig.from_pretrained(d), "rope_parameters", None)
            print(f"{name}: {label}: rope_parameters={rp} max logit diff {diff:.2e}")
            assert diff < 1e-5, f"{name}: transformers does not load its own {label} to the same logits"


def main(outdir):
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    os.makedirs(outdir, exist_ok=True)
    torch.manual_seed(0)
    lcfg = dict(hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, vocab_size=259, rms_norm_eps=1e-5,
                tie_word_embeddings=False, max_position_embeddings=256,
                rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                 "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                 "original_max_position_embeddings": 32})
    model = LlamaForCausalLM(LlamaConfig(**lcfg, attn_implementation="eager")).float()
    ids = torch.randint(0, 259, (2, 64))
    labels = ids.clone()
    labels[1, -7:] = -100
    labels[0, 3] = -100
    t = run(model, ids, labels, f"{outdir}/llama_tiny.safetensors", {"config": lcfg})
    model.eval()
    write_configs(model, outdir, "llama_tiny", ids, t["logits"])

    torch.manual_seed(2)
    lcfg = dict(hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                vocab_size=97, rms_norm_eps=1e-6, tie_word_embeddings=True, attention_bias=True, mlp_bias=True,
                max_position_embeddings=64, rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0})
    model = LlamaForCausalLM(LlamaConfig(**lcfg, attn_implementation="eager")).float()
    with torch.no_grad():  # biases start at zero; make them matter
        for n, p in model.named_parameters():
            if n.endswith(".bias"):
                p.normal_(0, 0.02)
    ids = torch.randint(0, 97, (2, 37))
    labels = ids.clone()
    labels[0, -4:] = -100
    t = run(model, ids, labels, f"{outdir}/llama_linear.safetensors", {"config": lcfg})
    model.eval()
    write_configs(model, outdir, "llama_linear", ids, t["logits"])

    torch.manual_seed(1)
    gcfg = dict(n_embd=48, n_layer=2, n_head=4, vocab_size=257, n_positions=64, layer_norm_epsilon=1e-5,
                resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=True)
    model = GPT2LMHeadModel(GPT2Config(**gcfg, attn_implementation="eager")).float()
    ids = torch.randint(0, 257, (2, 23))
    labels = ids.clone()
    labels[0, -5:] = -100
    t = run(model, ids, labels, f"{outdir}/gpt2_tiny.safetensors", {"config": gcfg})
    model.eval()
    write_configs(model, outdir, "gpt2_tiny", ids, t["logits"])


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/golden")
