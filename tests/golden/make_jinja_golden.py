"""Writes tests/golden/jinja/cases.json: what jinja2 itself renders for the chat-template cases below,
in the environment transformers builds for chat templates (ImmutableSandboxedEnvironment with
trim_blocks, lstrip_blocks, loop controls, a {% generation %} tracker, its tojson filter and the
raise_exception / strftime_now globals, all restated here). Read by tests/lua/test_jinja.lua.
    python3 tests/golden/make_jinja_golden.py [DATA_DIR]
(DATA_DIR defaults to $ZRUN_TEST_DATA or ../shared/data; when its TinyLlama tokenizer_config.json is
there, its chat template is rendered too: only the outputs and the template's SHA-256 are stored).
Needs jinja2 >= 3.1, not transformers. Not part of the build or the test suite.

Each case: name, template, context (JSON; a key left out is undefined, null is none), and either
text + spans (the {% generation %} blocks' [start, end) offsets, in UTF-8 bytes for the Lua side, and
in characters as transformers reports them) or error (+ error_kind: raise / syntax with its line /
runtime) and, for runtime errors, lua_error, a substring the Lua message must contain."""
import hashlib
import json
import os
import sys
from datetime import datetime

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))


class GenerationTracker(jinja2.ext.Extension):
    """{% generation %}...{% endgeneration %}: renders its body and notes where that text lands in the
    output, i.e. the length of everything the top-level render has produced so far (what transformers'
    tracker measures) and that plus the body's length."""

    tags = {"generation"}

    def __init__(self, environment):
        super().__init__(environment)
        self.produced = None  # the top-level chunks rendered so far, while a render is tracked
        self.spans = None

    def parse(self, parser):
        line = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_track"), [], [], body).set_lineno(line)

    def _track(self, caller):
        text = caller()
        if self.produced is not None:
            start = sum(len(c) for c in self.produced)
            self.spans.append((start, start + len(text)))
        return text


def make_env():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTracker, jinja2.ext.loopcontrols])

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


ENV = make_env()
TRACKER = next(e for e in ENV.extensions.values() if isinstance(e, GenerationTracker))


def render(template, context):
    """The text and the generation spans (in characters), as transformers' rendering gives them."""
    compiled = ENV.from_string(template)
    chunks, spans = [], []
    TRACKER.produced, TRACKER.spans = chunks, spans
    try:
        for chunk in compiled.generate(**context):
            chunks.append(chunk)
    finally:
        TRACKER.produced = TRACKER.spans = None
    return "".join(chunks), spans


def byte_offset(text, i):
    return len(text[:i].encode("utf-8"))


# ---------------------------------------------------------------------------------------------------
# Conversations. Dicts are written with their keys in sorted order: Lua tables have no key order and
# zrun.jinja iterates and prints a decoded mapping with sorted keys.

def msg(role, content):
    return {"content": content, "role": role}


SYS_CHAT = [msg("system", "You are terse."), msg("user", "Hi!"), msg("assistant", "Hello."),
            msg("user", "What is 2+2?"), msg("assistant", "4")]
CHAT = SYS_CHAT[1:]
WEATHER_TOOL = {"function": {"description": "Current weather in a city.", "name": "get_weather",
                             "parameters": {"properties": {"city": {"description": "City name", "type": "string"}},
                                            "required": ["city"], "type": "object"}},
                "type": "function"}
TOOL_CHAT = [msg("system", "Use tools when useful."), msg("user", "Weather in Paris?"),
             {"content": None, "role": "assistant",
              "tool_calls": [{"function": {"arguments": {"city": "Paris"}, "name": "get_weather"}, "type": "function"}]},
             msg("tool", "18C, sunny"), msg("tool", "wind 5 km/h"), msg("assistant", "It is 18C and sunny.")]
BASE = {"messages": SYS_CHAT, "bos_token": "<s>", "eos_token": "</s>", "add_generation_prompt": False,
        "n": 7, "f": 2.5, "s": "Hello World", "lst": [3, 1, 2], "d": {"a": 1, "b": "two"}, "none_v": None,
        "t": True, "e": "", "words": ["b", "A", "a", "c"], "people": [{"age": 30, "name": "Ann", "role": "user"},
        {"age": 7, "name": "Bob", "role": "system"}, {"age": 41, "name": "Cy", "role": "user"}]}

# ---------------------------------------------------------------------------------------------------
# Templates in the styles of real chat templates (written for these tests).

