"""Writes tests/golden/sft_llama3_phi3.json: the rows TRL 1.10's SFTTrainer (transformers 5.17, on the CPU) prepares
from conversations with Llama 3.x's and Phi-3's chat templates (the tokenizers and templates of
tests/golden/llama3_phi3_chat/, written by make_llama3_phi3_chat_golden.py): messages and conversational
prompt-completion rows, with and without assistant_only_loss, for which TRL renders every row with its training copy
of a template it knows (trl/chat_templates/*_training.jinja: Meta-Llama-3's, Phi-3-mini's, Phi-3.5-mini's) and raises
for one it does not (Llama 3.1's, Llama 3.2's). Each case: its tokenizer, rows, SFTConfig options, and TRL's prepared
rows (input_ids, labels) or the error it raised. And TRL's training copies of the three templates
(get_training_chat_template) rendered over the conversations of llama3_phi3_chat.json each template renders and of the
rows here, with and without add_generation_prompt: the text and the assistant mask (return_assistant_tokens_mask), or
the error; the copies' own text is not stored. Read by tests/lua/test_sft_llama3_phi3.lua.
    /tmp/zrun-ref/bin/python tests/golden/make_sft_llama3_phi3_golden.py
(needs torch, transformers, datasets and trl: tests/golden/reference.sh's venv). Not part of the build or the suite."""
import json
import os
import tempfile
import warnings

import datasets
import torch
from datasets import Dataset
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
from trl import SFTConfig, SFTTrainer
from trl.chat_template_utils import get_training_chat_template

warnings.filterwarnings("ignore")
datasets.disable_progress_bars()
HERE = os.path.dirname(os.path.abspath(__file__))
DIR = os.path.join(HERE, "llama3_phi3_chat")
TOKS = {"llama": os.path.join(DIR, "tok_llama3"), "phi": os.path.join(DIR, "tok_phi3")}
TRAINED = {"llama3": "llama", "phi3": "phi", "phi3_5": "phi"}  # the templates TRL patches, and their tokenizer


def msg(role, content):
    return {"role": role, "content": content}


ROWS = [
    {"messages": [msg("user", "2+2?"), msg("assistant", "4")]},
    {"messages": [msg("system", "Be brief."), msg("user", "first?"), msg("assistant", " a1 \n"),
                  msg("user", "second?"), msg("assistant", "a2\n\nwith lines.")]},
    {"messages": [msg("system", ""), msg("user", "caf\u00e9 \U0001F600?"), msg("assistant", "r\u00e9ponse \U0001F389")]},
    {"messages": [msg("user", "q"), msg("assistant", "a"), msg("user", "ends on a user turn")]},
]
PC_ROWS = [
    {"prompt": [msg("user", "2+2?")], "completion": [msg("assistant", "4")]},
    {"prompt": [msg("system", "sys"), msg("user", "a?"), msg("assistant", "b"), msg("user", "c?")],
     "completion": [msg("assistant", "d\n")]},
]

CASES = [
    # (name, tokenizer, rows, options); options' chat_template_path names a template of llama3_phi3_chat/
    ("Meta-Llama-3's template (the tokenizer's own), messages", "llama", ROWS, {}),
    ("Meta-Llama-3's, messages, assistant_only_loss (TRL's training copy)", "llama", ROWS, {"assistant_only_loss": True}),
    ("Meta-Llama-3's, assistant_only_loss, max_length 24", "llama", ROWS, {"assistant_only_loss": True, "max_length": 24}),
    ("Meta-Llama-3's, prompt-completion messages, assistant_only_loss", "llama", PC_ROWS, {"assistant_only_loss": True}),
    ("Llama 3.1's template without assistant_only_loss", "llama", ROWS, {"chat_template_path": "llama3_1"}),
    ("Llama 3.1's template, assistant_only_loss (no training copy)", "llama", ROWS,
     {"assistant_only_loss": True, "chat_template_path": "llama3_1"}),
    ("Llama 3.2's template, assistant_only_loss (no training copy)", "llama", ROWS,
     {"assistant_only_loss": True, "chat_template_path": "llama3_2"}),
    ("Phi-3's template (the tokenizer's own), messages", "phi", ROWS, {}),
    ("Phi-3's, messages, assistant_only_loss (TRL's training copy)", "phi", ROWS, {"assistant_only_loss": True}),
    ("Phi-3's, prompt-completion messages, assistant_only_loss", "phi", PC_ROWS, {"assistant_only_loss": True}),
    ("Phi-3's, prompt-completion messages", "phi", PC_ROWS, {}),
    ("Phi-3.5's template, messages, assistant_only_loss", "phi", ROWS,
     {"assistant_only_loss": True, "chat_template_path": "phi3_5"}),
    ("Phi-3.5's, assistant_only_loss, max_length 20, keep_end", "phi", ROWS,
     {"assistant_only_loss": True, "chat_template_path": "phi3_5", "max_length": 20, "truncation_mode": "keep_end"}),
]

