-- Training copies of known chat templates, for SFT's assistant_only_loss. Loss on the assistant's tokens alone
-- needs a template that marks them with {% generation %} ... {% endgeneration %}; TRL 1.10 takes a template
-- without such blocks only when it is, to the byte, one it knows, and then renders every row with a training copy
-- of it; any other template is an error. zrun does the same for the Qwen ones: Qwen2.5's, Qwen3's (Qwen3-0.6B's as
-- shipped now) and Qwen3-Instruct-2507's; and for Meta-Llama-3-Instruct's, Phi-3-mini's, Phi-3.5-mini's and Gemma 3's. No
-- template text is held here: a template is recognised by its length and its FNV-1a 64-bit digest (M.digest),
-- and its copy is made by a few edits at short snippets of it (anchors, each found exactly once), which render
-- what TRL's copies render: the same text, with the same generation blocks (tests/lua/test_sft_qwen3.lua and
-- test_sft_llama3_phi3.lua, test_sft_gemma3.lua compare both over every conversation of their golden data). TRL
-- patches no Llama 3.1 / 3.2 template (it raises for them, and so does zrun); the other families it patches (Gemma 1
-- and 2, GLM, DeepSeek-V3, GPT-OSS, Cohere, ...) are models zrun does not load: refused too.
local bit = require "bit"
local M = {}

local TWO32 = 4294967296

-- FNV-1a 64-bit of s (Fowler, Noll, Vo: offset basis 0xcbf29ce484222325, prime 0x100000001b3) as 16 hex digits.
-- A small non-cryptographic hash, chosen to tell the few templates here from others, not to resist forgery.
-- Each step (xor a byte, multiply by an odd prime mod 2^64) is a bijection of the state, so two strings of the
-- same length that differ in one byte never collide: with the length compared too, a template one byte off is
-- never taken for a known one. The 64-bit state is two 32-bit halves held as non-negative doubles:
-- h * prime = h * 0x1b3 + (h << 40) mod 2^64, each partial product under 2^42, exact in a double.
function M.digest(s)
  local hi, lo = 0xcbf29ce4, 0x84222325
  for i = 1, #s do
    lo = bit.bxor(lo, s:byte(i)) % TWO32
    local l = lo * 0x1b3
    hi = (hi * 0x1b3 + math.floor(l / TWO32) + (lo % 0x1000000) * 256) % TWO32
    lo = l % TWO32
  end
  return bit.tohex(hi, 8) .. bit.tohex(lo, 8)
end

