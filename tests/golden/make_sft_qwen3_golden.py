"""Writes tests/golden/sft_qwen3.json: the rows TRL 1.10's SFTTrainer (transformers 5.17, on the CPU) prepares from
Qwen3 conversations with Qwen3's chat template (tests/golden/qwen3_chat/tok: its tokenizer, whose template is
qwen3.jinja, Qwen3-0.6B's): multi-turn rows with thinking blocks, reasoning_content, tool calls and a tools column;
conversational prompt-completion rows with chat_template_kwargs (enable_thinking); and assistant_only_loss, for which
TRL renders every row with its training copy of a template it knows (trl/chat_templates/*_training.jinja: Qwen3's,
Qwen3-Instruct-2507's, Qwen2.5's) and raises for a template it does not (Qwen3's first release, Thinking-2507's).
Each case: its rows, its SFTConfig options, and TRL's prepared rows (input_ids, labels) or the error it raised. And
TRL's training copies of the three templates (get_training_chat_template) rendered over every conversation of
qwen3_chat.json and of the rows here (with and without add_generation_prompt, and enable_thinking false for Qwen3's):
the text and the assistant mask (return_assistant_tokens_mask), or the error; the copies' own text is not stored.
Read by tests/lua/test_sft_qwen3.lua.
    python3 tests/golden/make_sft_qwen3_golden.py
(needs torch, transformers, datasets and trl: tests/golden/reference.sh's venv). Not part of the build or the suite."""
import json
import os
import sys
import tempfile
import warnings

import datasets
import torch
from datasets import Dataset
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
from trl import SFTConfig, SFTTrainer
from trl.chat_template_utils import get_training_chat_template

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from make_qwen2_tok_golden import QWEN25_TEMPLATE  # noqa: E402 (Qwen2.5-Instruct's template, = TRL's qwen2_5.jinja)

warnings.filterwarnings("ignore")
datasets.disable_progress_bars()
TOK = os.path.join(HERE, "qwen3_chat", "tok")
TOOLS = json.dumps([{"type": "function", "function": {"name": "get_weather", "description": "The weather.", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "number", "default": 1.0}},
    "required": ["city"]}}}])


