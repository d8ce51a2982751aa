"""Writes tests/golden/llama3_phi3_chat.json: the Llama 3.x and Phi-3 / Phi-3.5 chat templates rendered by
transformers 5.17's apply_chat_template (the text, and the ids with the tokenizer the template belongs to) over
conversations that take every branch of them: system / no system, multi-turn, whitespace that Llama's templates trim,
tools in the first user message or in the system message (tools_in_user_message), custom_tools, Llama 3.1's
builtin_tools (<|python_tag|> calls, <|eom_id|>), tool calls (arguments as a dict and as a string) and tool or
ipython responses (a string, a mapping, a list: tojson), date_string given and absent, add_generation_prompt; and the
conversations a template refuses (raise_exception), with transformers' message.
Read by tests/lua/test_chat_llama3_phi3.lua.

The templates (tests/golden/llama3_phi3_chat/*.jinja, the inputs; byte for byte as TRL 1.10 keeps the publishers'
originals in trl/chat_templates/ for identity comparison):
  llama3.jinja     meta-llama/Meta-Llama-3-8B-Instruct's (TRL's get_training_chat_template patches it)
  llama3_1.jinja   meta-llama/Llama-3.1-8B-Instruct's (date_string defaults to 26 Jul 2024; builtin_tools)
  llama3_2.jinja   meta-llama/Llama-3.2-1B/3B-Instruct's (date_string from strftime_now)
  phi3.jinja       microsoft/Phi-3-mini-4k-instruct's (TRL patches it)
  phi3_5.jinja     microsoft/Phi-3.5-mini-instruct's (an empty system message left out; TRL patches it)
The tokenizers, written here:
  llama3_phi3_chat/tok_llama3  tests/golden/qwen2_tok's byte-level BPE (1,000 merges) with Llama 3's pre-tokenizer
                               regex, ignore_merges, its special tokens (<|begin_of_text|>, <|end_of_text|>,
                               <|eot_id|>, <|start_header_id|>, <|end_header_id|>, <|eom_id|>, <|python_tag|>),
                               bos prepended by the post-processor, eos <|eot_id|>; template llama3.jinja
  llama3_phi3_chat/tok_phi3    the TinyLlama (Llama-2) SentencePiece-style BPE cut to 1,500 merges (byte_fallback
                               for the rest), LlamaTokenizer (legacy false), with Phi-3's added tokens and their
                               flags as Phi-3.5-mini ships them (<|assistant|>, <|system|>, <|end|>, <|user|> rstrip;
                               eos = pad = <|endoftext|>); template phi3.jinja
    /tmp/zrun-ref/bin/python tests/golden/make_llama3_phi3_chat_golden.py [TINYLLAMA_DIR]
(default /work/shared/data/tokenizers/tinyllama-1.1b-chat-v1.0; needs transformers, not torch). Not part of the build
or the test suite."""
import copy
import json
import os
import sys

from transformers import AutoTokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
DIR = os.path.join(HERE, "llama3_phi3_chat")
TEMPLATES = ["llama3", "llama3_1", "llama3_2", "phi3", "phi3_5"]
LLAMA = ["llama3", "llama3_1", "llama3_2"]
PHI = ["phi3", "phi3_5"]
DATE = "06 Dec 2026"

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city, \u00b0C.",
                                      "parameters": {"type": "object", "properties": {
                                          "city": {"type": "string", "description": "e.g. \"S\u00e3o Paulo\""},
                                          "days": {"type": "integer", "default": 1}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "scale", "parameters": {
        "type": "object", "properties": {"x": {"type": "number", "default": 1.0, "minimum": -2.5e-3}}}}},
]
BUILTIN = ["brave_search", "wolfram_alpha", "code_interpreter"]
U, A, S, T = "user", "assistant", "system", "tool"


def m(role, content=None, **kw):
    d = {"role": role}
    if content is not None or "null" in kw:
        d["content"] = content
    kw.pop("null", None)
    d.update(kw)
    return d


def call(name, args, **kw):
    d = {"type": "function", "function": {"name": name, "arguments": args}}
    d.update(kw)
    return d


