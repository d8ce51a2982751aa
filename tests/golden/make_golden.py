"""Writes the golden reference files for zrun's model parity tests with Hugging Face transformers.

Run on a machine with torch + transformers + safetensors (the GPU machine):
    python3 tests/golden/make_golden.py tests/golden
Writes llama_tiny.safetensors and gpt2_tiny.safetensors: the initial weights under Hugging Face
names, the inputs (input_ids, labels with -100 entries), the logits, the loss, every parameter
gradient ("grad.<name>"), and the losses of 5 AdamW steps with gradient clipping. All in float32
on the CPU, eager attention, so zrun's CPU path must match to fp32 rounding.
"""
import json
import sys

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
    tensors["adamw_losses"] = torch.tensor(losses, dtype=torch.float64)
    tensors["adamw_grad_norms"] = torch.tensor(norms, dtype=torch.float64)
    tensors = {k: v.contiguous() for k, v in tensors.items()}
    meta = {"transformers": __import__("transformers").__version__, "torch": torch.__version__}
    meta.update({k: json.dumps(v) for k, v in extra_meta.items()})
    save_file(tensors, out_path, metadata=meta)
    print(out_path, "loss", float(out.loss), "adamw losses", losses)


def main(outdir):
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    lcfg = dict(hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, vocab_size=259, rms_norm_eps=1e-5, rope_theta=10000.0,
                tie_word_embeddings=False, max_position_embeddings=512,
                rope_scaling={"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
                              "high_freq_factor": 4.0, "original_max_position_embeddings": 32})
    model = LlamaForCausalLM(LlamaConfig(**lcfg, attn_implementation="eager")).float()
    ids = torch.randint(0, 259, (2, 41))
    labels = ids.clone()
    labels[1, -7:] = -100
    labels[0, 3] = -100
    run(model, ids, labels, f"{outdir}/llama_tiny.safetensors", {"config": lcfg})

    torch.manual_seed(1)
    gcfg = dict(n_embd=48, n_layer=2, n_head=4, vocab_size=257, n_positions=64, layer_norm_epsilon=1e-5,
                resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=True)
    model = GPT2LMHeadModel(GPT2Config(**gcfg, attn_implementation="eager")).float()
    ids = torch.randint(0, 257, (2, 23))
    labels = ids.clone()
    labels[0, -5:] = -100
    run(model, ids, labels, f"{outdir}/gpt2_tiny.safetensors", {"config": gcfg})


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/golden")
