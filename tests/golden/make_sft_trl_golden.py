"""Writes tests/golden/sft_trl.json: the rows TRL's own SFTTrainer (TRL 1.10, transformers 5.17, on the CPU)
prepares from small datasets of every type, with the options where zrun's SFT has to follow TRL's code rather
than its documentation: where a completion's labels start when the prompt's tokens are not a prefix, formatting_func
on rows of each type, the eos added to a "text" field only, completion_only_loss decided from the train dataset
(pre-tokenized rows with prompt / completion columns included) and kept for evaluation, wrapped packing cut per
1000-row batch of each dataset_num_proc shard, bfd and bfd_split packing (TRL's default with packing), padding_free,
eos_token, and the collators of skip_prepare_dataset rows and of bfd-packed rows (padding-free). Each case:
its rows, its SFTConfig options, and TRL's prepared train / eval rows (or the error it raised). Read by
tests/lua/test_sft_trl.lua.
    python3 tests/golden/make_sft_trl_golden.py [DATA_DIR]
(default ../shared/data; needs torch, transformers, datasets and trl: a venv on the CPU serves). Not part of the
build or the test suite."""
import json
import os
import sys
import tempfile
import warnings

import torch
import datasets
from datasets import Dataset
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
from trl import SFTConfig, SFTTrainer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_chat_golden import GEN_TEMPLATE  # noqa: E402 (the generation-block template of the chat golden file)

warnings.filterwarnings("ignore")
datasets.disable_progress_bars()

# GEN_TEMPLATE (ChatML style with {% generation %} blocks), and one whose generation prompt adds text the rendered
# assistant turn lacks (as templates that open a thinking block do): the prompt is then no prefix.
THINK_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}{{ eos_token }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n<think>\n{% endif %}"
)
# A template that writes the tools and the tool calls with tojson (as Qwen's and Llama 3.1's do): their key order,
# empty objects and floats as json.loads gave them.
TOOLS_TEMPLATE = (
    "{% if tools %}<tools>{% for t in tools %}{{ t | tojson }}\n{% endfor %}</tools>\n{% endif %}"
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}{% if m.tool_calls %}{% for tc in m.tool_calls %}"
    "<call>{{ tc.function | tojson }}</call>{% endfor %}{% endif %}{{ eos_token }}\n{% endfor %}"
)
TEMPLATES = {"gen": GEN_TEMPLATE, "think": THINK_TEMPLATE, "tools": TOOLS_TEMPLATE}
TOOLS = [{"type": "function", "function": {"name": "now", "description": "The time", "parameters": {
    "type": "object", "properties": {}}}}, {"type": "function", "function": {"name": "scale", "parameters": {
        "type": "object", "properties": {"x": {"type": "number", "default": 1.0}}, "required": ["x"]}}}]

CONV = [{"role": "user", "content": "What is the capital of France?"}, {"role": "assistant", "content": "Paris."}]
CONV2 = [{"role": "system", "content": "One word."}, {"role": "user", "content": "Sky?"},
         {"role": "assistant", "content": "Blue"}]
SHAREGPT = [{"from": "human", "value": "What is the capital of France?"}, {"from": "gpt", "value": "Paris."}]

# formatting_func's, by name (tests/lua/test_sft_trl.lua writes the same functions)
FORMATS = {
    "last_content": lambda r: "F:" + r["messages"][-1]["content"],
    "q_text": lambda r: "Q: " + r["text"],
    "joined": lambda r: r["prompt"] + "|" + r["completion"],
    "upper_content": lambda r: r["content"].upper(),
}


def packing_rows():
    # 2,100 short rows: wrapped packing cuts each 1000-row batch on its own
    return [{"text": " ".join(["w%d" % (i % 7)] * (1 + i % 3))} for i in range(2100)]


PACKING = packing_rows()


def bfd_rows():
    # 2,100 rows of 1 to 30 words: bfd packing fills blocks of max_length with whole rows, cut or split there
    return [{"text": " ".join("w%d" % ((i * 7 + k) % 11) for k in range(1 + (i * 13) % 30))} for i in range(2100)]


BFD = bfd_rows()