# (name, messages, extra apply_chat_template arguments, the templates that render it)
ALL = TEMPLATES
CONVS = [
    ("user only", [m(U, "Hi there")], {}, ALL),
    ("system, user", [m(S, "Be brief."), m(U, "2+2?")], {}, ALL),
    ("user, assistant", [m(U, "2+2?"), m(A, "4")], {}, ALL),
    ("multi-turn with a system message",
     [m(S, "You help."), m(U, "first?"), m(A, "a1"), m(U, "second?"), m(A, "a2")], {}, ALL),
    ("multi-turn ending on a user turn", [m(U, "first?"), m(A, "a1"), m(U, "second?")], {}, ALL),
    ("whitespace around the contents (Llama trims it)",
     [m(S, "\n  sys \t\n"), m(U, "  q  \n"), m(A, "\n\n answer\n\n spaced \n"), m(U, "\tq2")], {}, ALL),
    ("text with quotes, backslashes, unicode and emoji",
     [m(S, "Say \"hi\" \\ 'there'"), m(U, "caf\u00e9 \u4f60\u597d \U0001F600\ttab"),
      m(A, "\u00fcber \\n r\u00e9ponse \U0001F389")], {}, ALL),
    ("empty contents", [m(S, ""), m(U, ""), m(A, "")], {}, ALL),
    ("consecutive assistant turns", [m(U, "q"), m(A, "a"), m(A, "more")], {}, ALL),
    ("an assistant turn first", [m(A, "Hello, how can I help?"), m(U, "q"), m(A, "a")], {}, ALL),
    ("a system message later in the conversation", [m(U, "q"), m(S, "late system"), m(A, "a")], {}, ALL),
    ("an unknown role", [m(U, "q"), m("ipython", "result"), m(A, "a")], {}, ALL),
    ("special tokens in the text", [m(U, "<|eot_id|> and <|end|>"), m(A, "<|user|>x<|assistant|>")], {}, ALL),
    ("a long assistant answer over several lines",
     [m(U, "List three."), m(A, "1. one\n2. two\n3. three\n\nDone.")], {}, ALL),
    # Llama 3.1 / 3.2: tools, tool calls, responses, date_string
    ("date_string given", [m(U, "Today?")], {"date_string": "01 Jan 2030"}, ["llama3_1", "llama3_2"]),
    ("tools in the first user message", [m(U, "Weather in Paris?")], {"tools": TOOLS}, ["llama3_1", "llama3_2"]),
    ("tools and a system message", [m(S, "You help."), m(U, "Weather in Paris?")], {"tools": TOOLS},
     ["llama3_1", "llama3_2"]),
    ("tools in the system message (tools_in_user_message false)", [m(S, "You help."), m(U, "Weather?")],
     {"tools": TOOLS, "tools_in_user_message": False}, ["llama3_1", "llama3_2"]),
    ("custom_tools", [m(U, "Scale 2")], {"custom_tools": TOOLS[1:]}, ["llama3_1", "llama3_2"]),
    ("tool call with arguments as a dict, tool response as a string, answer",
     [m(U, "Weather in Paris?"), m(A, "", tool_calls=[call("get_weather", {"city": "Paris", "days": 2})]),
      m(T, "22 \u00b0C, sunny"), m(A, "Sunny, 22 \u00b0C.")], {"tools": TOOLS}, ["llama3_1", "llama3_2"]),
    ("tool call with arguments as a string, content null",
     [m(U, "Scale 3"), m(A, null=True, tool_calls=[call("scale", '{"x": 3}')]), m(T, "3.0")], {"tools": TOOLS},
     ["llama3_1", "llama3_2"]),
    ("tool responses as a mapping, a list and a number; an ipython role",
     [m(U, "Go"), m(A, "", tool_calls=[call("get_weather", {"city": "Rome", "units": None, "x": [1, 2.5, True]})]),
      m(T, {"temp": 25, "sky": "clear"}), m(T, [1, "two"]), m(T, 3), m("ipython", "raw"), m(A, "Done.")], {},
     ["llama3_1", "llama3_2"]),
    ("tool calls without tools", [m(S, "sys"), m(U, "Go"), m(A, "", tool_calls=[call("scale", {"x": 1})]),
                                  m(T, "1.0"), m(A, "ok")], {}, ["llama3_1", "llama3_2"]),
    ("builtin_tools, a builtin tool call (<|python_tag|>, <|eom_id|>), a custom one",
     [m(S, "You search."), m(U, "News?"),
      m(A, "", tool_calls=[call("brave_search", {"query": "news today", "count": "3"})]), m("ipython", "headlines"),
      m(A, "", tool_calls=[call("get_weather", {"city": "Oslo"})]), m(T, "-3"), m(A, "Here.")],
     {"builtin_tools": BUILTIN, "tools": TOOLS, "tools_in_user_message": False}, ["llama3_1"]),
    ("builtin_tools alone", [m(U, "2^10?")], {"builtin_tools": BUILTIN}, ["llama3_1"]),
]

