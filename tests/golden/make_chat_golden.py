"""Writes tests/golden/chat_tinyllama.json: what transformers' apply_chat_template gives for the TinyLlama
chat tokenizer (its own template, and a template of ours with {% generation %} blocks), and the
{input_ids, labels} rows TRL's SFTTrainer builds from each dataset type (its rules restated here: eos
appended to non-conversational text / completions, the labels of prompt-completion rows after as many tokens
as the prompt has alone (TRL's completion_mask; tests/golden/make_sft_trl_golden.py runs TRL itself), the assistant tokens only with assistant_only_loss, truncation keep_start /
keep_end); and AutoTokenizer's ids of the first 40 non-empty WikiText-2 validation lines (line numbers and
ids only), which transformers 5 computes with its own LlamaTokenizer pipeline, not tokenizer.json's. Read by tests/lua/test_sft_golden.lua.
    python3 tests/golden/make_chat_golden.py [TOKENIZER_DIR]
(default ../shared/data/tokenizers/tinyllama-1.1b-chat-v1.0; needs transformers, not torch). Not part of
the build or the test suite."""
import json
import os
import sys

from transformers import AutoTokenizer

# Ours, in the style of the ChatML templates: each assistant turn inside a generation block.
GEN_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'assistant' %}<|assistant|>\n{% generation %}{{ m['content'] }}{{ eos_token }}{% endgeneration %}\n"
    "{% else %}<|{{ m['role'] }}|>\n{{ m['content'] }}{{ eos_token }}\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

CONVS = [
    [{"role": "user", "content": "What is the capital of France?"},
     {"role": "assistant", "content": "Paris."}],
    [{"role": "system", "content": "You answer in one word."},
     {"role": "user", "content": "Colour of the sky?"},
     {"role": "assistant", "content": "Blue"},
     {"role": "user", "content": "And grass, caf\u00e9 \u2615?"},
     {"role": "assistant", "content": " Green, 42 times\n\nnew lines."}],
]


def labels_from(ids, *masks):
    return [t if all(m[i] for m in masks) else -100 for i, t in enumerate(ids)]


def truncate(row, max_length, mode):
    sl = slice(None, max_length) if mode == "keep_start" else slice(-max_length, None)
    return {"input_ids": row["input_ids"][sl], "labels": row["labels"][sl]}


