"""Writes tests/golden/qwen2_tok/ (a small Qwen2.5-style tokenizer: tokenizer.json, tokenizer_config.json) and
tests/golden/qwen2_tok.json (what the `tokenizers` library and transformers 5.17 give for it). Read by
tests/lua/test_tokenizer_qwen2.lua.
The tokenizer: Qwen2.5's pipeline (normalizer NFC; pre-tokenizer Split(Qwen2's regex, as transformers'
tokenization_qwen2.py has it) then ByteLevel(add_prefix_space=false, use_regex=false); ByteLevel decoder), a
byte-level BPE of 1000 tokens trained on the first 300 non-empty lines of WikiText-2's validation split, and
<|endoftext|>, <|im_start|>, <|im_end|> as special tokens; tokenizer_config.json as Qwen2.5-Instruct ships it
(Qwen2Tokenizer, its chat template). The golden file holds:
  wikitext   the ids of the `tokenizers` library (tokenizer.json's pipeline) and of AutoTokenizer for
             WikiText-2 validation lines 300..339 (non-empty; line numbers and ids only: the test reads the text
             from ../shared/data and says SKIP without it);
  unicode    strings with combining characters, decomposed and precomposed letters, Hangul jamo, full-width
             digits, ..., and for each normalizer (NFC, NFD, NFKC, NFKD, Lowercase, Strip, StripAccents, a
             Sequence) the `tokenizers` library's ids with that normalizer in place of NFC (and its decode);
  auto       AutoTokenizer's ids of the unicode strings, on the directory as shipped and with a tokenizer.json
             whose pipeline differs (transformers 5 rebuilds Qwen2Tokenizer's from the class);
  chat       apply_chat_template's text and ids (with and without a system message, add_generation_prompt; with
             tools, tool calls and tool results).
    python3 tests/golden/make_qwen2_tok_golden.py [WIKITEXT_DIR]
(default ../shared/data/wikitext-2-raw; needs tokenizers and transformers, not torch). Not part of the build or
the test suite."""
import copy
import json
import os
import shutil
import sys
import tempfile

from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, trainers
from tokenizers.models import BPE

HERE = os.path.dirname(os.path.abspath(__file__))
OUT_DIR = os.path.join(HERE, "qwen2_tok")
OUT_JSON = os.path.join(HERE, "qwen2_tok.json")
# transformers 5.17, models/qwen2/tokenization_qwen2.py
PRETOKENIZE_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TRAIN_LINES, TEST_FROM, TEST_LINES = 300, 300, 40

# Qwen2.5-Instruct's chat template (tokenizer_config.json's "chat_template").
QWEN25_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""

UNICODE = [
    "caf\u00e9 vs cafe\u0301",                      # precomposed and decomposed é
    "\u00c5ngstr\u00f6m A\u030angstro\u0308m \u212b",   # Å three ways (U+00C5, A + ring, the Angstrom sign)
    "\u1100\u1161\u11a8 \uac01 \u1112\u1161\u11ab\u1100\u1173\u11af",  # Hangul jamo (compose to 각, 한글) and a syllable
    "\uff11\uff12\uff13 \uff21\uff22\uff43 \u2460 x\u00b2 \ufb01ne",  # full-width digits and letters, ①, ², the fi ligature
    "  \u0130stanbul \u03a3\u039f\u03a6\u039f\u03a3 STRASSE \u1e9e  ",  # İ, Greek capitals, ẞ; spaces at both ends
    "e\u0301\u0302\u0323 o\u0308\u0304 \u1e69 s\u0323\u0307",  # stacked combining marks (canonical reordering)
    "na\u00efve r\u00e9sum\u00e9 \u00fcber \u00f1and\u00fa",
    "\t\n Tab, new line \u3000ideographic space\u2003em space\n",
    "<|im_start|>user\ncaf\u00e9\u0301<|im_end|>\n",
    "The 2023 \u2013 24 season : 1 @,@ 000 km\u00b2 .",
]
NORMALIZERS = {
    "NFC": {"type": "NFC"}, "NFD": {"type": "NFD"}, "NFKC": {"type": "NFKC"}, "NFKD": {"type": "NFKD"},
    "Lowercase": {"type": "Lowercase"},
    "Strip": {"type": "Strip", "strip_left": True, "strip_right": True},
    "StripRight": {"type": "Strip", "strip_left": False, "strip_right": True},
    "StripAccents": {"type": "StripAccents"},
    "Sequence NFD StripAccents Lowercase": {"type": "Sequence", "normalizers": [
        {"type": "NFD"}, {"type": "StripAccents"}, {"type": "Lowercase"}]},
    "Sequence NFKC Replace": {"type": "Sequence", "normalizers": [
        {"type": "NFKC"}, {"type": "Replace", "pattern": {"String": " "}, "content": "_"}]},
}
CONVS = [
    [{"role": "user", "content": "What is the capital of France?"},
     {"role": "assistant", "content": "Paris."}],
    [{"role": "system", "content": "You answer in one word."},
     {"role": "user", "content": "Colour of the sky? caf\u00e9\u0301"},
     {"role": "assistant", "content": "Blue"},
     {"role": "user", "content": "And grass \uff11\uff12?"},
     {"role": "assistant", "content": " Green, 42 times\n\nnew lines."}],
]


