"""Writes tests/golden/qwen3_chat.json: Qwen3's chat templates rendered by transformers 5.17's apply_chat_template
(the text; the ids too for the tokenizer's own template) over conversations that take every branch of them:
thinking in <think> blocks or in reasoning_content, earlier turns' thinking dropped after the last user query,
multi-step tool use (tool_calls with arguments as a dict and as a string, consecutive tool responses, user turns
that are tool responses), tools, system messages, add_generation_prompt with enable_thinking true / false / absent,
content that is not a string; and the conversations a template refuses, with transformers' exception.
Read by tests/lua/test_chat_qwen3.lua.

The templates (tests/golden/qwen3_chat/*.jinja, the inputs; byte for byte as published):
  qwen3.jinja               the chat_template of Qwen/Qwen3-0.6B's tokenizer_config.json as shipped now (Qwen3-8B's
                            and the other Qwen3 checkpoints' too), as TRL 1.10 ships it for identity comparison
                            (trl/chat_templates/qwen3.jinja: get_training_chat_template matches the tokenizer's
                            template against it)
  qwen3_2504.jinja          the first release of it (April 2025, before `content is string`), as llama.cpp keeps it
                            in models/templates/Qwen-Qwen3-0.6B.jinja (ggml-org/llama.cpp; LF line endings)
  qwen3_instruct_2507.jinja Qwen3-*-Instruct-2507's (no thinking), trl/chat_templates/qwen3_instruct_2507.jinja
  qwen3_thinking_2507.jinja Qwen3-*-Thinking-2507's: qwen3.jinja whose generation prompt always opens <think>
                            (no enable_thinking), as unsloth's chat_templates.py ("qwen3-thinking") copies it
The tokenizer: tests/golden/qwen2_tok's (Qwen2's byte-level BPE, 1,000 merges) with Qwen3's added tokens <think>,
</think>, <tool_call>, </tool_call>, <tool_response>, </tool_response> (not special, as in Qwen3's tokenizer), saved
with qwen3.jinja as its template to tests/golden/qwen3_chat/tok.
    python3 tests/golden/make_qwen3_chat_golden.py
(needs transformers, not torch). Not part of the build or the test suite."""
import json
import os

from transformers import AutoTokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
DIR = os.path.join(HERE, "qwen3_chat")
TEMPLATES = ["qwen3", "qwen3_2504", "qwen3_instruct_2507", "qwen3_thinking_2507"]
ADDED = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city, \u00b0C.",
                                      "parameters": {"type": "object", "properties": {
                                          "city": {"type": "string", "description": "e.g. \"S\u00e3o Paulo\""},
                                          "days": {"type": "integer", "default": 1}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "scale", "parameters": {
        "type": "object", "properties": {"x": {"type": "number", "default": 1.0, "minimum": -2.5e-3}}}}},
]
U, A, S, T = "user", "assistant", "system", "tool"


def m(role, content=None, **kw):
    d = {"role": role}
    if content is not None or "null" in kw:
        d["content"] = content
    kw.pop("null", None)
    d.update(kw)
    return d


def call(name, args, wrapped=True, **kw):
    f = {"name": name, "arguments": args}
    d = {"type": "function", "function": f} if wrapped else f
    d.update(kw)
    return d