CASES = [
    # (name, tokenizer, train rows, eval rows, options, formatting_func)
    ("text rows", "tinyllama", [{"text": "The sky is blue."}, {"text": "Ends with eos.</s>"}], None, {}, None),
    ("dataset_text_field content: no eos", "tinyllama", [{"content": "The sky is blue."}], None,
     {"dataset_text_field": "content"}, None),
    ("prompt-completion, prompt ends in a space", "tinyllama",
     [{"prompt": "Is the sky blue? Answer: ", "completion": "yes"}, {"prompt": "2+2=", "completion": "4"}], None, {}, None),
    ("prompt-completion, prompt ends in a space, gpt2", "gpt2",
     [{"prompt": "Is the sky blue? Answer: ", "completion": "yes"}, {"prompt": "2+2=", "completion": " 4"}], None, {}, None),
    ("prompt-completion, completion_only_loss false", "tinyllama",
     [{"prompt": "Is the sky blue? Answer:", "completion": " yes"}], None, {"completion_only_loss": False}, None),
    ("messages, own template", "tinyllama", [{"messages": CONV}, {"messages": CONV2}], None, {}, None),
    ("messages, assistant_only_loss", "tinyllama", [{"messages": CONV}, {"messages": CONV2}], None,
     {"assistant_only_loss": True, "chat_template_path": "gen"}, None),
    ("conversational prompt-completion, own template", "tinyllama",
     [{"prompt": CONV[:1], "completion": CONV[1:]}], None, {}, None),
    ("conversational prompt-completion, generation prompt not a prefix", "tinyllama",
     [{"prompt": CONV[:1], "completion": [{"role": "assistant", "content": "Paris, a large city on the Seine."}]}], None,
     {"chat_template_path": "think"}, None),
    ("sharegpt as user / assistant", "tinyllama", [{"messages": CONV}], None, {}, None),
    ("formatting_func on messages rows", "tinyllama", [{"messages": CONV}], None, {}, "last_content"),
    ("formatting_func on text rows", "tinyllama", [{"text": "The sky is blue."}], None, {}, "q_text"),
    ("formatting_func on prompt-completion rows, completion_only_loss false", "tinyllama",
     [{"prompt": "Is the sky blue?", "completion": " Yes."}], None, {"completion_only_loss": False}, "joined"),
    ("formatting_func with dataset_text_field content", "tinyllama", [{"content": "The sky is blue."}], None,
     {"dataset_text_field": "content"}, "upper_content"),
    ("formatting_func on prompt-completion rows, completion_only_loss auto", "tinyllama",
     [{"prompt": "Is the sky blue?", "completion": " Yes."}], None, {}, "joined"),
    ("tokenized rows with prompt and completion columns", "tinyllama",
     [{"prompt": "ab", "completion": "c", "input_ids": [1, 100, 101, 102, 2], "completion_mask": [0, 0, 0, 1, 1]}],
     None, {}, None),
    ("tokenized rows without prompt and completion columns", "tinyllama",
     [{"input_ids": [1, 100, 101, 102, 2], "completion_mask": [0, 0, 0, 1, 1]}], None, {}, None),
    ("completion_only_loss from the train rows, kept for eval", "tinyllama", [{"text": "The sky is blue."}],
     [{"prompt": "Is the sky blue?", "completion": " Yes."}], {}, None),
    ("completion_only_loss from prompt-completion train rows, eval text rows", "tinyllama",
     [{"prompt": "Is the sky blue?", "completion": " Yes."}], [{"text": "The sky is blue."}], {}, None),
    ("truncation keep_end", "tinyllama", [{"prompt": "Is the sky blue? Answer:", "completion": " yes it is"}], None,
     {"max_length": 6, "truncation_mode": "keep_end"}, None),
    ("wrapped packing, 2100 rows", "tinyllama", PACKING, None,
     {"packing": True, "packing_strategy": "wrapped", "max_length": 1024}, None),
    ("wrapped packing, 2100 rows, dataset_num_proc 3", "tinyllama", PACKING, None,
     {"packing": True, "packing_strategy": "wrapped", "max_length": 1024, "dataset_num_proc": 3}, None),
    ("bfd packing, 2100 rows", "tinyllama", BFD, None, {"packing": True, "max_length": 24}, None),
    ("bfd_split packing, 2100 rows", "tinyllama", BFD, None,
     {"packing": True, "packing_strategy": "bfd_split", "max_length": 24}, None),
    ("bfd packing, 2100 rows, dataset_num_proc 3", "tinyllama", BFD, None,
     {"packing": True, "max_length": 32, "dataset_num_proc": 3}, None),
    ("bfd packing of prompt-completion rows", "tinyllama",
     [{"prompt": "Is the sky blue? Answer:", "completion": " yes"}, {"prompt": "2+2=", "completion": "4"},
      {"prompt": "Name a colour:", "completion": " green, or red"}], None, {"packing": True, "max_length": 16}, None),
    ("padding_free without packing, max_length 1024", "tinyllama", [{"text": "The sky is blue."}], None,
     {"padding_free": True}, None),
    ("padding_free without packing, max_length None", "tinyllama", [{"text": "The sky is blue."}, {"text": "Green."}], None,
     {"padding_free": True, "max_length": None}, None),
    ("eos_token <unk>", "tinyllama", [{"text": "The sky is blue."}], None,
     {"eos_token": "<unk>"}, None),
    ("eos_token not in the vocabulary", "tinyllama", [{"text": "The sky is blue."}], None,
     {"eos_token": "<|im_end|>"}, None),
    ("tools as a JSON string: key order, empty objects and floats as json.loads keeps them", "tinyllama",
     [{"messages": CONV, "tools": json.dumps(TOOLS)}], None, {"chat_template_path": "tools"}, None),
    ("vision rows (images) for a text-only model", "tinyllama", [{"messages": CONV, "images": ["a.png"]}], None, {}, None),
    ("vision rows (image) for a text-only model", "tinyllama", [{"text": "The sky is blue.", "image": "a.png"}], None, {}, None),
]