CHATML_TOOLS = """\
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content }}
    {%- else %}
        {{- 'You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson(sort_keys=true) }}
    {%- endfor %}
    {{- "\\n</tools><|im_end|>\\n" }}
{%- elif messages[0]['role'] == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
{%- endif %}
{%- set ns = namespace(in_tools=false, last_user=-1) %}
{%- for message in messages %}
    {%- if message.role == 'user' %}{% set ns.last_user = loop.index0 %}{% endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if loop.first and message.role == 'system' %}
        {%- continue %}
    {%- endif %}
    {%- if message.role == 'user' %}
        {{- '<|im_start|>user\\n' + message.content + '<|im_end|>\\n' }}
    {%- elif message.role == 'assistant' %}
        {{- '<|im_start|>assistant\\n' }}
        {%- generation %}
            {%- if message.content %}{{ message.content }}{% endif %}
            {%- for call in message.tool_calls | default([]) %}
                {%- set fn = call.function if call.function is defined else call %}
                {{- '\\n<tool_call>\\n{"name": "' ~ fn.name ~ '", "arguments": ' ~ fn.arguments | tojson ~ '}\\n</tool_call>' }}
            {%- endfor %}
            {{- '<|im_end|>' }}
        {%- endgeneration %}
        {{- '\\n' }}
    {%- elif message.role == 'tool' %}
        {%- if not ns.in_tools %}{{ '<|im_start|>user' }}{% set ns.in_tools = true %}{% endif %}
        {{- '\\n<tool_response>\\n' ~ message.content ~ '\\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}
            {{- '<|im_end|>\\n' }}{% set ns.in_tools = false %}
        {%- endif %}
    {%- endif %}
    {%- if loop.index0 == ns.last_user and stop_after_last_user | default(false) %}{% break %}{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

LLAMA3_STYLE = """\
{{- bos_token }}
{%- if not date_string is defined %}
    {%- set date_string = strftime_now("%d %b %Y") %}
{%- endif %}
{%- if tools is not defined %}{% set tools = none %}{% endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] | trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{%- if tools is not none %}
    {{- "Environment: ipython\\n" }}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\\nToday Date: " + date_string + "\\n\\n" }}
{%- if tools is not none %}
    {{- "Functions you can call, as JSON schemas:\\n\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message + "<|eot_id|>" }}
{%- for message in messages %}
    {%- if 'tool_calls' in message %}
        {%- set call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}
        {{- '{"name": "' + call.name + '", "parameters": ' + call.arguments | tojson + '}<|eot_id|>' }}
    {%- elif message.role in ['tool', 'ipython'] %}
        {{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' }}
        {%- if message.content is mapping %}{{ message.content | tojson }}{% else %}{{ message.content }}{% endif %}
        {{- '<|eot_id|>' }}
    {%- else %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

MISTRAL_STYLE = """\
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{{- bos_token }}
{%- for message in loop_messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {%- if message['role'] == 'user' %}
        {%- if loop.first and system_message is defined %}
            {{- '[INST] ' + system_message + '\\n\\n' + message['content'] + ' [/INST]' }}
        {%- else %}
            {{- '[INST] ' + message['content'] + ' [/INST]' }}
        {%- endif %}
    {%- elif message['role'] == 'assistant' %}
        {% generation %}{{- ' ' + message['content'] + eos_token }}{% endgeneration %}
    {%- else %}
        {{- raise_exception('Only user and assistant roles are supported after the system message, got ' + message['role']) }}
    {%- endif %}
{%- endfor %}
"""

GEMMA_STYLE = """\
{{ bos_token }}
{%- macro turn(role, text, close=true) -%}
<start_of_turn>{{ role }}
{{ text | trim }}{% if close %}<end_of_turn>
{% endif %}
{%- endmacro -%}
{%- if messages[0]['role'] == 'system' -%}
    {%- set prefix = messages[0]['content'] | trim + '\\n\\n' -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- set role = "model" if message['role'] == 'assistant' else message['role'] -%}
    {{ turn(role, (prefix if loop.first else "") + message['content'], close=not (loop.last and continue_final)) }}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{ '<start_of_turn>model\\n' }}
{%- endif -%}
"""

PHI3_STYLE = """{% for message in messages %}
  {% if message['role'] == 'system' %}
    {{'<|system|>\\n' + message['content'] + '<|end|>\\n'}}
  {% elif message['role'] == 'user' %}
    {{'<|user|>\\n' + message['content'] + '<|end|>\\n'}}
  {% elif message['role'] == 'assistant' %}
    {{'<|assistant|>\\n'}}{% generation %}{{ message['content'] + '<|end|>' }}{% endgeneration %}{{ '\\n' }}
  {% endif %}
{% endfor %}
{% if add_generation_prompt %}
  {{ '<|assistant|>\\n' }}
{% else %}
  {{ eos_token }}
{% endif %}
"""

DEEPSEEK_STYLE = """{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}
{%- set ns = namespace(found=false) -%}
{%- for message in messages -%}
    {%- if message['role'] == 'system' -%}
        {%- set ns.found = true -%}
    {%- endif -%}
{%- endfor -%}
{{bos_token}}{%- if not ns.found -%}
{{'You are a helpful coding assistant.\\n'}}
{%- endif %}
{%- for message in messages %}
    {%- if message['role'] == 'system' %}
{{ message['content'] }}
    {%- else %}
        {%- if message['role'] == 'user' %}
{{'### Instruction:\\n' + message['content'] + '\\n'}}
        {%- else %}
{{'### Response:\\n' + message['content'] + '\\n<|EOT|>\\n'}}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{% if add_generation_prompt %}
{{'### Response:'}}
{% endif %}"""

ZEPHYR_STYLE = """{% for message in messages %}
{% if message['role'] == 'user' %}
{{ '<|user|>\\n' + message['content'] + eos_token }}
{% elif message['role'] == 'system' %}
{{ '<|system|>\\n' + message['content'] + eos_token }}
{% elif message['role'] == 'assistant' %}
{{ '<|assistant|>\\n'  + message['content'] + eos_token }}
{% endif %}
{% if loop.last and add_generation_prompt %}
{{ '<|assistant|>' }}
{% endif %}
{% endfor %}"""

THINKING_STYLE = """\
{%- set ns = namespace(last_query=messages | length - 1, multi_step=true) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages | length - 1) - loop.index0 %}
    {%- if ns.multi_step and message.role == "user" and message.content is string
          and not (message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step = false %}
        {%- set ns.last_query = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- set content = message.content if message.content is string else '' %}
    {%- if message.role in ["system", "user"] %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning = message.reasoning_content %}
        {%- elif '</think>' in content %}
            {%- set reasoning = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
            {%- set content = content.split('</think>')[-1].lstrip('\n') %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query and (loop.last or reasoning) %}
            {{- '<|im_start|>assistant\n<think>\n' + reasoning.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
        {%- else %}
            {{- '<|im_start|>assistant\n' + content }}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}
"""

SCHEMA_MACRO_STYLE = """\
{%- macro py_type(spec) -%}
    {%- set map = {"string": "str", "number": "float", "integer": "int", "boolean": "bool"} -%}
    {%- if spec.type is not defined -%}Any
    {%- elif spec.type in map -%}{{ map[spec.type] }}
    {%- elif spec.type == "array" -%}list[{{ py_type(spec['items']) if spec['items'] is defined else 'Any' }}]
    {%- elif spec.type == "object" -%}dict
    {%- else -%}Any{%- endif -%}
{%- endmacro -%}
{%- for tool in tools %}
    {%- set fn = tool.function if tool.function is defined else tool %}
def {{ fn.name }}({% for name, spec in fn.parameters.properties | items %}{{ name }}: {{ py_type(spec) }}{{ ", " if not loop.last }}{% endfor %}):
    \"\"\"{{ fn.description | trim }}

    Args:
{% for name, spec in fn.parameters.properties.items() %}
        {{ name }}{{ " (required)" if name in fn.parameters.required | default([]) }}: {{ spec.description | default("no description") }}
{% endfor %}
    \"\"\"
{% endfor %}"""

MULTIMODAL_STYLE = """\
{%- for message in messages -%}
<|{{ message['role'] }}|>
{%- if message['content'] is string -%}
{{ message['content'] }}
{%- else -%}
{%- for item in message['content'] -%}
{%- if item['type'] == 'image' -%}<image>{%- elif item['type'] == 'text' -%}{{ item['text'] | trim }}{%- endif -%}
{{- ' ' if not loop.last -}}
{%- endfor -%}
{%- endif %}

{% endfor -%}"""

SCHEMA_TOOLS = [WEATHER_TOOL, {"function": {"description": "  Search the web. ", "name": "search", "parameters": {
    "properties": {"n": {"type": "integer"}, "query": {"description": "What to look for", "type": "string"},
                   "tags": {"items": {"type": "string"}, "type": "array"}, "when": {}}, "required": ["query"],
    "type": "object"}}, "type": "function"}]

NON_ASCII = """{% for m in messages %}<{{ m.role | upper }}>{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}{% else %}{{ m.content }}{% endif %}
{% endfor %}"""

# ---------------------------------------------------------------------------------------------------
# Small cases: every filter, test, operator, method and whitespace rule (rendered with BASE).

SMALL = [
    # filters
    ("filter_trim", "[{{ '  a b \\n' | trim }}][{{ 'xxaxyx' | trim('xy') }}][{{ undefined_v | trim }}]"),
    ("filter_length_count", "{{ lst | length }} {{ 'héllo' | length }} {{ d | count }} {{ '' | length }} {{ messages | length }}"),
    ("filter_tojson_default", "{{ d | tojson }} {{ [1, 'a', none, true, 2.5] | tojson }} {{ 'é\"\\n' | tojson }} {{ {} | tojson }} {{ [] | tojson }}"),
    ("filter_tojson_indent", "{{ people | tojson(indent=2) }}\n{{ {'z': [1, {'y': []}], 'a': none} | tojson(indent=3) }}"),
    ("filter_tojson_separators", "{{ people[0] | tojson(separators=(',', ':')) }} {{ {'b': 1, 'a': 2} | tojson(sort_keys=true) }} {{ d | tojson(indent='\\t', sort_keys=True) }}"),
    # transformers' tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False): ensure_ascii
    # (Reka-Edge's tojson(ensure_ascii=True)) writes \\uXXXX, surrogate pairs above U+FFFF, DEL as \\u007f
    ("filter_tojson_ensure_ascii", "{{ {'\u00e9': 'Z\u00fcrich \u4f60 \U0001F642 \x7f', 'n': [1, 'a\\n']} | tojson(ensure_ascii=true) }} {{ ['\u00e9\x7f'] | tojson(ensure_ascii=false) }} {{ '\u00e9' | tojson(true) }} {{ ['\u00e9'] | tojson(false, 2) }}"),
    # a str inside a printed list/dict (or |string of one) is Python's repr: it escapes what str.isprintable()
    # rejects, non-ASCII too (NBSP, ZWJ, ideographic space, U+2028, BOM, soft hyphen, tag characters)
    ("repr_nonprintable_unicode", "{{ ['nbsp\u00a0x', 'zwj\u200d', 'ideo\u3000sp', 'ls\u2028', 'bom\ufeff', 'shy\u00ad', 'c1\u0085', 'ok é 你 🙂', 'tag\U000e0041'] }} {{ {'k\u00a0': 'v\u202f'} | string }} {{ ('pua\ue000',) }}"),
    # x[] is x[()] in jinja2 (an empty tuple key: undefined here), not a parse error
    ("subscript_empty", "[{{ lst[] }}][{{ d[] }}][{{ s[] is defined }}]"),
    ("filter_string_int_float", "{{ 3 | string }}{{ (3 | string) + 'x' }} {{ '42' | int + 1 }} {{ 'x' | int }} {{ 'x' | int(5) }} {{ 3.9 | int }} {{ '3.7' | int }} {{ '2' | float }} {{ 4 | float }} {{ 'x' | float }} {{ 2.25 | string }}"),
    ("filter_case", "{{ s | upper }} {{ s | lower }} {{ 'hello wORLD-foo(bar' | title }} {{ 'hELLO world' | capitalize }}"),
    ("filter_default", "[{{ undefined_v | default('dflt') }}][{{ e | default('dflt') }}][{{ e | default('dflt', true) }}][{{ none_v | d('x') }}][{{ none_v | default('x', boolean=true) }}][{{ undefined_v | d }}]"),
    ("filter_join", "{{ lst | join(', ') }} {{ words | join }} {{ people | join('/', attribute='name') }} {{ lst | join(d='-') }}"),
    ("filter_first_last", "{{ lst | first }} {{ lst | last }} {{ 'abc' | first }} {{ 'abc' | last }} {{ messages | first | attr('role') }} [{{ [] | first }}]"),
    ("filter_list_items", "{{ 'abc' | list }} {{ d | list }} {{ d | items | list }} {% for k, v in d | items %}{{ k }}={{ v }};{% endfor %}"),
    ("filter_dictsort", "{{ {'b': 1, 'a': 3, 'C': 2} | dictsort }} {{ {'b': 1, 'a': 3} | dictsort(by='value', reverse=true) }}"),
    ("filter_replace_reverse", "{{ s | replace('o', '0') }} {{ 'aaa' | replace('a', 'b', 2) }} {{ s | reverse }} {{ lst | reverse | list }}"),
    ("filter_map", "{{ people | map(attribute='name') | list }} {{ lst | map('string') | join('+') }} {{ people | map(attribute='nick', default='?') | list }}"),
    ("filter_select_reject", "{{ messages | selectattr('role', 'equalto', 'user') | map(attribute='content') | list }} {{ messages | rejectattr('role', 'eq', 'user') | list | length }} {{ people | selectattr('age', 'gt', 20) | map(attribute='name') | join(',') }} {{ [0, 1, '', 'a', none] | select | list }} {{ range(10) | select('odd') | list }} {{ range(10) | reject('divisibleby', 3) | list }} {{ people | selectattr('role') | list | length }}"),
    # select/reject/selectattr/rejectattr/map give nothing for a false value without looking at their arguments
    # (functionary-v3.1: tools | selectattr("type", "equalto", "code_interpreter") with tools = none)
    ("filter_select_map_false_value", "{{ none_v | selectattr('type', 'equalto', 'x') | list }} {{ none_v | rejectattr('type') | list | length }} {{ none_v | map(attribute='name') | list }} {{ e | select | list }} {{ undefined_v | reject('odd') | list }} {{ none_v | map('no_such_filter') | list }} {{ [] | selectattr('a', 'no_such_test') | list }} {{ 0 | select('odd') | list }}"),
    ("filter_unique_sort", "{{ words | unique | list }} {{ words | unique(case_sensitive=true) | list }} {{ words | sort }} {{ words | sort(case_sensitive=true) }} {{ people | sort(attribute='age', reverse=true) | map(attribute='name') | list }}"),
    ("filter_safe_escape", "{{ '<a href=\"x\">&\\'</a>' | safe }} {{ '<a href=\"x\">&\\'</a>' | e }} {{ '<b>' | escape }}"),
    ("filter_indent", "[{{ 'a\\nb\\n\\nc' | indent }}][{{ 'a\\nb' | indent(2, true) }}][{{ 'a\\n\\nb\\n' | indent(2, blank=true) }}][{{ 'x\\ny' | indent('> ') }}]"),
    ("filter_abs_round", "{{ -3 | abs }} {{ -2.5 | abs }} {{ 2.5 | round }} {{ 3.5 | round }} {{ 2.567 | round(2) }} {{ 7 | round }} {{ 2.5 | round(0, 'floor') }} {{ 2.1 | round(0, 'ceil') }} {{ -0.5 | round }}"),
    ("filter_misc", "{{ lst | sum }} {{ people | sum(attribute='age') }} {{ lst | min }} {{ lst | max }} {{ range(5) | batch(2) | list }} {{ 'a b  c' | wordcount }}"),
    ("filter_block", "{% filter upper %}shout {{ s }}{% endfilter %}|{% set x | trim %}   padded   {% endset %}[{{ x }}]"),
    # tests
    ("tests_defined_none", "{{ n is defined }} {{ undefined_v is defined }} {{ undefined_v is undefined }} {{ none_v is none }} {{ n is not none }} {{ undefined_v is none }} {{ none_v is defined }}"),
    ("tests_types", "{{ s is string }} {{ n is string }} {{ n is number }} {{ f is number }} {{ t is number }} {{ n is integer }} {{ f is integer }} {{ f is float }} {{ d is mapping }} {{ lst is mapping }} {{ lst is iterable }} {{ s is iterable }} {{ n is iterable }} {{ lst is sequence }} {{ d is sequence }} {{ n is sequence }} {{ t is boolean }} {{ n is boolean }} {{ range is callable }}"),
    ("tests_values", "{{ t is true }} {{ 1 is true }} {{ false is false }} {{ 0 is false }} {{ 4 is even }} {{ 4 is odd }} {{ 7 is odd }} {{ 9 is divisibleby(3) }} {{ 9 is divisibleby 4 }} {{ s is equalto('Hello World') }} {{ n is eq 7 }} {{ n is ne 7 }} {{ 3 is lt 4 }} {{ 3 is ge 4 }} {{ 'a' is in 'cat' }} {{ 'abc' is lower }} {{ 'ABC' is upper }} {{ 'trim' is filter }} {{ 'nope' is test }}"),
    # operators
    ("op_logic", "{{ true and 'x' }} {{ 0 and 'x' }} {{ '' or 'y' }} {{ 'a' or 'b' }} {{ not e }} {{ not lst }} {{ none_v or undefined_v or 'z' }} {{ not n is defined }}"),
    ("op_compare", "{{ 1 == 1.0 }} {{ 'a' != 'b' }} {{ 2 < 3 }} {{ 3 > 3 }} {{ 3 <= 3 }} {{ 'b' >= 'a' }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ [1, 2] == [1, 2] }} {{ d == {'b': 'two', 'a': 1} }} {{ true == 1 }} {{ none_v == none }} {{ undefined_v == undefined_w }} {{ [1, 2] < [1, 3] }} {{ [1] == (1,) }} {{ (1, 2) == (1, 2) }}"),
    ("op_in", "{{ 'World' in s }} {{ 'x' not in s }} {{ 2 in lst }} {{ 5 in lst }} {{ 'a' in d }} {{ 'z' not in d }} {{ 'role' in messages[0] }} {{ 'a' in undefined_v }}"),
    ("op_arith", "{{ 1 + 2 }} {{ 'a' + 'b' }} {{ [1] + [2, 3] }} {{ 7 - 10 }} {{ 3 * 4 }} {{ 'ab' * 3 }} {{ '-' * 5 }} {{ 7 / 2 }} {{ 4 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ -n }} {{ - -n }} {{ 1 + 2 * 3 - 4 / 2 }} {{ (1 + 2) * 3 }} {{ 2 ** 3 ** 2 }} {{ 10 // 3.0 }} {{ 0.1 + 0.2 }} {{ f * 2 }} {{ true + 1 }} {{ +n }}"),
    ("op_concat", "{{ 'n=' ~ n ~ ' f=' ~ f ~ ' none=' ~ none_v ~ ' undef=' ~ undefined_v ~ ' list=' ~ lst ~ ' t=' ~ t }}"),
    ("op_precedence", "{{ 'a' + 'b' ~ 'c' * 2 }} {{ 1 + 2 ~ 3 if false else 'no-error' }} {{ -2 ** 2 }} {{ not 1 == 2 }} {{ 'a' ~ 'b' in 'xaby' }} {{ -3 | abs }} {{ 1 if false }} {{ 'y' if n > 5 else 'n' }} {{ 'a' if false else 'b' if true else 'c' }} {{ (lst | length) + 1 }} {{ lst | length + 1 }}"),
    ("literals", "{{ 'single' }} {{ \"double\" }} {{ 'it\\'s' }} {{ \"say \\\"hi\\\"\" }} {{ 'tab\\tend' }} {{ 'back\\\\slash' }} {{ 'multi' 'part' }} {{ 42 }} {{ 1.5 }} {{ 1e3 }} {{ 2.5e-7 }} {{ 1e16 }} {{ 1e15 }} {{ 123456789.125 }} {{ [1, 'a', none, True, False, 2.0] }} {{ (1,) }} {{ (1, 'b') }} {{ () }} {{ {'k': 'v', 'n': [1]} }} {{ {} }} {{ [] }} {{ none }} {{ None }} {{ true }} {{ False }} {{ \"it's\" }} {{ ['it\\'s', 'a\\nb'] }} {{ 'x\\u00e9\\x41' }}"),
    # subscripts, slices, attributes
    ("subscript_slice", "{{ lst[0] }} {{ lst[-1] }} {{ lst[1:] }} {{ lst[:-1] }} {{ lst[::-1] }} {{ lst[::2] }} {{ lst[5:] }} {{ s[0] }} {{ s[-5:] }} {{ s[::-1] }} {{ s[2:8:2] }} {{ messages[0]['role'] }} {{ messages[0].role }} {{ messages[-1].content }} {{ d['a'] }} {{ d.b }} [{{ lst[10] }}] [{{ d.missing }}] {{ d.missing is defined }} {{ 'héllo'[1] }} {{ 'héllo'[1:3] }} {{ lst.1 }}"),
    # methods
    ("str_methods", "[{{ '  x  '.strip() }}][{{ 'xxaxx'.strip('x') }}][{{ '  x  '.lstrip() }}][{{ '  x  '.rstrip() }}][{{ '--x'.lstrip('-') }}] {{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ 'a b c'.split(' ', 1) }} {{ 'a b c'.split(maxsplit=1) }} {{ '  a b  c '.split(none, 1) }} {{ s.startswith('Hell') }} {{ s.endswith('x') }} {{ s.startswith(('x', 'H')) }} {{ s.upper() }} {{ s.lower() }} {{ 'hello2world foo'.title() }} {{ 'hELLO'.capitalize() }} {{ s.replace('l', 'L') }} {{ s.replace('l', 'L', 1) }} {{ s.find('o') }} {{ s.find('z') }} {{ s.count('l') }} {{ '-'.join(['a', 'b']) }} {{ '{} is {}'.format('x', 1) }} {{ '{0}{0}{name}'.format('a', name='b') }} {{ 'a\\nb\\n'.splitlines() }} {{ '42'.isdigit() }}"),
    ("dict_methods", "{% for k, v in d.items() %}{{ k }}:{{ v }} {% endfor %}{{ d.keys() | list }} {{ d.values() | list }} {{ d.get('a') }} {{ d.get('z') }} {{ d.get('z', 'dflt') }} {{ d['get'] is defined }}"),
    ("list_methods", "{{ lst.index(2) }} {{ [1, 2, 1].count(1) }}"),
    # globals
    ("globals_range_dict_namespace", "{{ range(3) | list }} {{ range(1, 4) | list }} {{ range(10, 0, -3) | list }} {{ dict(a=1, b='x') }} {% set ns = namespace(count=0, items=[]) %}{% for i in range(4) %}{% set ns.count = ns.count + i %}{% set ns.items = ns.items + [i] %}{% endfor %}{{ ns.count }} {{ ns.items }} {{ namespace(a=1).a }}"),
    ("strftime_now_year", "{{ strftime_now('%Y') | length }} {{ strftime_now('%Y-%m-%d') | length }}"),
    # statements and scoping
    ("if_elif_else", "{% for x in [1, 2, 3, 4] %}{% if x == 1 %}one{% elif x == 2 %}two{% elif x == 3 %}three{% else %}other{% endif %} {% endfor %}"),
    ("for_loop_vars", "{% for m in messages %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.revindex0 }}/{{ loop.first }}/{{ loop.last }}/{{ loop.length }}/{{ loop.previtem.role if loop.previtem is defined else '-' }}/{{ loop.nextitem.role if not loop.last else '-' }} {% endfor %}"),
    ("for_tuple_unpack", "{% for a, b in [[1, 2], (3, 4)] %}{{ a }}+{{ b }}={{ a + b }} {% endfor %}{% for k, v in {'x': 1, 'y': 2}.items() %}{{ k }}{{ v }}{% endfor %}{% for (a, b) in [('p', 'q')] %}{{ b }}{{ a }}{% endfor %}"),
    ("for_filter_else", "{% for m in messages if m.role == 'user' %}{{ loop.index }}:{{ m.content }}({{ loop.length }}) {% endfor %}|{% for x in [] %}x{% else %}empty{% endfor %}|{% for x in undefined_v %}x{% else %}undef-empty{% endfor %}|{% for c in 'ab' %}{{ c }}{% endfor %}|{% for k in d %}{{ k }}{% endfor %}"),
    ("for_break_continue", "{% for i in range(10) %}{% if i % 2 == 0 %}{% continue %}{% endif %}{% if i > 7 %}{% break %}{% endif %}{{ i }}{% endfor %}"),
    ("nested_loops_outer", "{% for row in [[1, 2], [3]] %}{% set outer = loop %}{% for x in row %}{{ outer.index }}.{{ loop.index }}={{ x }}{{ ',' if not loop.last }}{% endfor %}{{ ';' if not outer.last }}{% endfor %} {{ loop is defined }}"),
    ("set_scoping", "{% set x = 1 %}{% for i in range(3) %}{{ x }}{% set x = x + 10 %}{{ x }},{% endfor %}{{ x }}|{% if true %}{% set y = 5 %}{% endif %}{{ y }}|{% for i in [1] %}{% set z = 2 %}{% endfor %}[{{ z }}]|{% set a, b = 1, 2 %}{{ a }}{{ b }}|{% set block %}B{{ x }}{% endset %}{{ block }}"),
    ("macro_defaults", "{% macro greet(name, greeting='Hello', punct='!') %}{{ greeting }}, {{ name }}{{ punct }}{% endmacro %}{{ greet('Ann') }} {{ greet('Bob', 'Hi') }} {{ greet('Cy', punct='?') }} {{ greet(name='Di', greeting='Yo') }} [{{ greet() }}]"),
    ("macro_scope", "{% set x = 5 %}{% macro m() %}{{ x }}{% set x = 7 %}{{ x }}{% endmacro %}{{ m() }}{{ x }}{% macro uses_later() %}{{ later }}{% endmacro %}{% set later = 'L' %}{{ uses_later() }}"),
    ("generation_blocks", "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% set inner = 1 %}{% endgeneration %}{% else %}[{{ m.content }}]{% endif %}{% endfor %}{{ inner is defined }}{% generation %}{% endgeneration %}"),
    ("generation_in_macro", "AB{% macro m(t) %}<{% generation %}{{ t }}{% endgeneration %}>{% endmacro %}{{ m('xyz') }}{{ m('q') }}"),
    ("raw_block", "{% raw %}{{ not rendered }} {% if %}{% endraw %}|{%- raw -%}  \n {{ x }}  {%- endraw %}|"),
    ("undefined_behaviour", "[{{ undefined_v }}][{{ undefined_v | length }}][{{ undefined_v is defined }}][{% if undefined_v %}t{% else %}f{% endif %}][{% for x in undefined_v %}{{ x }}{% endfor %}][{{ none_v }}][{{ none_v.attr }}][{{ d.missing | default('m') }}][{{ undefined_v | string }}]"),
    # whitespace control
    ("ws_trim_lstrip", "a\n  {% if true %}\n    b\n  {% endif %}\nc\n{% for i in [1, 2] %}\n  {{ i }}\n{% endfor %}\nd"),
    ("ws_dash", "a  \n  {%- if true -%}  \n  b  \n  {%- endif -%}\n\n c {{- ' d ' -}} e\n{{ 'f' }}  \n  {{- 'g' }}"),
    ("ws_plus", "a\n    {%+ if true %}b{% endif %}\n    {% if true +%}\nc{% endif %}\n  x{% if true %} y {% endif %}"),
    ("ws_comments", "a {# note #} b\n  {# own line #}\nc\n{#- strip left #}  d  {#- both -#}  e\n{# multi\nline #}\nf"),
    ("ws_var_no_lstrip", "x\n    {{ 'v' }}\n  {% if true %}t{% endif %}  \n  {% set q = 1 %}\n  end"),
    ("ws_indent_mixed", "{% for m in messages %}\n\t{% if m.role == 'user' %}\n\t\tU:{{ m.content }}\n\t{% else %}\n\t\tO:{{ m.content }}\n\t{% endif %}\n{% endfor %}"),
    ("ws_crlf_trailing_newline", "line1\r\n{% if true %}\r\nline2\r\n{% endif %}\r\nend\r\n"),
    ("ws_trailing_newline_kept_once", "x\n\n"),
    ("strip_corners", "[{{ '   ' | trim }}][{{ '' | trim }}][{{ 'a]b-]' | trim(']-') }}][{{ '^a^' | trim('^') }}][{{ 'éaé'.strip('é') }}][{{ 'abc'.strip('') }}][{{ '\t\n x \r\n' | trim }}]"),
    ("macro_recursion_nesting", "{% macro rec(n) %}{% if n > 0 %}{{ n }}{{ rec(n - 1) }}{% endif %}{% endmacro %}{{ rec(4) }} {% macro outer(x) %}{% macro inner(y) %}<{{ y }}>{% endmacro %}{{ inner(x) }}{{ inner(x * 2) }}{% endmacro %}{{ outer(3) }} {% set ns = namespace(a=1) %}{% macro m() %}{% set ns.a = 9 %}{% endmacro %}{{ m() }}{{ ns.a }}"),
    ("generation_nested", "{% generation %}a{% generation %}b{% endgeneration %}c{% endgeneration %}|{% for m in [1, 2] %}{% generation %}{{ m }}{% endgeneration %}{{ '-' }}{% endfor %}"),
    ("ws_inline_tags", "{% if true %}A{% endif %}{% if false %}B{% else %}C{% endif %} {% for i in range(2) %}{{ i }} {% endfor %}."),
]

ERRORS = [
    ("error_raise_exception", "{% if messages | length > 2 %}{{ raise_exception('Too many messages: ' ~ (messages | length)) }}{% endif %}ok", None),
    ("error_raise_in_macro", "{% macro check(m) %}{% if m.role not in ['user', 'assistant', 'system'] %}{{ raise_exception('bad role ' + m.role) }}{% endif %}{% endmacro %}{% for m in messages + [{'role': 'robot', 'content': ''}] %}{{ check(m) }}{% endfor %}", None),
    ("error_undefined_attribute", "{{ undefined_v.attr }}", "'undefined_v' is undefined"),
    ("error_missing_key_attribute", "{{ d.missing.attr }}", "has no attribute 'missing'"),
    ("error_not_callable", "{{ s() }}", "'str' object is not callable"),
    ("error_undefined_call", "{{ undefined_fn('x') }}", "'undefined_fn' is undefined"),
    ("error_str_plus_int", "{{ 'a' + n }}", 'can only concatenate str (not "int") to str'),
    ("error_int_plus_str", "{{ n + 'a' }}", "unsupported operand type(s) for +: 'int' and 'str'"),
    ("error_unpack", "{% for a, b in [[1, 2, 3]] %}{% endfor %}", "unpack"),
    ("error_none_not_iterable", "{% for x in none_v %}{% endfor %}", "'NoneType' object is not iterable"),
    ("error_list_append", "{{ lst.append(4) }}", "unsafe"),
    ("error_assign_non_namespace", "{% set d.x = 1 %}", "non-namespace"),
    ("error_unknown_filter", "line1\n{{ s | foo }}", None),
    ("error_unknown_test", "{% if true %}\n{% endif %}{{ s is foo }}", None),
    ("error_syntax_unclosed_for", "a\n{% for x in lst %}\n{{ x }}\n", None),
    ("error_syntax_unknown_tag", "a\nb\n{% frobnicate %}", None),
    ("error_syntax_bad_expression", "{{ 1 + }}", None),
    ("error_syntax_unclosed_string", "x\n{{ 'abc }}", None),
    ("error_syntax_unexpected_endif", "{% for x in lst %}{% endif %}", None),
    ("error_syntax_break_outside_loop", "\n{% break %}", None),
]


def whitespace_fuzz(count=80, seed=1234):
    """Templates made of random pieces: text with spaces, tabs and newlines around block tags, comments and
    print tags with and without -/+ markers (what trim_blocks/lstrip_blocks and whitespace control act on)."""
    import random
    rng = random.Random(seed)
    texts = ["", " ", "  ", "\t", "\n", "\n  ", "  \n", "\n\n", "x", " x ", "x\n", "\n\tx", " \n \n "]

    def sign(allow_plus=True):
        return rng.choice(["", "", "-", "+"] if allow_plus else ["", "", "-"])

    def tag(kind):
        if kind == "if":
            return [("{%" + sign() + " if true " + sign() + "%}"), ("{%" + sign() + " endif " + sign() + "%}")]
        if kind == "for":
            return [("{%" + sign() + " for i in [1, 2] " + sign() + "%}"), ("{%" + sign() + " endfor " + sign() + "%}")]
        if kind == "comment":
            return ["{#" + sign() + " c " + sign() + "#}"]
        if kind == "set":
            return ["{%" + sign() + " set v = 1 " + sign() + "%}"]
        return ["{{" + sign(False) + " 'p' " + sign(False) + "}}"]

    out = []
    for k in range(count):
        parts = [rng.choice(texts)]
        for _ in range(rng.randint(2, 5)):
            kind = rng.choice(["if", "for", "comment", "set", "print"])
            pieces = tag(kind)
            parts.append(pieces[0])
            parts.append(rng.choice(texts))
            if len(pieces) > 1:
                parts.append(rng.choice(texts))
                parts.append(pieces[1])
            parts.append(rng.choice(texts))
        out.append((f"ws_fuzz_{k + 1:02d}", "".join(parts)))
    return out


def case_entry(name, template, context, lua_error=None, date_format=None):
    entry = {"name": name, "template": template, "context": context}
    try:
        text, spans = render(template, context)
    except jinja2.exceptions.TemplateSyntaxError as e:  # a subclass of TemplateError: test it first
        entry.update(error=e.message, error_kind="syntax", error_line=e.lineno)
        return entry
    except jinja2.exceptions.TemplateError as e:
        if type(e) is jinja2.exceptions.TemplateError:  # raise_exception's
            entry.update(error=e.message, error_kind="raise")
        else:
            entry.update(error=str(e), error_kind="runtime", lua_error=lua_error)
        return entry
    except SyntaxError as e:  # jinja2 compiles to Python: `break` outside a loop fails there, no template line
        entry.update(error=str(e), error_kind="syntax", error_line=None)
        return entry
    except (TypeError, ValueError) as e:
        entry.update(error=str(e), error_kind="runtime", lua_error=lua_error)
        return entry
    assert lua_error is None, f"{name}: expected an error"
    if date_format:
        text = text.replace(datetime.now().strftime(date_format), "<DATE>")
        entry["date_format"] = date_format
    entry.update(text=text, spans=[[byte_offset(text, s), byte_offset(text, e)] for s, e in spans],
                 char_spans=[list(s) for s in spans])
    return entry


def conversation_cases():
    gp = {"add_generation_prompt": True}
    tok = {"bos_token": "<s>", "eos_token": "</s>"}
    out = []
    for name, template, contexts in [
        ("chatml_tools", CHATML_TOOLS, [
            {"messages": SYS_CHAT, "tools": None, "add_generation_prompt": False},
            {"messages": CHAT, "tools": None, **gp},
            {"messages": TOOL_CHAT, "tools": [WEATHER_TOOL], **gp},
            {"messages": TOOL_CHAT[1:], "tools": [WEATHER_TOOL], "add_generation_prompt": False},
            {"messages": SYS_CHAT, "tools": None, "stop_after_last_user": True, **gp},
        ]),
        ("llama3_style", LLAMA3_STYLE, [
            {"messages": SYS_CHAT, "date_string": "26 Jul 2024", **tok, **gp},
            {"messages": CHAT, "tools": None, "date_string": "01 Jan 2025", **tok, "add_generation_prompt": False},
            {"messages": TOOL_CHAT, "tools": [WEATHER_TOOL], "date_string": "26 Jul 2024", **tok, **gp},
            {"messages": TOOL_CHAT[:3] + [{"content": {"temp": "18C"}, "role": "tool"}], "tools": None,
             "date_string": "26 Jul 2024", **tok, **gp},
        ]),
        ("mistral_style", MISTRAL_STYLE, [
            {"messages": SYS_CHAT, **tok},
            {"messages": CHAT, **tok},
            {"messages": [msg("user", "a"), msg("user", "b")], **tok},
            {"messages": [msg("user", "a"), msg("tool", "b")], **tok},
        ]),
        ("gemma_style", GEMMA_STYLE, [
            {"messages": SYS_CHAT, "bos_token": "<bos>", **gp},
            {"messages": CHAT, "bos_token": "<bos>", "add_generation_prompt": False, "continue_final": True},
        ]),
        ("phi3_style", PHI3_STYLE, [{"messages": SYS_CHAT, **tok}, {"messages": CHAT, **tok, **gp}]),
        ("deepseek_style", DEEPSEEK_STYLE, [{"messages": SYS_CHAT, **tok, **gp}, {"messages": CHAT, **tok}]),
        ("zephyr_style", ZEPHYR_STYLE, [{"messages": SYS_CHAT, **tok, **gp}, {"messages": CHAT, **tok}]),
        ("thinking_style", THINKING_STYLE, [
            {"messages": [msg("system", "S"), msg("user", "q1"), msg("assistant", "<think>\nhmm\n</think>\n\nA1"),
                          msg("user", "q2"), {"content": "A2", "reasoning_content": "r2", "role": "assistant"}]},
            {"messages": [msg("user", "q"), msg("assistant", "<think>x</think>done"),
                          msg("user", "<tool_response>t</tool_response>"), msg("assistant", "end")], **gp,
             "enable_thinking": False},
            {"messages": [msg("user", "q")], **gp},
        ]),
        ("schema_macro_style", SCHEMA_MACRO_STYLE, [{"tools": SCHEMA_TOOLS}]),
        ("multimodal_style", MULTIMODAL_STYLE, [{"messages": [
            {"content": [{"type": "image"}, {"text": " What is this? ", "type": "text"}], "role": "user"},
            msg("assistant", "A cat.")]}]),
        ("non_ascii_generation", NON_ASCII, [{"messages": [msg("user", "Café? ☕"), msg("assistant", "Oui, déjà vu — 你好 🙂"),
                                                          msg("user", "ñ"), msg("assistant", "ü\n")]}]),
    ]:
        for i, ctx in enumerate(contexts):
            out.append(case_entry(f"{name}_{i + 1}", template, ctx))
    # the date comes from strftime_now when the caller gives none: compared with the date masked
    out.append(case_entry("llama3_style_strftime_now", LLAMA3_STYLE, {"messages": CHAT, **tok, **gp},
                          date_format="%d %b %Y"))
    return out


def tinyllama(data_dir):
    path = os.path.join(data_dir, "tokenizers", "tinyllama-1.1b-chat-v1.0", "tokenizer_config.json")
    if not os.path.exists(path):
        print(f"note: {path} not found: the TinyLlama golden is left as it was")
        return None
    with open(path, encoding="utf-8") as fh:
        template = json.load(fh)["chat_template"]
    convs = [{"messages": SYS_CHAT, "eos_token": "</s>", "add_generation_prompt": True},
             {"messages": CHAT, "eos_token": "</s>", "add_generation_prompt": False},
             {"messages": [msg("user", "Déjà vu?")], "eos_token": "</s>", "add_generation_prompt": True}]
    return {"path": "tokenizers/tinyllama-1.1b-chat-v1.0/tokenizer_config.json",
            "sha256": hashlib.sha256(template.encode("utf-8")).hexdigest(),
            "renders": [{"context": c, "text": render(template, c)[0]} for c in convs]}


def main():
    data_dir = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("ZRUN_TEST_DATA", os.path.join(HERE, "..", "..", "..", "shared", "data"))
    cases = [case_entry(name, template, BASE) for name, template in SMALL]
    cases += [case_entry(name, template, {}) for name, template in whitespace_fuzz()]
    cases += [case_entry(name, template, BASE, lua_error) for name, template, lua_error in ERRORS]
    cases += conversation_cases()
    names = [c["name"] for c in cases]
    assert len(names) == len(set(names)), "case names must be unique"
    out_path = os.path.join(HERE, "jinja", "cases.json")
    old = {}
    if os.path.exists(out_path):
        with open(out_path, encoding="utf-8") as fh:
            old = json.load(fh)
    golden = {"jinja2_version": jinja2.__version__, "cases": cases,
              "tinyllama": tinyllama(data_dir) or old.get("tinyllama")}
    os.makedirs(os.path.dirname(out_path), exist_ok=True)
    with open(out_path, "w", encoding="utf-8") as fh:
        json.dump(golden, fh, ensure_ascii=False, indent=1)
        fh.write("\n")
    print(f"wrote {out_path}: {len(cases)} cases" + (", TinyLlama renders" if golden["tinyllama"] else ""))


if __name__ == "__main__":
    main()