REFUSED = [
    ("llama3_1", "two tool calls in one turn",
     [m(U, "q"), m(A, "", tool_calls=[call("a", {}), call("b", {})])], {}),
    ("llama3_2", "two tool calls in one turn",
     [m(U, "q"), m(A, "", tool_calls=[call("a", {}), call("b", {})])], {"date_string": DATE}),
    ("llama3_1", "tools and no first user message", [m(S, "sys")], {"tools": TOOLS}),
]


def read(name):
    with open(os.path.join(DIR, name + ".jinja"), encoding="utf-8") as f:
        return f.read()


def write_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, indent=1)
        f.write("\n")


LLAMA3_SPLIT = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
                "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
LLAMA3_SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>",
                  "<|eom_id|>", "<|python_tag|>"]


def added(i, content, special=True, rstrip=False):
    return {"id": i, "content": content, "single_word": False, "lstrip": False, "rstrip": rstrip,
            "normalized": False, "special": special}


def tok_llama3():
    with open(os.path.join(HERE, "qwen2_tok", "tokenizer.json"), encoding="utf-8") as f:
        tj = json.load(f)
    vocab = tj["model"]["vocab"]
    for a in tj["added_tokens"]:  # (Qwen's three specials out of the vocab; Llama 3's appended)
        del vocab[a["content"]]
    vocab = {k: i for i, k in enumerate(sorted(vocab, key=vocab.get))}
    tj["added_tokens"] = []
    for t in LLAMA3_SPECIAL:
        vocab[t] = len(vocab)
        tj["added_tokens"].append(added(vocab[t], t))
    tj["model"]["vocab"] = vocab
    tj["model"]["ignore_merges"] = True
    tj["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = LLAMA3_SPLIT
    bos = "<|begin_of_text|>"
    tj["post_processor"] = {"type": "TemplateProcessing",
                            "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                            "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                                     {"SpecialToken": {"id": bos, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
                            "special_tokens": {bos: {"id": bos, "ids": [vocab[bos]], "tokens": [bos]}}}
    cfg = {"added_tokens_decoder": {str(a["id"]): {k: v for k, v in a.items() if k != "id"} for a in tj["added_tokens"]},
           "bos_token": bos, "eos_token": "<|eot_id|>", "clean_up_tokenization_spaces": True,
           "model_input_names": ["input_ids", "attention_mask"], "model_max_length": 131072,
           "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": read("llama3")}
    return tj, cfg


PHI3_ADDED = [("<|endoftext|>", False), ("<|assistant|>", True), ("<|placeholder1|>", True), ("<|placeholder2|>", True),
              ("<|placeholder3|>", True), ("<|placeholder4|>", True), ("<|system|>", True), ("<|end|>", True),
              ("<|placeholder5|>", True), ("<|placeholder6|>", True), ("<|user|>", True)]


def tok_phi3(tinyllama):
    with open(os.path.join(tinyllama, "tokenizer.json"), encoding="utf-8") as f:
        tj = json.load(f)
    old = tj["model"]["vocab"]
    keep = [t for t, i in sorted(old.items(), key=lambda kv: kv[1]) if i < 259]  # <unk> <s> </s> <0x00>..<0xFF>
    kept = set(keep)
    for t in sorted(old, key=old.get):  # the single characters: Latin, "▁", punctuation
        if len(t) == 1 and ord(t) < 0x250 and t not in kept:
            keep.append(t)
            kept.add(t)
    merges = []
    for mg in tj["model"]["merges"]:
        a, b = mg.split(" ") if isinstance(mg, str) else mg
        if a in kept and b in kept and (a + b) in old and (a + b) not in kept:
            merges.append([a, b])
            keep.append(a + b)
            kept.add(a + b)
            if len(merges) == 1500:
                break
    vocab = {t: i for i, t in enumerate(keep)}
    tj["model"]["vocab"], tj["model"]["merges"] = vocab, merges
    tj["added_tokens"][2]["rstrip"] = True  # (</s>: rstrip, not special, as Phi-3 ships it)
    tj["added_tokens"][2]["special"] = False
    for t, rs in PHI3_ADDED:
        vocab[t] = len(vocab)
        tj["added_tokens"].append(added(vocab[t], t, rstrip=rs))
    cfg = {"add_bos_token": False, "add_eos_token": False,
           "added_tokens_decoder": {str(a["id"]): {k: v for k, v in a.items() if k != "id"} for a in tj["added_tokens"]},
           "bos_token": "<s>", "clean_up_tokenization_spaces": False, "eos_token": "<|endoftext|>", "legacy": False,
           "model_max_length": 131072, "pad_token": "<|endoftext|>", "padding_side": "left",
           "tokenizer_class": "LlamaTokenizer", "unk_token": "<unk>", "use_default_system_prompt": False,
           "chat_template": read("phi3")}
    return tj, cfg


def save(name, tj, cfg):
    d = os.path.join(DIR, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tj, f, ensure_ascii=False, indent=1)
        f.write("\n")
    write_json(os.path.join(d, "tokenizer_config.json"), cfg)
    return AutoTokenizer.from_pretrained(d)


def main():
    tinyllama = sys.argv[1] if len(sys.argv) > 1 else "/work/shared/data/tokenizers/tinyllama-1.1b-chat-v1.0"
    toks = {"llama": save("tok_llama3", *tok_llama3()), "phi": save("tok_phi3", *tok_phi3(tinyllama))}
    templates = {n: read(n) for n in TEMPLATES}
    assert toks["llama"].chat_template == templates["llama3"] and toks["phi"].chat_template == templates["phi3"]
    out = {"date_string": DATE, "conversations": [], "renders": [], "refused": []}
    for name, msgs, extra, which in CONVS:
        ci = len(out["conversations"])
        out["conversations"].append({"name": name, "messages": msgs, "kwargs": extra})
        for tname in which:
            tok = toks["llama" if tname in LLAMA else "phi"]
            dates = [DATE, "absent"] if tname == "llama3_1" else [DATE] if tname == "llama3_2" else ["absent"]
            if "date_string" in extra:
                dates = ["absent"]  # (the conversation's own)
            for date in dates:
                for agp in (False, True):
                    kw = dict(copy.deepcopy(extra), add_generation_prompt=agp, chat_template=templates[tname])
                    if date != "absent":
                        kw["date_string"] = date
                    rec = {"conversation": ci, "template": tname, "add_generation_prompt": agp, "date_string": date}
                    rec["text"] = tok.apply_chat_template(msgs, tokenize=False, **kw)
                    rec["input_ids"] = list(tok.apply_chat_template(msgs, tokenize=True, return_dict=True,
                                                                    **kw)["input_ids"])
                    out["renders"].append(rec)
    for tname, name, msgs, extra in REFUSED:
        tok = toks["llama"]
        try:
            tok.apply_chat_template(msgs, tokenize=False, chat_template=templates[tname], **extra)
            raise SystemExit(name + ": rendered")
        except SystemExit:
            raise
        except Exception as e:  # noqa: BLE001 (the record is what transformers raised)
            out["refused"].append({"template": tname, "name": name, "messages": msgs, "kwargs": extra,
                                   "error": type(e).__name__, "message": str(e)})
    with open(os.path.join(HERE, "llama3_phi3_chat.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print(f"wrote llama3_phi3_chat.json: {len(out['conversations'])} conversations, {len(out['renders'])} renders, "
          f"{len(out['refused'])} refused")


if __name__ == "__main__":
    main()
