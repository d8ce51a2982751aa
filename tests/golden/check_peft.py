#!/usr/bin/env python3
"""zr.peft against the real PEFT (0.21) and TRL (1.10): a tiny LlamaForCausalLM and LoRA adapters made by PEFT's
get_peft_model (q_proj + v_proj; "all-linear" with rslora; rank_pattern / alpha_pattern with modules_to_save lm_head;
LoRA on embed_tokens; GPT-2 with bias "all" / "lora_only"; a tied embedding in modules_to_save with
ensure_weight_tying), lora_B set random so the adapter is not a no-op.
(a) zrun reads the base and PEFT's adapter directory and gives transformers + PEFT's logits; (b) the adapter zrun
saves is read by PeftModel.from_pretrained and gives the same logits; (c) TRL's SFTTrainer with peft_config and
zr.SFTTrainer with peft_config from the same base and adapter initialisation log the same losses and gradient norms
step by step (gradient checkpointing on, TRL's default), and the adapters they save agree; (d) merge_and_unload's
weights are PEFT's. fp32 on the CPU (tests/golden/reference.sh).

usage: python3 tests/golden/check_peft.py OUT_DIR [ZRUN] [DATA_DIR]     (prints PASS/FAIL lines)
"""
import json
import os
import sys
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_torch_files as C  # noqa: E402 (its OUT and ZRUN come from the same argv)
from check_sft_trl import pc_rows  # noqa: E402 (prompt-completion rows a tiny model can learn)

warnings.filterwarnings("ignore")
DATA = sys.argv[3] if len(sys.argv) > 3 else "../shared/data"
TOK = f"{DATA}/tokenizers/tinyllama-1.1b-chat-v1.0"
IDS = [[1, 5, 9, 20, 30, 41, 7, 250], [3, 8, 100, 101, 2, 60, 61, 299]]
ADAPTERS = [  # (name, LoraConfig kwargs, zrun's LoraConfig fields)
    ("q_proj + v_proj, r 4, alpha 8", dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
     'r = 4, lora_alpha = 8, target_modules = { "q_proj", "v_proj" }'),
    ("all-linear, r 4, alpha 8, rslora, CAUSAL_LM", dict(r=4, lora_alpha=8, target_modules="all-linear", use_rslora=True,
                                                         task_type="CAUSAL_LM"),
     'r = 4, lora_alpha = 8, target_modules = "all-linear", use_rslora = true, task_type = "CAUSAL_LM"'),
    ("q/v/o_proj, rank_pattern + alpha_pattern, modules_to_save lm_head",
     dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "o_proj"],
          rank_pattern={"q_proj": 2, "layers.1.self_attn.v_proj": 6}, alpha_pattern={"o_proj": 3, r"model\.layers\.0.*q_proj": 5},
          modules_to_save=["lm_head"]),
     r'r = 4, lora_alpha = 8, target_modules = { "q_proj", "v_proj", "o_proj" }, rank_pattern = { q_proj = 2, '
     r'["layers.1.self_attn.v_proj"] = 6 }, alpha_pattern = { o_proj = 3, ["model\\.layers\\.0.*q_proj"] = 5 }, '
     r'modules_to_save = { "lm_head" }'),
    ("embed_tokens + q_proj (LoRA on the embedding)", dict(r=4, lora_alpha=8, target_modules=["embed_tokens", "q_proj"]),
     'r = 4, lora_alpha = 8, target_modules = { "embed_tokens", "q_proj" }'),
]
TRAIN = {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2, "max_steps": 6, "learning_rate": 1e-2,
         "lr_scheduler_type": "constant", "logging_steps": 1, "train_sampling_strategy": "sequential", "seed": 3,
         "max_length": 24}


def tiny_llama(vocab, seed):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                        tie_word_embeddings=False))


def tiny_gpt2(vocab, seed):
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(seed)
    return GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_embd=64, n_layer=2, n_head=4, n_positions=64, resid_pdrop=0.0,
                                      embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=1, eos_token_id=2))


def logits_of(m):
    with torch.no_grad():
        return m(torch.tensor(IDS)).logits.float()


def nudged(pm, which):
    """PEFT model pm with randn * 0.1 added to the parameters which(name, param) picks (so the logits tell whether
    they were read), in eval mode; returns its logits."""
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if which(n, p):
                p.add_(torch.randn_like(p) * 0.1)
    pm.eval()
    return logits_of(pm)


