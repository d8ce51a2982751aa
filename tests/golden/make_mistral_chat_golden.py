"""Writes tests/golden/mistral_v3_chat.json: Mistral-7B-Instruct-v0.3's chat template ([INST] ... [/INST], tool calls,
raise_exception on roles that do not alternate) rendered by transformers 5.17's apply_chat_template, with bos_token
"<s>" and eos_token "</s>" given as template variables, through the tokenizer of tests/golden/qwen2_tok (the text;
the ids are that tokenizer's); and the messages of the conversations the template refuses. Read by
tests/lua/test_tokenizer_qwen2.lua.
    python3 tests/golden/make_mistral_chat_golden.py
(needs transformers, not torch). Not part of the build or the test suite."""
import json
import os

from transformers import AutoTokenizer

HERE = os.path.dirname(os.path.abspath(__file__))

MISTRAL_V3_TEMPLATE = r"""{%- if messages[0]["role"] == "system" %}
    {%- set system_message = messages[0]["content"] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}
{%- set user_messages = loop_messages | selectattr("role", "equalto", "user") | list %}

{#- This block checks for alternating user/assistant messages, skipping tool calling messages #}
{%- set ns = namespace() %}
{%- set ns.index = 0 %}
{%- for message in loop_messages %}
    {%- if not (message.role == "tool" or message.role == "tool_results" or (message.tool_calls is defined and message.tool_calls is not none)) %}
        {%- if (message["role"] == "user") != (ns.index % 2 == 0) %}
            {{- raise_exception("After the optional system message, conversation roles must alternate user/assistant/user/assistant/...") }}
        {%- endif %}
        {%- set ns.index = ns.index + 1 %}
    {%- endif %}
{%- endfor %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if message["role"] == "user" %}
        {%- if tools is not none and (message == user_messages[-1]) %}
            {{- "[AVAILABLE_TOOLS] [" }}
            {%- for tool in tools %}
                {%- set tool = tool.function %}
                {{- '{"type": "function", "function": {' }}
                {%- for key, val in tool.items() if key != "return" %}
                    {%- if val is string %}
                        {{- '"' + key + '": "' + val + '"' }}
                    {%- else %}
                        {{- '"' + key + '": ' + val|tojson }}
                    {%- endif %}
                    {%- if not loop.last %}
                        {{- ", " }}
                    {%- endif %}
                {%- endfor %}
                {{- "}}" }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- else %}
                    {{- "]" }}
                {%- endif %}
            {%- endfor %}
            {{- "[/AVAILABLE_TOOLS]" }}
            {%- endif %}
        {%- if (message == user_messages[-1]) and system_message is defined %}
            {{- "[INST] " + system_message + "\n\n" + message["content"] + "[/INST]" }}
        {%- else %}
            {{- "[INST] " + message["content"] + "[/INST]" }}
        {%- endif %}
    {%- elif message.tool_calls is defined and message.tool_calls is not none %}
        {{- "[TOOL_CALLS] [" }}
        {%- for tool_call in message.tool_calls %}
            {%- set out = tool_call.function|tojson %}
            {{- out[:-1] }}
            {%- if not tool_call.id is defined or tool_call.id|length != 9 %}
                {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
            {%- endif %}
            {{- ', "id": "' + tool_call.id + '"}' }}
            {%- if not loop.last %}
                {{- ", " }}
            {%- else %}
                {{- "]" + eos_token }}
            {%- endif %}
        {%- endfor %}
    {%- elif message["role"] == "assistant" %}
        {{- " " + message["content"]|trim + eos_token}}
    {%- elif message["role"] == "tool_results" or message["role"] == "tool" %}
        {%- if message.content is defined and message.content.content is defined %}
            {%- set content = message.content.content %}
        {%- else %}
            {%- set content = message.content %}
        {%- endif %}
        {{- '[TOOL_RESULTS] {"content": ' + content|string + ", " }}
        {%- if not message.tool_call_id is defined or message.tool_call_id|length != 9 %}
            {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
        {%- endif %}
        {{- '"call_id": "' + message.tool_call_id + '"}[/TOOL_RESULTS]' }}
    {%- else %}
        {{- raise_exception("Only user and assistant roles are supported, with the exception of an initial optional system message!") }}
    {%- endif %}
{%- endfor %}"""

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]
CONVS = [
    ("user, assistant", [{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "  Hello!  "}], None),
    ("system, user, assistant, user", [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
                                       {"role": "assistant", "content": "4"}, {"role": "user", "content": "caf\u00e9?"}], None),
    ("tools and tool calls", [{"role": "user", "content": "Weather in Paris?"},
                              {"role": "assistant", "tool_calls": [{"id": "abc123XYZ", "type": "function", "function": {
                                  "name": "get_weather", "arguments": {"city": "Paris"}}}]},
                              {"role": "tool", "tool_call_id": "abc123XYZ", "content": "22 C"},
                              {"role": "assistant", "content": "Sunny."}], TOOLS),
]
REFUSED = [
    ("two user turns", [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]),
    ("assistant first", [{"role": "system", "content": "s"}, {"role": "assistant", "content": "a"}]),
    ("a tool call id of 3 chars", [{"role": "user", "content": "a"}, {"role": "assistant", "tool_calls": [
        {"id": "abc", "type": "function", "function": {"name": "f", "arguments": {}}}]}]),
]


def main():
    tok = AutoTokenizer.from_pretrained(os.path.join(HERE, "qwen2_tok"))
    kw = {"chat_template": MISTRAL_V3_TEMPLATE, "bos_token": "<s>", "eos_token": "</s>"}
    out = {"template": MISTRAL_V3_TEMPLATE, "renders": [], "refused": []}
    for name, msgs, tools in CONVS:
        for agp in (False, True):
            text = tok.apply_chat_template(msgs, tools=tools, tokenize=False, add_generation_prompt=agp, **kw)
            ids = tok.apply_chat_template(msgs, tools=tools, tokenize=True, return_dict=True, add_generation_prompt=agp,
                                          **kw)["input_ids"]
            out["renders"].append({"name": name, "messages": msgs, "tools": tools, "add_generation_prompt": agp,
                                   "text": text, "input_ids": list(ids)})
    for name, msgs in REFUSED:
        try:
            tok.apply_chat_template(msgs, tokenize=False, **kw)
            raise SystemExit(name + ": rendered")
        except Exception as e:  # jinja2.TemplateError
            out["refused"].append({"name": name, "messages": msgs, "error": type(e).__name__, "message": str(e)})
    with open(os.path.join(HERE, "mistral_v3_chat.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print("wrote mistral_v3_chat.json")


if __name__ == "__main__":
    main()