def call(city):
    return [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": city}}}]


# (every row's messages have the same keys, None where unused: datasets stores them so whatever the rows give)
def msg(role, content, reasoning=None, tool_calls=None):
    return {"role": role, "content": content, "reasoning_content": reasoning, "tool_calls": tool_calls}


ROWS = [
    {"messages": [msg("user", "2+2?"), msg("assistant", "<think>\nTwo and two.\n</think>\n\n4")]},
    {"messages": [msg("system", "Be brief."), msg("user", "first?"), msg("assistant", "<think>t1</think>\n\na1"),
                  msg("user", "second?"), msg("assistant", "a2", reasoning="t2")]},
    {"messages": [msg("user", "Weather in Paris?"), msg("assistant", "<think>Call it.</think>", tool_calls=call("Paris")),
                  msg("tool", "22 C"), msg("tool", "sunny"), msg("assistant", "<think>Got it.</think>\n\nSunny, 22 C.")]},
    {"messages": [msg("user", "Rome?"), msg("assistant", "", reasoning="plan", tool_calls=call("Rome")),
                  msg("tool", "25 C"), msg("assistant", "Warm.")]},
    {"messages": [msg("user", "caf\u00e9 \U0001F600?"), msg("assistant", "r\u00e9ponse, no thinking")]},
]
TOOL_ROWS = [dict(r, tools=TOOLS) for r in ROWS]
PC_ROWS = [
    {"prompt": [msg("user", "2+2?")], "completion": [msg("assistant", "<think>\nadd\n</think>\n\n4")]},
    {"prompt": [msg("system", "sys"), msg("user", "a?"), msg("assistant", "<think>t</think>b"), msg("user", "c?")],
     "completion": [msg("assistant", "d", reasoning="e")]},
]
PC_NOTHINK = [dict(r, chat_template_kwargs={"enable_thinking": False}) for r in PC_ROWS]
PC_THINK = [dict(r, chat_template_kwargs={"enable_thinking": True}) for r in PC_ROWS]

CASES = [
    # (name, rows, options); options' chat_template_path names a template of TEMPLATES
    ("messages", ROWS, {}),
    ("messages with a tools column", TOOL_ROWS, {}),
    ("messages, assistant_only_loss (TRL's training copy of Qwen3's template)", ROWS, {"assistant_only_loss": True}),
    ("messages with tools, assistant_only_loss", TOOL_ROWS, {"assistant_only_loss": True}),
    ("messages, assistant_only_loss, max_length 40", ROWS, {"assistant_only_loss": True, "max_length": 40}),
    ("prompt-completion messages", PC_ROWS, {}),
    ("prompt-completion messages, enable_thinking false", PC_NOTHINK, {}),
    ("prompt-completion messages, enable_thinking true", PC_THINK, {}),
    ("prompt-completion messages, enable_thinking false, assistant_only_loss", PC_NOTHINK, {"assistant_only_loss": True}),
    ("prompt-completion messages, completion_only_loss false", PC_ROWS, {"completion_only_loss": False}),
    ("Qwen3-Instruct-2507's template, assistant_only_loss", ROWS,
     {"assistant_only_loss": True, "chat_template_path": "qwen3_instruct_2507"}),
    ("Qwen2.5's template, assistant_only_loss", ROWS, {"assistant_only_loss": True, "chat_template_path": "qwen2_5"}),
    ("Qwen3's first release, assistant_only_loss (no training copy)", ROWS,
     {"assistant_only_loss": True, "chat_template_path": "qwen3_2504"}),
    ("Qwen3-Thinking-2507's template, assistant_only_loss (no training copy)", ROWS,
     {"assistant_only_loss": True, "chat_template_path": "qwen3_thinking_2507"}),
    ("Qwen3's first release without assistant_only_loss", ROWS, {"chat_template_path": "qwen3_2504"}),
]


def templates():
    out = {"qwen2_5": QWEN25_TEMPLATE}
    for n in ("qwen3_2504", "qwen3_instruct_2507", "qwen3_thinking_2507"):
        with open(os.path.join(HERE, "qwen3_chat", n + ".jinja"), encoding="utf-8") as f:
            out[n] = f.read()
    return out


def training_renders():
    """TRL's training copies rendered (zrun.sft_templates makes its own: they must render the same text and masks)."""
    srcs = templates()
    with open(os.path.join(HERE, "qwen3_chat.json"), encoding="utf-8") as f:
        convs = [{"messages": c["messages"], "tools": c["tools"]} for c in json.load(f)["conversations"]]
    convs += [{"messages": r["messages"], "tools": None} for r in ROWS]
    convs += [{"messages": r["messages"], "tools": json.loads(TOOLS)} for r in ROWS]
    convs += [{"messages": r["prompt"] + r["completion"], "tools": None} for r in PC_ROWS]
    out = {"training_conversations": convs, "training_renders": []}
    for name, src in (("qwen3", AutoTokenizer.from_pretrained(TOK).chat_template),
                      ("qwen3_instruct_2507", srcs["qwen3_instruct_2507"]), ("qwen2_5", srcs["qwen2_5"])):
        tok = AutoTokenizer.from_pretrained(TOK)
        tok.chat_template = src
        training = get_training_chat_template(tok)
        for i, c in enumerate(convs):
            for agp in (False, True):
                for think in (("absent", False) if name == "qwen3" else ("absent",)):
                    kw = {} if think == "absent" else {"enable_thinking": think}
                    rec = {"conversation": i, "template": name, "add_generation_prompt": agp, "enable_thinking": think}
                    try:
                        text = tok.apply_chat_template(c["messages"], tools=c["tools"], chat_template=training,
                                                       add_generation_prompt=agp, tokenize=False, **kw)
                        enc = tok.apply_chat_template(c["messages"], tools=c["tools"], chat_template=training,
                                                      add_generation_prompt=agp, return_dict=True,
                                                      return_assistant_tokens_mask=True, **kw)
                        rec["text"] = text
                        rec["assistant_masks"] = "".join(str(m) for m in enc["assistant_masks"])
                    except Exception as e:  # noqa: BLE001 (the render records what the template raised)
                        rec["error"] = type(e).__name__
                    out["training_renders"].append(rec)
    return out


def main():
    work = tempfile.mkdtemp()
    paths = {}
    for name, src in templates().items():
        paths[name] = os.path.join(work, name + ".jinja")
        with open(paths[name], "w", encoding="utf-8") as f:
            f.write(src)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(AutoTokenizer.from_pretrained(TOK)), hidden_size=16,
                                         intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                                         num_key_value_heads=1))
    out = training_renders()
    out["cases"] = []
    for name, rows, opts in CASES:
        tok = AutoTokenizer.from_pretrained(TOK)  # (a fresh one: chat_template_path replaces its template)
        args = dict(opts)
        if "chat_template_path" in args:
            args["chat_template_path"] = paths[args["chat_template_path"]]
        cfg = SFTConfig(output_dir=os.path.join(work, "out"), report_to="none", bf16=False, use_cpu=True, **args)
        rec = {"name": name, "train": rows, "options": opts}
        try:
            tr = SFTTrainer(model=model, args=cfg, train_dataset=Dataset.from_list(rows), processing_class=tok)
            rec["train_rows"] = [{"input_ids": list(r["input_ids"]), "labels": list(r["labels"])}
                                 for r in tr.train_dataset]
        except Exception as e:  # noqa: BLE001 (the case records what TRL says)
            rec["error"] = f"{type(e).__name__}: {e}"[:400]
        out["cases"].append(rec)
        print(f"{name}: {rec.get('error') or str(len(rec['train_rows'])) + ' rows'}", flush=True)
    with open(os.path.join(HERE, "sft_qwen3.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print(f"wrote sft_qwen3.json: {len(out['cases'])} cases")


if __name__ == "__main__":
    main()