CONVS = [
    ("user only", [m(U, "Hi there")]),
    ("system, user", [m(S, "Be brief."), m(U, "2+2?")]),
    ("user, assistant (no thinking)", [m(U, "2+2?"), m(A, "4")]),
    ("user, assistant with a <think> block", [m(U, "2+2?"), m(A, "<think>\nTwo and two.\n</think>\n\n4")]),
    ("assistant's </think> without <think>", [m(U, "2+2?"), m(A, "Two and two.\n</think>\n\n4")]),
    ("assistant's <think> without </think>", [m(U, "2+2?"), m(A, "<think>\nTwo and two.\n4")]),
    ("two </think> in one turn", [m(U, "q"), m(A, "<think>a</think>b</think>\n\nc")]),
    ("newlines around the thinking and the answer",
     [m(U, "q"), m(A, "\n\n<think>\n\n\nthought\n\n\n</think>\n\n\n\nanswer\n\n")]),
    ("spaces and tabs kept where only newlines are stripped",
     [m(U, "q"), m(A, "<think>\n \t thought \n</think>\n \n answer "), m(U, "q2"),
      m(A, "\t answer 2", reasoning_content=" \n r \n ")]),
    ("reasoning_content field", [m(U, "2+2?"), m(A, "4", reasoning_content="\nTwo and two.\n")]),
    ("reasoning_content and a <think> block in content", [m(U, "q"), m(A, "<think>x</think>y", reasoning_content="r")]),
    ("reasoning_content empty", [m(U, "q"), m(A, "<think>x</think>y", reasoning_content="")]),
    ("reasoning_content null", [m(U, "q"), m(A, "<think>x</think>y", reasoning_content=None)]),
    ("multi-turn: earlier turns' thinking dropped",
     [m(S, "You think."), m(U, "first?"), m(A, "<think>t1</think>\n\na1"), m(U, "second?"),
      m(A, "a2", reasoning_content="t2"), m(U, "third?"), m(A, "<think>\nt3\n</think>\n\na3")]),
    ("multi-turn ending on a user turn", [m(U, "first?"), m(A, "<think>t1</think>a1"), m(U, "second?")]),
    ("an assistant turn after the last one, without thinking",
     [m(U, "q"), m(A, "<think>t</think>a"), m(A, "more, no thinking"), m(A, "<think>u</think>end")]),
    ("tools, no system message", [m(U, "Weather in Paris?")], TOOLS),
    ("tools and a system message", [m(S, "You help."), m(U, "Weather in Paris?")], TOOLS),
    ("tool call with arguments as a dict, tool response, answer",
     [m(U, "Weather in Paris?"),
      m(A, "<think>Call the tool.</think>", tool_calls=[call("get_weather", {"city": "Paris", "days": 2})]),
      m(T, "22 \u00b0C, sunny"), m(A, "<think>Got it.</think>\n\nSunny, 22 \u00b0C.")], TOOLS),
    ("tool call with arguments as a string", [m(U, "Scale 3"),
                                              m(A, "", tool_calls=[call("scale", '{"x": 3}')]), m(T, "3.0")], TOOLS),
    ("tool call unwrapped (no function key), content null",
     [m(U, "Now?"), m(A, null=True, tool_calls=[call("now", {}, wrapped=False)]), m(T, "12:00")]),
    ("two tool calls, content before them, consecutive tool responses",
     [m(S, "sys"), m(U, "Paris and Rome?"),
      m(A, "Checking both.", tool_calls=[call("get_weather", {"city": "Paris"}, id="c1"),
                                         call("get_weather", {"city": "Rome", "units": None, "x": [1, 2.5, True]},
                                              id="c2")]),
      m(T, "22", tool_call_id="c1"), m(T, "25", tool_call_id="c2"), m(A, "Paris 22, Rome 25.")], TOOLS),
    ("multi-step tools: thinking kept after the last user query",
     [m(U, "Plan a trip"), m(A, "<think>step 1</think>", tool_calls=[call("get_weather", {"city": "A"})]),
      m(T, "r1"), m(A, "", reasoning_content="step 2", tool_calls=[call("get_weather", {"city": "B"})]), m(T, "r2"),
      m(A, "<think>done</think>Go to B.")], TOOLS),
    ("a user turn that is a tool response does not count as the query",
     [m(U, "Real question"), m(A, "<think>t1</think>call"),
      m(U, "<tool_response>\nr\n</tool_response>"), m(A, "<think>t2</think>answer")]),
    ("a user turn that only starts like a tool response counts",
     [m(U, "q"), m(A, "<think>t1</think>call"), m(U, "<tool_response> and more"), m(A, "<think>t2</think>answer")]),
    ("a tool message first", [m(T, "orphan result"), m(U, "ok?"), m(A, "yes")]),
    ("a system message later in the conversation", [m(U, "q"), m(S, "late system"), m(A, "<think>t</think>a")]),
    ("an unknown role is left out", [m(U, "q"), m("ipython", "dropped"), m(A, "a")]),
    ("text with quotes, backslashes, unicode and emoji",
     [m(S, "Say \"hi\" \\ 'there'"), m(U, "caf\u00e9 \u4f60\u597d \U0001F600\ttab"),
      m(A, "<think>\u00fcber \\n</think>r\u00e9ponse \U0001F389")]),
    ("content as a list of blocks (not a string)",
     [m(U, [{"type": "text", "text": "blocks"}]), m(A, "<think>t</think>a")]),
    ("empty contents", [m(S, ""), m(U, ""), m(A, "")]),
]