-- Each known template: its length and digest, and the edits that make its training copy, in order:
-- { at = anchor, before = text | after = text | with = text } puts text before or after the anchor, or in its
-- place; { at =, to = anchor2, with = text } replaces from the anchor up to the next anchor2 (kept).
local GEN, END = "{%- generation %}", "{%- endgeneration %}"
local KNOWN = {
  -- Qwen2.5-Instruct's: one block per assistant turn, from after "<|im_start|>assistant" to its "<|im_end|>\n"
  -- included. A turn without tool calls goes to the tool-call branch too, which renders it as before.
  { name = "qwen2_5", length = 2507, digest = "c2b27ee60f1b8775", edits = {
    { at = [==[ or (message.role == "assistant" and not message.tool_calls)]==], with = "" },
    { at = [==[+ message.role }}]==],
      after = GEN .. [==[{%- if not message.tool_calls %}{{- '\n' + message.content }}{%- else %}]==] },
    { at = [==[{%- endfor %}
        {{- '<|im_end|>\n' }}]==], with = [==[{%- endfor %}{%- endif %}{{- '<|im_end|>\n' }}]==] .. END },
  } },
  -- Qwen3's: every assistant turn gets its <think> block (the original keeps them only after the last user
  -- query, so a conversation's render would not start with the render of its first turns), and one block from
  -- after "<|im_start|>assistant\n" to its "<|im_end|>\n" included.
  { name = "qwen3", length = 4168, digest = "959a4551391a6549", edits = {
    { at = [==[{%- if loop.index0 > ns.last_query_index %}]==], to = [==[{%- if message.tool_calls %}]==],
      with = [==[{{- '<|im_start|>' + message.role + '\n' }}]==] .. GEN ..
        [==[{{- '<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}]==] },
    { at = [==[{%- elif message.role == "tool" %}]==], before = END },
  } },
  -- Qwen3-Instruct-2507's: one block per assistant turn, from after "<|im_start|>assistant\n" to its
  -- "<|im_end|>\n" included.
  { name = "qwen3_instruct_2507", length = 2630, digest = "3751fe8ea48448ab", edits = {
    { at = [==[+ '\n' + content }}]==], with = [==[+ '\n' }}]==] .. GEN .. [==[{{- content }}]==] },
    { at = [==[{%- elif message.role == "tool" %}]==], before = END },
  } },
  -- Meta-Llama-3-Instruct's (Llama 3.0): a message's text, set once for every role, is cut in two, the header (with
  -- the bos before the first message) and the body (its content trimmed, then "<|eot_id|>"); an assistant's body is
  -- printed in a block.
  { name = "llama3", length = 389, digest = "0e60067a5537498e", edits = {
    { at = [==['+ message['content'] | trim + '<|eot_id|>' %}]==],
      with = [==[' %}{% set body = message['content'] | trim + '<|eot_id|>' %}]==] },
    { at = [==[{{ content }}]==], after = [==[{% if message['role'] == 'assistant' %}{% generation %}{{ body }}]==] ..
      [==[{% endgeneration %}{% else %}{{ body }}{% endif %}]==] },
  } },
}
-- Phi-3-mini's and Phi-3.5-mini's (they differ in the system branch only): an assistant turn's block from after its
-- "<|assistant|>\n" to its "<|end|>\n" included, and the eos that ends a conversation whose last message is the
-- assistant's in a block of its own (the model learns to stop).
local PHI3 = {
  { at = "'<|assistant|>\n' + message['content'] + '<|end|>\n'}}",
    with = "'<|assistant|>\n'}}{% generation %}{{message['content'] + '<|end|>\n'}}{% endgeneration %}" },
  { at = [==[{% else %}{{ eos_token }}]==], before = [==[{% elif messages[-1]['role'] == 'assistant' %}]==] ..
    [==[{% generation %}{{ eos_token }}{% endgeneration %}]==] },
}
KNOWN[#KNOWN + 1] = { name = "phi3", length = 407, digest = "ecebdb26677c663d", edits = PHI3 }
KNOWN[#KNOWN + 1] = { name = "phi3_5", length = 430, digest = "cf278cde387a54c8", edits = PHI3 }
-- Gemma 3's (google/gemma-3-*-it): a turn's body (its content trimmed, then "<end_of_turn>\n") is captured after
-- its "<start_of_turn>ROLE\n" header, and a model turn's body printed in a block.
KNOWN[#KNOWN + 1] = { name = "gemma3", length = 1532, digest = "c90dea00b85c935d", edits = {
  { at = [==[    {%- if message['content'] is string -%}]==], before = "{%- set body -%}" },
  { at = [==[{{ '<end_of_turn>
' }}]==], after = [==[{%- endset -%}{%- if role == "model" -%}{% generation %}{{ body }}{% endgeneration %}]==] ..
    [==[{%- else -%}{{ body }}{%- endif -%}]==] },
} }
M.NAMES = {}
for i, k in ipairs(KNOWN) do M.NAMES[i] = k.name end

local function once(s, anchor, name, from)
  local a, b = s:find(anchor, from or 1, true)
  if not a or (not from and s:find(anchor, b + 1, true)) then -- (cannot happen for a template whose digest matched)
    error(("sft_templates: %s: the anchor %q is not found once"):format(name, anchor), 0)
  end
  return a, b
end

local function edit(s, e, name)
  local a, b = once(s, e.at, name)
  if e.to then b = once(s, e.to, name, b + 1) - 1 end
  if e.before then return s:sub(1, a - 1) .. e.before .. s:sub(a) end
  if e.after then return s:sub(1, b) .. e.after .. s:sub(b + 1) end
  return s:sub(1, a - 1) .. e.with .. s:sub(b + 1)
end

-- TRL's has_generation_markers: {% generation %}, also with "-" trims.
function M.has_generation_markers(source)
  return type(source) == "string" and source:find("{%%%-?%s*generation%s*%-?%%}") ~= nil
end

-- The training copy of source (and the name of the template it is), or nil when source is not, byte for byte,
-- one of the templates here.
function M.training(source)
  if type(source) ~= "string" then return nil end
  local digest
  for _, k in ipairs(KNOWN) do
    if #source == k.length then
      digest = digest or M.digest(source)
      if digest == k.digest then
        local s = source
        for _, e in ipairs(k.edits) do s = edit(s, e, k.name) end
        return s, k.name
      end
    end
  end
  return nil
end

return M