def lua_logits(path):
    """Lua lines for a zrun_lua script: IDS through its model m, the logits saved to path (read by zrun_logits)."""
    ids = json.dumps(IDS).replace("[", "{").replace("]", "}")
    return (f'local ids = zr.tensor({ids}):to("i64")\n'
            f'zr._C.save_safetensors("{path}", {{ logits = zr.no_grad(function() return m(ids).logits end) }}, '
            '{ format = "pt" })')


def zrun_logits(path):
    from safetensors.torch import load_file
    return load_file(path)["logits"]


def main():
    from peft import LoraConfig, PeftModel, get_peft_model
    from safetensors.torch import load_file
    from transformers import LlamaForCausalLM
    os.makedirs(C.OUT, exist_ok=True)
    for k, (name, kw, lua_cfg) in enumerate(ADAPTERS):
        base_dir, ad_dir = f"{C.OUT}/base{k}", f"{C.OUT}/adapter{k}"
        tiny_llama(320, k).save_pretrained(base_dir)
        pm = get_peft_model(LlamaForCausalLM.from_pretrained(base_dir), LoraConfig(**kw))
        torch.manual_seed(100 + k)
        with torch.no_grad():
            for n, p in pm.named_parameters():
                if "lora_B" in n or "lora_embedding_A" in n:  # (the zero halves)
                    p.copy_(torch.randn_like(p) * 0.1)
                elif "modules_to_save" in n:  # (the trained copy unlike the base, so the logits tell it was read)
                    p.add_(torch.randn_like(p) * 0.1)
        pm.eval()
        want = logits_of(pm)
        with pm.disable_adapter():
            want_off = logits_of(pm)
        pm.save_pretrained(ad_dir)
        # (disable_adapter: refused by zrun with modules_to_save, which it trains in place)
        off = "" if "modules_to_save" in kw else (f'zr._C.save_safetensors("{C.OUT}/zrun_off_logits{k}.safetensors", '
                                                  '{ logits = m:disable_adapter(logits) }, { format = "pt" })')
        zsave, zmerged = f"{C.OUT}/zrun_adapter{k}", f"{C.OUT}/zrun_merged{k}"
        rc, out = C.zrun_lua(f"""
local zr = require "zrun"
local m = zr.models.llama.from_pretrained("{base_dir}")
zr.peft.from_pretrained(m, "{ad_dir}")
local ids = zr.tensor({json.dumps(IDS).replace("[", "{").replace("]", "}")}):to("i64")
local function logits() return zr.no_grad(function() return m(ids).logits end) end
zr._C.save_safetensors("{C.OUT}/zrun_logits{k}.safetensors", {{ logits = logits() }}, {{ format = "pt" }})
m:print_trainable_parameters()
{off}
zr.peft.save_pretrained(m, "{zsave}")
m:merge_and_unload()
zr._C.save_safetensors("{C.OUT}/zrun_merged_logits{k}.safetensors", {{ logits = logits() }}, {{ format = "pt" }})
m:save_pretrained("{zmerged}")
""")
        d = (zrun_logits(f"{C.OUT}/zrun_logits{k}.safetensors") - want).abs().max().item() if rc == 0 else None
        print(f"  {name}: zrun's logits of PEFT's adapter differ by {d}", flush=True)
        C.report(f"zrun reads PEFT's adapter ({name}) and gives transformers + PEFT's logits (1e-5)",
                 rc == 0 and d < 1e-5 and d is not None, out[-600:])
        if rc != 0:
            continue
        if off:
            d = (zrun_logits(f"{C.OUT}/zrun_off_logits{k}.safetensors") - want_off).abs().max().item()
            C.report(f"model:disable_adapter(fn) gives PEFT's `with disable_adapter():` logits, the base's (1e-5) ({name})",
                     d < 1e-5, str(d))
        # PEFT's trainable-parameter count (a PeftModel in training mode) next to zrun's line
        tr = get_peft_model(LlamaForCausalLM.from_pretrained(base_dir), LoraConfig(**kw))
        t, a = tr.get_nb_trainable_parameters()
        line = f"trainable params: {t:,d} || all params: {a:,d} || trainable%: {100 * t / a:.4f}"
        C.report(f"print_trainable_parameters prints PEFT's line ({name}, from_pretrained's frozen adapter: 0 trainable)",
                 f"trainable params: 0 || all params: {a:,d} || trainable%: 0.0000" in out, line + " / " + out[-300:])
        # (b) PEFT reads zrun's adapter
        back = PeftModel.from_pretrained(LlamaForCausalLM.from_pretrained(base_dir), zsave)
        back.eval()
        d = (logits_of(back) - want).abs().max().item()
        with open(f"{zsave}/adapter_config.json") as f:
            zc = json.load(f)
        with open(f"{ad_dir}/adapter_config.json") as f:
            pc = json.load(f)
        diff = sorted(key for key in set(zc) | set(pc) if key != "base_model_name_or_path" and (
            sorted(zc.get(key)) if key == "target_modules" and isinstance(zc.get(key), list) else zc.get(key)) != (
            sorted(pc.get(key)) if key == "target_modules" and isinstance(pc.get(key), list) else pc.get(key)))
        print(f"  {name}: PEFT's logits of zrun's adapter differ by {d}; adapter_config.json fields unlike PEFT's: {diff}",
              flush=True)
        C.report(f"PeftModel.from_pretrained reads zrun's save_pretrained ({name}): the same logits (1e-5)", d < 1e-5)
        C.report(f"zrun's adapter_config.json holds PEFT's fields and values ({name})", diff == [], str(diff))
        zk, pk = set(load_file(f"{zsave}/adapter_model.safetensors")), set(load_file(f"{ad_dir}/adapter_model.safetensors"))
        C.report(f"adapter_model.safetensors keys are PEFT's ({name})", zk == pk, str(sorted(zk ^ pk))[:300])
        # (d) merge_and_unload
        merged = pm.merge_and_unload().state_dict()
        zm = load_file(f"{zmerged}/model.safetensors")
        worst = max((zm[n].float() - merged[n].float()).abs().max().item() for n in merged if n in zm)
        missing = [n for n in merged if n not in zm]
        dl = (zrun_logits(f"{C.OUT}/zrun_merged_logits{k}.safetensors") - want).abs().max().item()
        print(f"  {name}: merged weights differ from PEFT's merge_and_unload by {worst} (missing {missing}); merged "
              f"logits from the adapted ones by {dl}", flush=True)
        C.report(f"merge_and_unload: PEFT's merged weights (1e-6) and the adapted logits (1e-5) ({name})",
                 worst < 1e-6 and not missing and dl < 1e-5)
    config_fields()
    embedding_layers()
    trained_biases()
    tied_embedding()
    training()
    print(f"{C.failed} failed")
    sys.exit(1 if C.failed else 0)