# conversations a template refuses: transformers' exception (type and message)
REFUSED = [
    ("qwen3_2504", "assistant content null (the first release reads message.content)",
     [m(U, "Now?"), m(A, null=True, tool_calls=[call("now", {})])]),
    ("qwen3_2504", "user content as a list of blocks", [m(U, [{"type": "text", "text": "x"}]), m(A, "a")]),
    ("qwen3", "no messages", []),
]

# (template, add_generation_prompt, enable_thinking: "absent" / True / False) rendered for each conversation
RENDERS = {
    "qwen3": [(g, e) for g in (False, True) for e in ("absent", True, False)],
    "qwen3_2504": [(False, "absent"), (True, "absent"), (True, False)],
    "qwen3_instruct_2507": [(False, "absent"), (True, "absent"), (True, False)],
    "qwen3_thinking_2507": [(False, "absent"), (True, "absent"), (True, False)],
}


def read(name):
    with open(os.path.join(DIR, name + ".jinja"), encoding="utf-8") as f:
        return f.read()


def tokenizer():
    tok = AutoTokenizer.from_pretrained(os.path.join(HERE, "qwen2_tok"))
    tok.add_tokens(ADDED)
    tok.chat_template = read("qwen3")
    tok.eos_token, tok.pad_token = "<|im_end|>", "<|endoftext|>"
    tok.save_pretrained(os.path.join(DIR, "tok"))
    return AutoTokenizer.from_pretrained(os.path.join(DIR, "tok"))


def main():
    tok = tokenizer()
    templates = {n: read(n) for n in TEMPLATES}
    assert tok.chat_template == templates["qwen3"]
    out = {"conversations": [], "renders": [], "refused": []}
    for c in CONVS:
        name, msgs = c[0], c[1]
        tools = c[2] if len(c) > 2 else None
        ci = len(out["conversations"])
        out["conversations"].append({"name": name, "messages": msgs, "tools": tools})
        for tname in TEMPLATES:
            skip_2504 = tname == "qwen3_2504" and any(not isinstance(x.get("content"), str) for x in msgs)
            for agp, think in RENDERS[tname]:
                kw = {"add_generation_prompt": agp, "tools": tools}
                if think != "absent":
                    kw["enable_thinking"] = think
                if tname != "qwen3":
                    kw["chat_template"] = templates[tname]
                rec = {"conversation": ci, "template": tname, "add_generation_prompt": agp, "enable_thinking": think}
                if skip_2504:
                    continue  # (refused: see REFUSED)
                rec["text"] = tok.apply_chat_template(msgs, tokenize=False, **kw)
                if tname == "qwen3":  # (the ids of the tokenizer's own template; the others' text only)
                    rec["input_ids"] = list(tok.apply_chat_template(msgs, tokenize=True, return_dict=True,
                                                                    **kw)["input_ids"])
                out["renders"].append(rec)
    for tname, name, msgs in REFUSED:
        try:
            tok.apply_chat_template(msgs, tokenize=False, chat_template=templates[tname])
            raise SystemExit(name + ": rendered")
        except SystemExit:
            raise
        except Exception as e:  # noqa: BLE001 (the record is what transformers raised)
            out["refused"].append({"template": tname, "name": name, "messages": msgs, "error": type(e).__name__,
                                   "message": str(e)})
    with open(os.path.join(HERE, "qwen3_chat.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print(f"wrote qwen3_chat.json: {len(out['conversations'])} conversations, {len(out['renders'])} renders, "
          f"{len(out['refused'])} refused")


if __name__ == "__main__":
    main()