def main():
    d = sys.argv[1] if len(sys.argv) > 1 else "../shared/data/tokenizers/tinyllama-1.1b-chat-v1.0"
    tok = AutoTokenizer.from_pretrained(d)
    eos = tok.eos_token
    out = {"gen_template": GEN_TEMPLATE, "templates": [], "sft": []}
    for ci, conv in enumerate(CONVS):
        for name, tpl in (("own", None), ("gen", GEN_TEMPLATE)):
            for agp in (False, True):
                msgs = conv[:-1] if agp else conv
                text = tok.apply_chat_template(msgs, chat_template=tpl, tokenize=False, add_generation_prompt=agp)
                enc = tok.apply_chat_template(msgs, chat_template=tpl, tokenize=True, return_dict=True,
                                              add_generation_prompt=agp, return_assistant_tokens_mask=tpl is not None)
                out["templates"].append({"conv": ci, "template": name, "add_generation_prompt": agp, "text": text,
                                         "input_ids": list(enc["input_ids"]),
                                         "assistant_masks": list(enc["assistant_masks"]) if tpl else None})
    # continue_final_message: the text cut after the last message's content (a prefill to continue)
    out["continue_final"] = []
    for ci, conv in enumerate(CONVS):
        for name, tpl in (("own", None), ("gen", GEN_TEMPLATE)):
            text = tok.apply_chat_template(conv, chat_template=tpl, tokenize=False, continue_final_message=True)
            ids = tok.apply_chat_template(conv, chat_template=tpl, tokenize=True, return_dict=True,
                                          continue_final_message=True)["input_ids"]
            out["continue_final"].append({"conv": ci, "template": name, "text": text, "input_ids": list(ids)})
    # TRL's rows. messages + assistant_only_loss (the generation template)
    for ci, conv in enumerate(CONVS):
        enc = tok.apply_chat_template(conv, chat_template=GEN_TEMPLATE, tokenize=True, return_dict=True,
                                      return_assistant_tokens_mask=True)
        ids = list(enc["input_ids"])
        out["sft"].append({"name": f"messages {ci} assistant_only_loss", "row": {"messages": conv},
                           "options": {"assistant_only_loss": True, "chat_template": "gen"},
                           "input_ids": ids, "labels": labels_from(ids, enc["assistant_masks"])})
        # messages, every token learned (the tokenizer's own template)
        ids = list(tok.apply_chat_template(conv, tokenize=True, return_dict=True)["input_ids"])
        out["sft"].append({"name": f"messages {ci}", "row": {"messages": conv}, "options": {},
                           "input_ids": ids, "labels": ids})
        # conversational prompt-completion: the completion = the last turn
        for name, tpl in (("own", None), ("gen", GEN_TEMPLATE)):
            p_ids = list(tok.apply_chat_template(conv[:-1], chat_template=tpl, tokenize=True, return_dict=True,
                                                 add_generation_prompt=True)["input_ids"])
            ids = list(tok.apply_chat_template(conv, chat_template=tpl, tokenize=True, return_dict=True)["input_ids"])
            n = len(p_ids)
            out["sft"].append({"name": f"prompt-completion {ci} {name}", "row": {"prompt": conv[:-1], "completion": conv[-1:]},
                               "options": {"chat_template": name} if tpl else {},
                               "input_ids": ids, "labels": labels_from(ids, [0] * n + [1] * (len(ids) - n))})
    # plain prompt-completion and text: eos appended, the prompt tokenized with bos
    pc = [("Question: what is 2 + 2?\nAnswer:", " 4"), ("Translate to French: cat =>", " chat" + eos)]
    for k, (p, c) in enumerate(pc):
        cc = c if c.endswith(eos) else c + eos
        p_ids, ids = tok(p)["input_ids"], tok(p + cc)["input_ids"]
        n = len(p_ids)
        row = {"input_ids": ids, "labels": labels_from(ids, [0] * n + [1] * (len(ids) - n))}
        out["sft"].append({"name": f"text prompt-completion {k}", "row": {"prompt": p, "completion": c}, "options": {}, **row})
        out["sft"].append({"name": f"text prompt-completion {k}, completion_only_loss false", "row": {"prompt": p, "completion": c},
                           "options": {"completion_only_loss": False}, "input_ids": ids, "labels": ids})
        for mode in ("keep_start", "keep_end"):
            out["sft"].append({"name": f"text prompt-completion {k}, max_length 9 {mode}", "row": {"prompt": p, "completion": c},
                               "options": {"max_length": 9, "truncation_mode": mode}, **truncate(row, 9, mode)})
    for k, text in enumerate(["The sky is blue.", "Ends with eos already." + eos, "  leading spaces and\ttabs"]):
        t = text if text.endswith(eos) else text + eos
        ids = tok(t)["input_ids"]
        out["sft"].append({"name": f"text {k}", "row": {"text": text}, "options": {}, "input_ids": ids, "labels": ids})
    # transformers 5's AutoTokenizer on WikiText lines (their numbers only: the text stays in ../shared/data)
    wiki = os.path.join(os.path.dirname(os.path.dirname(d.rstrip("/"))), "wikitext-2-raw", "wiki.valid.raw")
    with open(wiki, encoding="utf-8") as f:
        lines = f.read().split("\n")
    picked = [i for i, l in enumerate(lines) if l][:40]
    out["wiki_lines"] = [{"line": i + 1, "ids": tok(lines[i])["input_ids"]} for i in picked]
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "chat_tinyllama.json")
    with open(path, "w") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {path}: {len(out['templates'])} template cases, {len(out['sft'])} SFT rows")


if __name__ == "__main__":
    main()
