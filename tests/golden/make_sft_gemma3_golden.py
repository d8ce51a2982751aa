"""Writes tests/golden/sft_gemma3.json and the tokenizer tests/golden/gemma3_chat/tok_gemma3: what TRL 1.10's SFTTrainer
(transformers 5.17, on the CPU) prepares from conversations with Gemma 3's chat template (tests/golden/gemma3_chat/
gemma3.jinja, google/gemma-3-*-it's, byte for byte as TRL 1.10 keeps it in trl/chat_templates/ for identity
comparison), with and without assistant_only_loss (for which TRL renders every row with its training copy,
gemma3_training.jinja), and that copy rendered over the conversations below, with and without add_generation_prompt:
the text and the assistant mask (return_assistant_tokens_mask), or the error it raised; the copy's own text is not
stored. The tokenizer: tests/golden/llama3_phi3_chat/tok_phi3's SentencePiece-style BPE with Gemma's special tokens
(<pad>, <eos>, <bos>, <start_of_turn>, <end_of_turn>, <start_of_image>) in place of Phi-3's, no bos added by the
tokenizer (the template writes it), and Gemma's normalizer (spaces to "▁", none prepended). Read by tests/lua/test_sft_gemma3.lua.
    /tmp/zrun-ref/bin/python tests/golden/make_sft_gemma3_golden.py
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
DIR = os.path.join(HERE, "gemma3_chat")
TOK = os.path.join(DIR, "tok_gemma3")
GEMMA_SPECIAL = ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>"]


def msg(role, content):
    return {"role": role, "content": content}


U, A, S = "user", "assistant", "system"
CONVS = [
    [msg(U, "Hi there")],
    [msg(S, "Be brief."), msg(U, "2+2?")],
    [msg(U, "2+2?"), msg(A, "4")],
    [msg(S, "You help."), msg(U, "first?"), msg(A, "a1"), msg(U, "second?"), msg(A, "a2")],
    [msg(U, "first?"), msg(A, "a1"), msg(U, "second?")],
    [msg(S, "\n  sys \t\n"), msg(U, "  q  \n"), msg(A, "\n\n answer\n\n spaced \n"), msg(U, "\tq2")],
    [msg(S, "Say \"hi\" \\ 'there'"), msg(U, "caf\u00e9 \u4f60\u597d \U0001F600\ttab"), msg(A, "\u00fcber r\u00e9ponse \U0001F389")],
    [msg(S, ""), msg(U, ""), msg(A, "")],
    [msg(U, [{"type": "text", "text": " blocks "}, {"type": "image"}]), msg(A, [{"type": "text", "text": "seen"}])],
    [msg(S, [{"type": "text", "text": "list system"}]), msg(U, "q"), msg(A, "a")],
    [msg(U, "<start_of_turn>model and <end_of_turn>"), msg(A, "<bos>x<eos>")],
    [msg(U, "List three."), msg(A, "1. one\n2. two\n3. three\n\nDone.")],
    [msg(U, "q"), msg(A, "a"), msg(A, "more")],  # (roles must alternate: the template raises)
    [msg(A, "first")],  # (the same)
    [msg(U, "q"), msg(A, 42)],  # (neither a string nor a list: "Invalid content type")
]

ROWS = [
    {"messages": [msg(U, "2+2?"), msg(A, "4")]},
    {"messages": [msg(S, "Be brief."), msg(U, "first?"), msg(A, " a1 \n"), msg(U, "second?"),
                  msg(A, "a2\n\nwith lines.")]},
    {"messages": [msg(S, ""), msg(U, "caf\u00e9 \U0001F600?"), msg(A, "r\u00e9ponse \U0001F389")]},
    {"messages": [msg(U, "q"), msg(A, "a"), msg(U, "ends on a user turn")]},
]
PC_ROWS = [
    {"prompt": [msg(U, "2+2?")], "completion": [msg(A, "4")]},
    {"prompt": [msg(S, "sys"), msg(U, "a?"), msg(A, "b"), msg(U, "c?")], "completion": [msg(A, "d\n")]},
]
CASES = [
    ("Gemma 3's template (the tokenizer's own), messages", ROWS, {}),
    ("Gemma 3's, messages, assistant_only_loss (TRL's training copy)", ROWS, {"assistant_only_loss": True}),
    ("Gemma 3's, assistant_only_loss, max_length 24", ROWS, {"assistant_only_loss": True, "max_length": 24}),
    ("Gemma 3's, prompt-completion messages, assistant_only_loss", PC_ROWS, {"assistant_only_loss": True}),
    ("Gemma 3's, prompt-completion messages", PC_ROWS, {}),
]


def added(i, content):
    return {"id": i, "content": content, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
            "special": True}


def make_tokenizer(template):
    with open(os.path.join(HERE, "llama3_phi3_chat", "tok_phi3", "tokenizer.json"), encoding="utf-8") as f:
        tj = json.load(f)
    vocab = tj["model"]["vocab"]
    base = [a for a in tj["added_tokens"] if a["id"] < 3]  # <unk> <s> </s>
    for a in tj["added_tokens"]:
        if a["id"] >= 3:
            del vocab[a["content"]]
    tj["added_tokens"] = base
    for t in GEMMA_SPECIAL:
        vocab[t] = len(vocab)
        tj["added_tokens"].append(added(vocab[t], t))
    tj["post_processor"] = None
    # Gemma's normalizer: spaces to "▁", no "▁" prepended (Llama 2's Prepend puts one after each special token)
    tj["normalizer"] = {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}
    cfg = {"add_bos_token": False, "add_eos_token": False,
           "added_tokens_decoder": {str(a["id"]): {k: v for k, v in a.items() if k != "id"} for a in tj["added_tokens"]},
           "bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>",
           "clean_up_tokenization_spaces": False, "model_max_length": 32768, "padding_side": "left",
           "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": template}
    os.makedirs(TOK, exist_ok=True)
    with open(os.path.join(TOK, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tj, f, ensure_ascii=False, indent=1)
        f.write("\n")
    with open(os.path.join(TOK, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, ensure_ascii=False, indent=1)
        f.write("\n")


def main():
    with open(os.path.join(DIR, "gemma3.jinja"), encoding="utf-8") as f:
        template = f.read()
    make_tokenizer(template)
    tok = AutoTokenizer.from_pretrained(TOK)
    training = get_training_chat_template(tok)
    assert training is not None and "generation" in training
    convs = CONVS + [r["messages"] for r in ROWS] + [r["prompt"] + r["completion"] for r in PC_ROWS]
    out = {"conversations": [{"messages": c} for c in convs], "renders": [], "cases": []}
    for i, c in enumerate(convs):
        for agp in (False, True):
            rec = {"conversation": i, "add_generation_prompt": agp}
            try:
                rec["text"] = tok.apply_chat_template(c, chat_template=training, add_generation_prompt=agp,
                                                      tokenize=False)
                enc = tok.apply_chat_template(c, chat_template=training, add_generation_prompt=agp, return_dict=True,
                                              return_assistant_tokens_mask=True)
                rec["assistant_masks"] = "".join(str(m) for m in enc["assistant_masks"])
            except Exception as e:  # noqa: BLE001 (the render records what the template raised)
                rec["error"] = type(e).__name__
            out["renders"].append(rec)
    work = tempfile.mkdtemp()
    for name, rows, opts in CASES:
        tok = AutoTokenizer.from_pretrained(TOK)
        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32,
                                             num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1))
        cfg = SFTConfig(output_dir=os.path.join(work, "out"), report_to="none", bf16=False, use_cpu=True, **opts)
        rec = {"name": name, "train": rows, "options": opts}
        tr = SFTTrainer(model=model, args=cfg, train_dataset=Dataset.from_list(rows), processing_class=tok)
        rec["train_rows"] = [{"input_ids": list(r["input_ids"]), "labels": list(r["labels"])} for r in tr.train_dataset]
        out["cases"].append(rec)
        print(f"{name}: {len(rec['train_rows'])} rows", flush=True)
    with open(os.path.join(HERE, "sft_gemma3.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print(f"wrote sft_gemma3.json: {len(out['renders'])} renders ({sum('error' in r for r in out['renders'])} errors), "
          f"{len(out['cases'])} cases")


if __name__ == "__main__":
    main()