def config_fields():
    """zr.peft.LoraConfig{...}:to_dict() (what adapter_config.json holds) against PEFT's LoraConfig(...).to_dict() for
    the same fields: every field and value (sets as sorted lists; runtime_config, which PEFT leaves out of the file,
    dropped)."""
    from peft import LoraConfig
    cases = [dict(), dict(init_lora_weights=False), dict(init_lora_weights="gaussian", lora_dropout=0.05),
             dict(r=16, lora_alpha=32, target_modules=["q_proj", "v_proj"], layers_to_transform=[0, 2],
                  layers_pattern="layers"),
             dict(target_modules=r".*\.q_proj", exclude_modules=["lm_head"], use_rslora=True, task_type="CAUSAL_LM"),
             dict(layers_to_transform=1, target_modules=["k_proj"], fan_in_fan_out=True, inference_mode=True)]

    def lua(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        return "{" + ", ".join(map(lua, v)) + "}" if isinstance(v, list) else json.dumps(v)

    def plain(d):
        d = json.loads(json.dumps(d, default=lambda o: sorted(o) if isinstance(o, set) else getattr(o, "value", o)))
        d.pop("runtime_config", None)
        return {k: sorted(v) if isinstance(v, list) and all(isinstance(x, str) for x in v) else v for k, v in d.items()}
    for kw in cases:
        fields = ", ".join(f"{k} = {lua(v)}" for k, v in kw.items())
        rc, out = C.zrun_lua(f'''local zr = require "zrun"
print("CFG " .. require("zrun.hf").encode_json(zr.peft.LoraConfig {{ {fields} }}:to_dict(), {{ lora_dropout = true }})
  :gsub("\\n", " "))''')
        z = plain(json.loads(out.split("CFG ", 1)[1])) if rc == 0 and "CFG " in out else {}
        p = plain(LoraConfig(**kw).to_dict())
        diff = {k: (z.get(k, "-"), p.get(k, "-")) for k in set(z) | set(p) if z.get(k, "-") != p.get(k, "-")}
        C.report(f"LoraConfig{{{', '.join(kw)}}}: adapter_config.json's fields and values are PEFT's",
                 rc == 0 and not diff, f"(zrun, PEFT): {diff} {out[-300:] if rc else ''}")


def embedding_layers():
    """Base weights PEFT saves beside the adapter (save_embedding_layers: "auto" when lm_head is a target, or
    True): "base_model.model.lm_head.base_layer.weight", "base_model.model.model.embed_tokens.weight".
    PeftModel.from_pretrained reads them into the base model; zrun's from_pretrained must too. The base weights
    are changed before saving, so the logits tell whether they were read."""
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import load_file
    from transformers import LlamaForCausalLM
    cases = [("lm_head targeted (save_embedding_layers \"auto\")",
              dict(r=4, lora_alpha=8, target_modules=["lm_head", "q_proj"]), {}),
             ("save_embedding_layers=True, q_proj targeted", dict(r=4, lora_alpha=8, target_modules=["q_proj"]),
              dict(save_embedding_layers=True))]
    for k, (name, kw, save_kw) in enumerate(cases):
        base_dir, ad_dir = f"{C.OUT}/emb_base{k}", f"{C.OUT}/emb_adapter{k}"
        tiny_llama(320, 20 + k).save_pretrained(base_dir)
        pm = get_peft_model(LlamaForCausalLM.from_pretrained(base_dir), LoraConfig(**kw))
        torch.manual_seed(200 + k)
        # (what PEFT saves)
        want = nudged(pm, lambda n, p: "lora_B" in n or "lm_head" in n or ("embed_tokens" in n and save_kw))
        pm.save_pretrained(ad_dir, **save_kw)
        base_keys = sorted(n for n in load_file(f"{ad_dir}/adapter_model.safetensors") if "lora_" not in n)
        rc, out = C.zrun_lua(f"""
local zr = require "zrun"
local m = zr.models.llama.from_pretrained("{base_dir}")
zr.peft.from_pretrained(m, "{ad_dir}")
{lua_logits(f"{C.OUT}/emb_logits{k}.safetensors")}
zr.peft.save_pretrained(m, "{C.OUT}/emb_zrun{k}", {{ {"save_embedding_layers = true" if save_kw else ""} }})
""")
        d = (zrun_logits(f"{C.OUT}/emb_logits{k}.safetensors") - want).abs().max().item() if rc == 0 else None
        print(f"  {name}: PEFT saved the base weights {base_keys}; zrun's logits differ by {d}", flush=True)
        C.report(f"zrun reads the base weights PEFT saves beside the adapter ({name}): PEFT's logits (1e-5)",
                 rc == 0 and base_keys and d < 1e-5, out[-600:])
        zk = sorted(n for n in load_file(f"{C.OUT}/emb_zrun{k}/adapter_model.safetensors") if "lora_" not in n) if rc == 0 else []
        C.report(f"zrun's save_pretrained writes those base weights as PEFT does ({name})", zk == base_keys,
                 f"zrun {zk}, PEFT {base_keys}")


def trained_biases():
    """bias="all" / "lora_only" on a tiny GPT-2 (PEFT's default target c_attn, Conv1D): the biases PEFT trains, counted
    and saved under PEFT's names ("...c_attn.base_layer.bias"); zrun reads PEFT's adapter (the biases changed, so the
    logits tell whether they were read), PEFT reads zrun's, and the trainable-parameter lines agree."""
    from peft import LoraConfig, PeftModel, get_peft_model
    from safetensors.torch import load_file
    from transformers import GPT2Config, GPT2LMHeadModel
    for k, bias in enumerate(["all", "lora_only"]):
        base_dir, ad_dir, zsave = f"{C.OUT}/bias_base{k}", f"{C.OUT}/bias_adapter{k}", f"{C.OUT}/bias_zrun{k}"
        torch.manual_seed(30 + k)
        GPT2LMHeadModel(GPT2Config(vocab_size=320, n_embd=16, n_layer=2, n_head=2, n_positions=32)).save_pretrained(base_dir)
        pm = get_peft_model(GPT2LMHeadModel.from_pretrained(base_dir), LoraConfig(r=4, bias=bias))
        t, a = pm.get_nb_trainable_parameters()
        want = nudged(pm, lambda n, p: p.requires_grad)
        pm.save_pretrained(ad_dir)
        rc, out = C.zrun_lua(f"""
local zr = require "zrun"
local m = zr.models.gpt2.from_pretrained("{base_dir}")
zr.peft.from_pretrained(m, "{ad_dir}", {{ is_trainable = true }})
m:eval() -- (GPT-2 has dropout)
{lua_logits(f"{C.OUT}/bias_logits{k}.safetensors")}
m:print_trainable_parameters()
zr.peft.save_pretrained(m, "{zsave}")
""")
        d = (zrun_logits(f"{C.OUT}/bias_logits{k}.safetensors") - want).abs().max().item() if rc == 0 else None
        line = f"trainable params: {t:,d} || all params: {a:,d} || trainable%: {100 * t / a:.4f}"
        C.report(f"bias=\"{bias}\": zrun reads PEFT's adapter and its biases, PEFT's logits (1e-5)",
                 rc == 0 and d < 1e-5, f"{d} {out[-600:]}")
        C.report(f"bias=\"{bias}\": print_trainable_parameters prints PEFT's line ({line})", line in out, out[-300:])
        if rc != 0:
            continue
        zk, pk = set(load_file(f"{zsave}/adapter_model.safetensors")), set(load_file(f"{ad_dir}/adapter_model.safetensors"))
        back = PeftModel.from_pretrained(GPT2LMHeadModel.from_pretrained(base_dir), zsave).eval()
        d = (logits_of(back) - want).abs().max().item()
        C.report(f"bias=\"{bias}\": zrun's adapter file holds PEFT's keys, and PEFT reads it back to the same logits",
                 zk == pk and d < 1e-5, f"{sorted(zk ^ pk)} {d}")


def tied_embedding():
    """modules_to_save of a tied embedding with ensure_weight_tying=True (PEFT trains the embedding and the head as one
    copy; its config gains the embedding's full name): zrun reads PEFT's adapter (the copy changed, so the logits tell
    it was read), PEFT reads zrun's, the keys, adapter_config.json and the trainable-parameter lines agree."""
    from peft import LoraConfig, PeftModel, get_peft_model
    from safetensors.torch import load_file
    from transformers import LlamaConfig, LlamaForCausalLM
    for k, mts in enumerate([["embed_tokens"], ["lm_head"]]):
        base_dir, ad_dir, zsave = f"{C.OUT}/tied_base{k}", f"{C.OUT}/tied_adapter{k}", f"{C.OUT}/tied_zrun{k}"
        torch.manual_seed(40 + k)
        LlamaForCausalLM(LlamaConfig(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
                         ).save_pretrained(base_dir)
        kw = dict(r=4, lora_alpha=8, target_modules=["q_proj"], modules_to_save=list(mts), ensure_weight_tying=True)
        pm = get_peft_model(LlamaForCausalLM.from_pretrained(base_dir), LoraConfig(**kw))
        t, a = pm.get_nb_trainable_parameters()
        want = nudged(pm, lambda n, p: p.requires_grad)
        pm.save_pretrained(ad_dir)
        lua_mts = "{ " + ", ".join(json.dumps(x) for x in mts) + " }"
        rc, out = C.zrun_lua(f"""
local zr = require "zrun"
local m = zr.models.llama.from_pretrained("{base_dir}")
zr.peft.from_pretrained(m, "{ad_dir}")
{lua_logits(f"{C.OUT}/tied_logits{k}.safetensors")}
zr.peft.save_pretrained(m, "{zsave}")
local fresh = zr.peft.get_peft_model(zr.models.llama.from_pretrained("{base_dir}"), zr.peft.LoraConfig {{ r = 4,
  lora_alpha = 8, target_modules = {{ "q_proj" }}, modules_to_save = {lua_mts}, ensure_weight_tying = true }})
fresh:print_trainable_parameters()
""")
        d = (zrun_logits(f"{C.OUT}/tied_logits{k}.safetensors") - want).abs().max().item() if rc == 0 else None
        line = f"trainable params: {t:,d} || all params: {a:,d} || trainable%: {100 * t / a:.4f}"
        name = f"tied embedding, modules_to_save {mts}, ensure_weight_tying"
        C.report(f"{name}: zrun reads PEFT's adapter, PEFT's logits (1e-5)", rc == 0 and d < 1e-5, f"{d} {out[-600:]}")
        C.report(f"{name}: print_trainable_parameters prints PEFT's line ({line})", line in out, out[-300:])
        if rc != 0:
            continue
        zk, pk = set(load_file(f"{zsave}/adapter_model.safetensors")), set(load_file(f"{ad_dir}/adapter_model.safetensors"))
        back = PeftModel.from_pretrained(LlamaForCausalLM.from_pretrained(base_dir), zsave).eval()
        d = (logits_of(back) - want).abs().max().item()
        with open(f"{zsave}/adapter_config.json") as f:
            zc = json.load(f)
        with open(f"{ad_dir}/adapter_config.json") as f:
            pc = json.load(f)
        diff = {key: (zc.get(key), pc.get(key)) for key in set(zc) | set(pc)
                if key != "base_model_name_or_path" and zc.get(key) != pc.get(key)}
        C.report(f"{name}: zrun's adapter file holds PEFT's keys, its config PEFT's fields, and PEFT reads it back to the "
                 f"same logits", zk == pk and not diff and d < 1e-5, f"{sorted(zk ^ pk)} {diff} {d}")


def training():
    """(c) TRL's SFTTrainer(peft_config=...) and zr.SFTTrainer{peft_config=...}: the adapter TRL initialises is
    copied into zrun's before training (the same base weights from one directory), then both train on the same rows
    in the same order; every logged loss and gradient norm compared, and the trained adapters."""
    from datasets import Dataset
    from peft import LoraConfig, PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer
    rows = pc_rows(48)
    rows_path = f"{C.OUT}/peft_rows.json"
    with open(rows_path, "w") as f:
        json.dump(rows, f)
    # (GPT-2 too: LoRA on its Conv1D c_attn, with the LoRA layers' biases trained)
    cases = [(n, kw, lua, "llama") for n, kw, lua in ADAPTERS] + [
        ("GPT-2 c_attn (Conv1D), bias lora_only", dict(r=4, lora_alpha=8, bias="lora_only"),
         'r = 4, lora_alpha = 8, bias = "lora_only"', "gpt2")]
    for k, (name, kw, lua_cfg, family) in enumerate(cases):
        tok = AutoTokenizer.from_pretrained(TOK)
        base_dir = f"{C.OUT}/sft_base{k}"
        (tiny_llama if family == "llama" else tiny_gpt2)(len(tok), 10 + k).save_pretrained(base_dir)
        cfg = SFTConfig(output_dir=f"{C.OUT}/peft_trl{k}", report_to="none", bf16=False, use_cpu=True,
                        save_strategy="no", **TRAIN)
        tr = SFTTrainer(model=AutoModelForCausalLM.from_pretrained(base_dir), args=cfg, train_dataset=Dataset.from_list(rows),
                        processing_class=tok, peft_config=LoraConfig(**kw))
        init_dir, trl_out = f"{C.OUT}/peft_init{k}", f"{C.OUT}/peft_trl_final{k}"
        tr.model.save_pretrained(init_dir)
        tr.train()
        tr.save_model(trl_out)
        trl_log = [(h["step"], h["loss"], h["grad_norm"]) for h in tr.state.log_history if "loss" in h]
        lua_args = ", ".join(f"{a} = {json.dumps(v)}" for a, v in sorted(TRAIN.items()))
        zrun_out = f"{C.OUT}/peft_zrun_final{k}"
        rc, out = C.zrun_lua(f"""
local zr = require "zrun"
local cjson = require "cjson"
local f = assert(io.open("{rows_path}")); local rows = cjson.decode(f:read("*a")); f:close()
local tr = zr.SFTTrainer {{ model = zr.models.{family}.from_pretrained("{base_dir}", {{ dtype = "f32" }}),
  processing_class = zr.tokenizers.load("{TOK}"), train_dataset = zr.datasets.Dataset.from_rows(rows),
  peft_config = zr.peft.LoraConfig {{ {lua_cfg} }},
  args = {{ output_dir = "{C.OUT}/peft_zrun{k}", bf16 = false, save_strategy = "no", {lua_args} }} }}
-- TRL's initial adapter (its kaiming draw) into zrun's, by PEFT's names
local own = zr.peft.adapter_state_dict(tr.model)
local fh = zr._C.safetensors_open("{init_dir}/adapter_model.safetensors")
local n, keys = 0, fh:keys()
for _, key in ipairs(keys) do
  if not key:find(".base_layer.", 1, true) then -- (the base weights PEFT saves beside a LoRA embedding: the same)
    assert(own[key], "no " .. key .. " in zrun's adapter")
    zr.no_grad(function() own[key]:copy_(fh:get(key)) end)
    n = n + 1
  end
end
fh:close()
assert(n > 0)
tr:train()
tr:save_model("{zrun_out}")
for _, h in ipairs(tr.state.log_history) do
  if h.loss and h.grad_norm then print(string.format("LOG %d %.7f %.7f", h.step, h.loss, h.grad_norm)) end
end
""")
        z = [(int(x.split()[1]), float(x.split()[2]), float(x.split()[3])) for x in out.splitlines() if x.startswith("LOG ")]
        print(f"  {name}: TRL  {[(s, round(l, 6), round(g, 6)) for s, l, g in trl_log]}\n"
              f"  {name}: zrun {[(s, round(l, 6), round(g, 6)) for s, l, g in z]}", flush=True)
        # (check_sft_trl.py's tolerances: the loss within 2e-4 relative, the gradient norm within 5e-4)
        ok = rc == 0 and len(z) == len(trl_log) > 0 and all(
            a[0] == b[0] and abs(a[1] - b[1]) <= 2e-4 * abs(b[1]) and abs(a[2] - b[2]) <= 5e-4 * abs(b[2]) + 1e-6
            for a, b in zip(z, trl_log))
        C.report(f"zr.SFTTrainer{{peft_config=}} logs TRL's SFTTrainer(peft_config=) losses and gradient norms, step by "
                 f"step ({name})", ok, out[-600:])
        if rc != 0:
            continue
        files = sorted(os.listdir(zrun_out))
        zt, tt = load_file(f"{zrun_out}/adapter_model.safetensors"), load_file(f"{trl_out}/adapter_model.safetensors")
        # (the key third of GPT-2's c_attn bias has a zero gradient in exact arithmetic, softmax ignoring a shift of
        # the keys: Adam turns its rounding noise into full steps on both sides, so it is left out)
        for n in list(tt):
            if n.endswith("c_attn.base_layer.bias") and n in zt:
                keep = torch.arange(tt[n].numel()) // (tt[n].numel() // 3) != 1
                tt[n], zt[n] = tt[n][keep], zt[n][keep]
        worst = max((zt[n] - tt[n]).abs().max().item() for n in tt) if set(zt) == set(tt) else None
        scale = max(t.abs().max().item() for t in tt.values())
        print(f"  {name}: zrun's save_model wrote {files}; trained adapters differ by {worst} (largest value {scale})",
              flush=True)
        # (GPT-2's: 5e-4: a few elements whose gradient crosses zero take Adam steps that differ by a little of lr,
        # the losses and gradient norms agreeing to 1e-6)
        tol = 1e-4 if family == "llama" else 5e-4
        C.report(f"Trainer:save_model writes the trained adapter, TRL's within {tol:g} of its largest value ({name})",
                 "adapter_model.safetensors" in files and "model.safetensors" not in files and worst is not None
                 and worst <= tol * scale)
        # base_model_name_or_path: TRL's (PEFT's) is the base's name_or_path, which AutoPeftModelForCausalLM loads
        bases = []
        for d in (zrun_out, trl_out):
            with open(f"{d}/adapter_config.json") as f:
                bases.append(json.load(f).get("base_model_name_or_path"))
        try:
            from peft import AutoPeftModelForCausalLM
            auto = AutoPeftModelForCausalLM.from_pretrained(zrun_out).eval()
            da = (logits_of(auto) - logits_of(PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir),
                                                                         zrun_out).eval())).abs().max().item()
        except Exception as e:  # noqa: BLE001 (reported)
            da = repr(e)[-300:]
        C.report(f"zrun's adapter_config.json names the base as TRL's does ({bases[0]}) and AutoPeftModelForCausalLM "
                 f"loads it: PeftModel.from_pretrained's logits ({name})", bases[0] == bases[1] and da == 0,
                 f"zrun {bases[0]}, TRL {bases[1]}; {da}")


if __name__ == "__main__":
    C.one_process_world()
    main()