def rows_of(ds):
    out = []
    for r in ds:
        row = {"input_ids": list(r["input_ids"]), "labels": list(r["labels"])}
        if "seq_lengths" in r:
            row["seq_lengths"] = list(r["seq_lengths"])
        out.append(row)
    return out


def main():
    data = sys.argv[1] if len(sys.argv) > 1 else "../shared/data"
    toks = {"tinyllama": AutoTokenizer.from_pretrained(f"{data}/tokenizers/tinyllama-1.1b-chat-v1.0"),
            "gpt2": AutoTokenizer.from_pretrained(f"{data}/tokenizers/gpt2")}
    work = tempfile.mkdtemp()
    paths = {}
    for name, src in TEMPLATES.items():
        paths[name] = os.path.join(work, name + ".jinja")
        with open(paths[name], "w") as f:
            f.write(src)
    out = {"templates": TEMPLATES, "cases": []}
    torch.manual_seed(0)
    models = {}
    for name, tk, train, ev, opts, ff in CASES:
        tok = AutoTokenizer.from_pretrained(toks[tk].name_or_path)  # (a fresh one: eos_token changes it)
        if tk not in models:
            models[tk] = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32,
                                                      num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1))
        args = dict(opts)
        if args.get("chat_template_path") in paths:
            args["chat_template_path"] = paths[args["chat_template_path"]]
        cfg = SFTConfig(output_dir=os.path.join(work, "out"), report_to="none", bf16=False, use_cpu=True, **args)
        rec = {"name": name, "tokenizer": tk, "train": train, "eval": ev, "options": opts, "formatting_func": ff}
        rows = train
        if train is PACKING:  # (generated on both sides: tests/lua/test_sft_trl.lua writes the same rows)
            rec["train"] = "packing_rows"
        if train is BFD:
            rec["train"] = "bfd_rows"
        if name.startswith("sharegpt"):  # zrun renames ShareGPT's speakers: its rows are TRL's with user / assistant
            rec["train"] = [{"conversations": SHAREGPT}]
        try:
            tr = SFTTrainer(model=models[tk], args=cfg, train_dataset=Dataset.from_list(rows),
                            eval_dataset=Dataset.from_list(ev) if ev else None, processing_class=tok,
                            formatting_func=FORMATS[ff] if ff else None)
            rec["train_rows"] = rows_of(tr.train_dataset)
            if ev:
                rec["eval_rows"] = rows_of(tr.eval_dataset)
        except Exception as e:  # noqa: BLE001 (the case records what TRL says)
            rec["error"] = f"{type(e).__name__}: {e}"[:300]
        out["cases"].append(rec)
        print(f"{name}: {rec.get('error') or str(len(rec['train_rows'])) + ' rows'}", flush=True)
    # the collator of skip_prepare_dataset rows without labels: only the padding is -100 (pad = eos here)
    tok = toks["tinyllama"]
    cfg = SFTConfig(output_dir=os.path.join(work, "out"), report_to="none", bf16=False, use_cpu=True,
                    dataset_kwargs={"skip_prepare_dataset": True})
    batch = [{"input_ids": [1, 100, 101, 2]}, {"input_ids": [1, 100, 2]}]
    tr = SFTTrainer(model=models["tinyllama"], args=cfg, train_dataset=Dataset.from_list(batch), processing_class=tok)
    col = tr.data_collator(batch)
    out["skip_prepare_collator"] = {"rows": batch, "input_ids": col["input_ids"].tolist(),
                                    "labels": col["labels"].tolist(), "pad_token": tok.pad_token}
    # the padding-free collator TRL uses with bfd packing, on two of its packed rows, padded to a multiple of 8
    cfg = SFTConfig(output_dir=os.path.join(work, "out"), report_to="none", bf16=False, use_cpu=True, packing=True,
                    max_length=24, pad_to_multiple_of=8)
    tr = SFTTrainer(model=models["tinyllama"], args=cfg, train_dataset=Dataset.from_list(BFD[:40]), processing_class=tok)
    batch = [dict(tr.train_dataset[k]) for k in (0, 5)]
    col = tr.data_collator(batch)
    out["padding_free_collator"] = {"rows": rows_of(batch), "input_ids": col["input_ids"].tolist(),
                                    "labels": col["labels"].tolist(), "position_ids": col["position_ids"].tolist(),
                                    "keys": sorted(col.keys())}
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sft_trl.json")
    with open(path, "w") as f:
        json.dump(out, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {path}: {len(out['cases'])} cases")


if __name__ == "__main__":
    main()