# Qwen2.5's tool-calling branch: a tool given as a JSON schema, an assistant turn with tool_calls, tool results.
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]
TOOL_CONV = [{"role": "user", "content": "Weather in Paris?"},
             {"role": "assistant", "content": "", "tool_calls": [
                 {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
             {"role": "tool", "content": "22 C, sunny"},
             {"role": "tool", "content": "no rain"},
             {"role": "assistant", "content": "Sunny, 22 C."}]


def wikitext_lines(d):
    with open(os.path.join(d, "wiki.valid.raw"), encoding="utf-8") as f:
        lines = [(i, l.rstrip("\n")) for i, l in enumerate(f) if l.strip()]
    return lines


def train(lines):
    tok = Tokenizer(BPE(unk_token=None, continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False,
                        byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1000, min_frequency=2, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([l for _, l in lines], trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    return tok


def tokenizer_config(tok):
    added = {str(tok.token_to_id(t)): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                                       "single_word": False, "special": True} for t in SPECIALS}
    return {"add_bos_token": False, "add_prefix_space": False, "added_tokens_decoder": added,
            "additional_special_tokens": ["<|im_start|>", "<|im_end|>"], "bos_token": None,
            "chat_template": QWEN25_TEMPLATE, "clean_up_tokenization_spaces": False, "eos_token": "<|im_end|>",
            "errors": "replace", "model_max_length": 131072, "pad_token": "<|endoftext|>",
            "split_special_tokens": False, "tokenizer_class": "Qwen2Tokenizer", "unk_token": None}


def with_pipeline(tok_json, normalizer=None, pre_tokenizer=None):
    j = copy.deepcopy(tok_json)
    if normalizer is not None: j["normalizer"] = normalizer
    if pre_tokenizer is not None: j["pre_tokenizer"] = pre_tokenizer
    return j


def auto_ids(tok_json, cfg, texts):
    from transformers import AutoTokenizer
    d = tempfile.mkdtemp()
    try:
        with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f: json.dump(tok_json, f)
        with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f: json.dump(cfg, f)
        at = AutoTokenizer.from_pretrained(d)
        return type(at).__name__, [at(t)["input_ids"] for t in texts]
    finally:
        shutil.rmtree(d)


def main():
    wdir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "../../../shared/data/wikitext-2-raw")
    lines = wikitext_lines(wdir)
    tok = train(lines[:TRAIN_LINES])
    os.makedirs(OUT_DIR, exist_ok=True)
    tok.save(os.path.join(OUT_DIR, "tokenizer.json"))
    with open(os.path.join(OUT_DIR, "tokenizer.json"), encoding="utf-8") as f: tok_json = json.load(f)
    cfg = tokenizer_config(tok)
    with open(os.path.join(OUT_DIR, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=2, ensure_ascii=False)
        f.write("\n")

    from transformers import AutoTokenizer
    at = AutoTokenizer.from_pretrained(OUT_DIR)
    test = lines[TEST_FROM:TEST_FROM + TEST_LINES]
    out = {"wikitext": [], "unicode": UNICODE, "normalizers": [], "auto": [], "chat": []}
    for i, l in test:  # (AutoTokenizer's ids only where they differ from the `tokenizers` library's)
        row, auto = {"line": i, "ids": tok.encode(l).ids}, at(l)["input_ids"]
        if auto != row["ids"]: row["auto_ids"] = auto
        out["wikitext"].append(row)
    for name, nj in NORMALIZERS.items():
        t = Tokenizer.from_str(json.dumps(with_pipeline(tok_json, normalizer=nj)))
        encs = [t.encode(s).ids for s in UNICODE]
        out["normalizers"].append({"name": name, "normalizer": json.dumps(nj), "ids": encs,
                                   "normalized": [t.normalizer.normalize_str(s) for s in UNICODE],
                                   "decoded": [t.decode(e) for e in encs]})
    # transformers 5 rebuilds Qwen2Tokenizer's pipeline from the class: tokenizer.json's normalizer and
    # pre-tokenizer do not count (here: none, NFKC, a ByteLevel with a prefix space); add_prefix_space does.
    byte_only = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
    variants = [("as shipped", None, None, {}), ("no normalizer", {"type": "Sequence", "normalizers": []}, None, {}),
                ("NFKC normalizer", {"type": "NFKC"}, None, {}), ("GPT-2 ByteLevel pre-tokenizer", None, byte_only, {}),
                ("add_prefix_space true", None, None, {"add_prefix_space": True})]
    for name, nj, pj, cfg_over in variants:
        j = with_pipeline(tok_json, normalizer=nj, pre_tokenizer=pj)
        if nj is not None and nj.get("normalizers") == []: j["normalizer"] = None
        c = dict(cfg, **cfg_over)
        cls, ids = auto_ids(j, c, UNICODE)
        out["auto"].append({"name": name, "normalizer": json.dumps(j["normalizer"]),
                            "pre_tokenizer": json.dumps(j["pre_tokenizer"]),
                            "config": cfg_over, "class": cls, "ids": ids,
                            "tokenizer_json_ids": [Tokenizer.from_str(json.dumps(j)).encode(s).ids for s in UNICODE]})
    for ci, conv in enumerate(CONVS):
        for agp in (False, True):
            msgs = conv[:-1] if agp else conv
            text = at.apply_chat_template(msgs, tokenize=False, add_generation_prompt=agp)
            ids = at.apply_chat_template(msgs, tokenize=True, return_dict=True, add_generation_prompt=agp)["input_ids"]
            out["chat"].append({"messages": msgs, "add_generation_prompt": agp, "text": text, "input_ids": list(ids)})
    for agp in (False, True):
        msgs = TOOL_CONV[:-1] if agp else TOOL_CONV
        text = at.apply_chat_template(msgs, tools=TOOLS, tokenize=False, add_generation_prompt=agp)
        ids = at.apply_chat_template(msgs, tools=TOOLS, tokenize=True, return_dict=True, add_generation_prompt=agp)
        out["chat"].append({"messages": msgs, "tools": TOOLS, "add_generation_prompt": agp, "text": text,
                            "input_ids": list(ids["input_ids"])})
    out["decode"] = {"ids": out["wikitext"][0]["ids"][:20] + [tok.token_to_id("<|im_end|>")] + [200, 201],
                     "text": None}
    out["decode"]["text"] = at.decode(out["decode"]["ids"])
    out["decode"]["skip_special"] = at.decode(out["decode"]["ids"], skip_special_tokens=True)
    with open(OUT_JSON, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=None, separators=(",", ":"))
        f.write("\n")
    print("wrote", OUT_DIR, OUT_JSON, "class", type(at).__name__)


if __name__ == "__main__":
    main()
