#!/usr/bin/env python3
"""zrun's Phi-3 against transformers 5.17 and PEFT 0.21 (tests/golden/reference.sh), fp32 on the CPU:
(a) LoRA adapters: PEFT 0.21 has no default target_modules for phi3 (get_peft_model raises; so does zrun's),
qkv_proj and qkv_proj + o_proj + gate_up_proj + down_proj: the adapter zrun's get_peft_model makes has PEFT's tensor names and shapes (one LoRA over the fused
q/k/v product), zrun reads PEFT's adapter to PEFT's logits, and PEFT reads zrun's adapter to the same logits;
(b) save_pretrained: the Phi-3 zrun saves (plain; partial rotary + longrope + tied) is loaded by transformers'
AutoModelForCausalLM to zrun's logits, with transformers' state-dict names.

usage: python3 tests/golden/check_phi3.py OUT_DIR [ZRUN]     (prints PASS/FAIL lines)
"""
import json
import os
import sys
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_torch_files as C  # noqa: E402 (its OUT and ZRUN come from the same argv)

warnings.filterwarnings("ignore")
IDS = [[1, 5, 9, 20, 30, 41, 7, 50, 3, 4, 11, 12, 13, 14, 15, 16, 17, 18, 19, 21], [3, 8, 10, 11, 2, 60, 61, 29] * 2 + [1, 2, 3, 4]]
LORAS = [("qkv_proj", dict(r=4, lora_alpha=8, target_modules=["qkv_proj"]),
          'r = 4, lora_alpha = 8, target_modules = { "qkv_proj" }'),
         ("qkv_proj, o_proj, gate_up_proj, down_proj", dict(r=4, lora_alpha=8, target_modules=[
             "qkv_proj", "o_proj", "gate_up_proj", "down_proj"]),
          'r = 4, lora_alpha = 8, target_modules = { "qkv_proj", "o_proj", "gate_up_proj", "down_proj" }')]


def tiny(seed, **kw):
    from transformers import Phi3Config, Phi3ForCausalLM
    torch.manual_seed(seed)
    cfg = dict(hidden_size=64, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
               vocab_size=80, pad_token_id=79, bos_token_id=1, eos_token_id=79, max_position_embeddings=64,
               original_max_position_embeddings=64)
    cfg.update(kw)
    m = Phi3ForCausalLM(Phi3Config(**cfg)).float()
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() == 2:
                p.mul_(8)
    return m


def logits_of(m):
    with torch.no_grad():
        return m(input_ids=torch.tensor(IDS)).logits


def read(path):
    from safetensors.torch import load_file
    return load_file(path)["logits"]


def lua_ids():
    return json.dumps(IDS).replace("[", "{").replace("]", "}")