# conversations beyond the chat golden's: contents that are not strings (Llama's trim prints them; Phi's + refuses)
EXTRA = [
    [msg("user", "q"), msg("assistant", None)],
    [msg("user", [{"type": "text", "text": "blocks"}]), msg("assistant", "a")],
    [msg("user", "q"), msg("assistant", 42)],
]


def read(name):
    with open(os.path.join(DIR, name + ".jinja"), encoding="utf-8") as f:
        return f.read()


def training_renders():
    """TRL's training copies rendered (zrun.sft_templates makes its own: they must render the same text and masks)."""
    with open(os.path.join(HERE, "llama3_phi3_chat.json"), encoding="utf-8") as f:
        chat = json.load(f)
    renders = {}
    for r in chat["renders"]:
        if r["template"] in TRAINED:
            renders.setdefault(r["template"], set()).add(r["conversation"])
    convs = [c["messages"] for c in chat["conversations"]]
    base = len(convs)
    convs += EXTRA + [r["messages"] for r in ROWS] + [r["prompt"] + r["completion"] for r in PC_ROWS]
    out = {"training_conversations": [{"messages": c} for c in convs], "training_renders": []}
    for name, which in TRAINED.items():
        tok = AutoTokenizer.from_pretrained(TOKS[which])
        tok.chat_template = read(name)
        training = get_training_chat_template(tok)
        assert training is not None and "generation" in training
        for i, c in enumerate(convs):
            if i < base and i not in renders[name]:
                continue
            for agp in (False, True):
                rec = {"conversation": i, "template": name, "add_generation_prompt": agp}
                try:
                    rec["text"] = tok.apply_chat_template(c, chat_template=training, add_generation_prompt=agp,
                                                          tokenize=False)
                    enc = tok.apply_chat_template(c, chat_template=training, add_generation_prompt=agp,
                                                  return_dict=True, return_assistant_tokens_mask=True)
                    rec["assistant_masks"] = "".join(str(m) for m in enc["assistant_masks"])
                except Exception as e:  # noqa: BLE001 (the render records what the template raised)
                    rec["error"] = type(e).__name__
                out["training_renders"].append(rec)
    return out


def main():
    work = tempfile.mkdtemp()
    out = training_renders()
    out["cases"] = []
    for name, which, rows, opts in CASES:
        tok = AutoTokenizer.from_pretrained(TOKS[which])  # (a fresh one: chat_template_path replaces its template)
        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32,
                                             num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1))
        args = dict(opts)
        if "chat_template_path" in args:
            args["chat_template_path"] = os.path.join(DIR, args["chat_template_path"] + ".jinja")
        cfg = SFTConfig(output_dir=os.path.join(work, "out"), report_to="none", bf16=False, use_cpu=True, **args)
        rec = {"name": name, "tokenizer": which, "train": rows, "options": opts}
        try:
            tr = SFTTrainer(model=model, args=cfg, train_dataset=Dataset.from_list(rows), processing_class=tok)
            rec["train_rows"] = [{"input_ids": list(r["input_ids"]), "labels": list(r["labels"])}
                                 for r in tr.train_dataset]
        except Exception as e:  # noqa: BLE001 (the case records what TRL says)
            rec["error"] = f"{type(e).__name__}: {e}"[:400]
        out["cases"].append(rec)
        print(f"{name}: {rec.get('error') or str(len(rec['train_rows'])) + ' rows'}", flush=True)
    with open(os.path.join(HERE, "sft_llama3_phi3.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print(f"wrote sft_llama3_phi3.json: {len(out['training_renders'])} training renders, {len(out['cases'])} cases")


if __name__ == "__main__":
    main()