def main():
    from peft import LoraConfig, PeftModel, get_peft_model
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM
    os.makedirs(C.OUT, exist_ok=True)
    base = f"{C.OUT}/phi3_base"
    tiny(5).save_pretrained(base)
    try:
        get_peft_model(AutoModelForCausalLM.from_pretrained(base), LoraConfig(r=4))
        peft_refuses = False
    except ValueError:
        peft_refuses = True
    rc, out = C.zrun_lua(f"""
local zr = require "zrun"
local ok, err = pcall(zr.peft.get_peft_model, zr.models.from_pretrained("{base}"), zr.peft.LoraConfig {{ r = 4 }})
print(ok, err)
""")
    C.report("phi3 LoRA without target_modules: refused by PEFT and by zrun (no default for phi3)",
             peft_refuses and "no default target_modules for model_type phi3" in out, out[-300:])
    for k, (name, kw, lua_cfg) in enumerate(LORAS):
        ad, zad = f"{C.OUT}/phi3_adapter{k}", f"{C.OUT}/phi3_zrun_adapter{k}"
        pm = get_peft_model(AutoModelForCausalLM.from_pretrained(base), LoraConfig(**kw))
        torch.manual_seed(50 + k)
        with torch.no_grad():
            for n, p in pm.named_parameters():
                if "lora_B" in n:
                    p.copy_(torch.randn_like(p) * 0.1)
        pm.eval()
        want = logits_of(pm)
        pm.save_pretrained(ad)
        rc, out = C.zrun_lua(f"""
local zr = require "zrun"
local m = zr.models.from_pretrained("{base}")
local fresh = zr.peft.get_peft_model(zr.models.from_pretrained("{base}"), zr.peft.LoraConfig {{ {lua_cfg} }})
zr.peft.save_pretrained(fresh, "{zad}_fresh")
zr.peft.from_pretrained(m, "{ad}")
local ids = zr.tensor({lua_ids()}):to("i64")
zr._C.save_safetensors("{C.OUT}/phi3_lora_logits{k}.safetensors", {{ logits = zr.no_grad(function() return m(ids).logits end) }},
  {{ format = "pt" }})
zr.peft.save_pretrained(m, "{zad}")
""")
        if rc != 0:
            C.report(f"phi3 LoRA ({name}): zrun ran", False, out[-800:])
            continue
        pk = {n: tuple(t.shape) for n, t in load_file(f"{ad}/adapter_model.safetensors").items()}
        zk = {n: tuple(t.shape) for n, t in load_file(f"{zad}_fresh/adapter_model.safetensors").items()}
        print(f"  {name}: PEFT's adapter tensors {sorted(pk.items())[:4]} ...", flush=True)
        C.report(f"phi3 LoRA ({name}): zrun's get_peft_model adapter has PEFT's tensor names and shapes", pk == zk,
                 str(sorted(set(pk.items()) ^ set(zk.items())))[:400])
        d = (read(f"{C.OUT}/phi3_lora_logits{k}.safetensors") - want).abs().max().item()
        C.report(f"phi3 LoRA ({name}): zrun reads PEFT's adapter to PEFT's logits (1e-5): {d:.2e}", d < 1e-5)
        back = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), zad).eval()
        d = (logits_of(back) - want).abs().max().item()
        C.report(f"phi3 LoRA ({name}): PEFT reads zrun's adapter to the same logits (1e-5): {d:.2e}", d < 1e-5)
    saves = [("plain, sliding_window 2047", dict(sliding_window=2047)),
             ("partial_rotary_factor 0.75, longrope, tied", dict(
                 tie_word_embeddings=True, partial_rotary_factor=0.75, original_max_position_embeddings=16,
                 rope_parameters={"rope_type": "longrope", "rope_theta": 250000.0, "partial_rotary_factor": 0.75,
                                  "short_factor": [1.0, 1.5, 2.0, 3.0, 4.0, 5.0],
                                  "long_factor": [2.0, 3.0, 5.0, 8.0, 13.0, 21.0]}))]
    for k, (name, kw) in enumerate(saves):
        src, dst = f"{C.OUT}/phi3_src{k}", f"{C.OUT}/phi3_saved{k}"
        tiny(7 + k, **kw).save_pretrained(src)
        rc, out = C.zrun_lua(f"""
local zr = require "zrun"
local m = zr.models.phi3.from_pretrained("{src}")
m:save_pretrained("{dst}")
local ids = zr.tensor({lua_ids()}):to("i64")
zr._C.save_safetensors("{C.OUT}/phi3_saved_logits{k}.safetensors", {{ logits = zr.no_grad(function() return m(ids).logits end) }},
  {{ format = "pt" }})
""")
        if rc != 0:
            C.report(f"phi3 save_pretrained ({name}): zrun ran", False, out[-800:])
            continue
        back = AutoModelForCausalLM.from_pretrained(dst, dtype=torch.float32).eval()
        orig = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
        d = (logits_of(back) - read(f"{C.OUT}/phi3_saved_logits{k}.safetensors")).abs().max().item()
        d0 = (logits_of(orig) - logits_of(back)).abs().max().item()
        names = set(load_file(f"{dst}/model.safetensors")) == set(orig.state_dict()) - (
            {"lm_head.weight"} if orig.config.tie_word_embeddings else set())
        same_cfg = back.config.rope_parameters == orig.config.rope_parameters and \
            back.config.sliding_window == orig.config.sliding_window
        C.report(f"phi3 save_pretrained ({name}): transformers loads it to zrun's logits ({d:.2e}) and the source's "
                 f"({d0:.2e}), transformers' names and rope/window config", d < 1e-5 and d0 < 1e-5 and names and same_cfg,
                 f"names {names} rope {back.config.rope_parameters} vs {orig.config.rope_parameters}")
    print(f"{C.failed} failed")
    sys.exit(1 if C.failed else 0)


if __name__ == "__main__":
    main()
