-- DeepSpeed-compatible model-state memory estimators: zr.memory.estimate_zero2 / estimate_zero3
-- give the numbers and the table of DeepSpeed's estimate_zero{2,3}_model_states_mem_needs_all_live
-- for a model, a config.json, a cached hub id or a built-in config, without allocating anything.
-- Parameter counting from a config (llama family, gpt2) lives here too; plans are memory_plan.lua.
local M = {}

local floor, max, fmt = math.floor, math.max, string.format

-- ---------- parameter lists from configs ----------

-- (Qwen3Config's head_dim is 128 where config.json has none)
local function head_dim(c)
  return c.head_dim or (c.model_type == "qwen3" and 128) or floor(c.hidden_size / c.num_attention_heads)
end
M.head_dim = head_dim
-- num_key_value_heads where config.json has none: MistralConfig's, Qwen2Config's and Qwen3Config's defaults
-- (Llama's: one per head)
local KV_DEFAULT = { mistral = 8, qwen2 = 32, qwen3 = 32 }

-- add(module, param_name, shape): appends one parameter entry to list
local function adder(list)
  return function(mod, pname, shape)
    local n = 1
    for _, d in ipairs(shape) do n = n * d end
    list[#list + 1] = { name = mod .. "." .. pname, module = mod, numel = n, shape = shape }
  end
end

-- Which projections carry a bias (q/k/v, o, MLP), as llama.lua builds them: qwen2 has biases on q, k, v (not o)
-- without saying so in its config; mistral none; llama its attention_bias and mlp_bias; qwen3 its
-- attention_bias (q/k/v/o), the MLP none.
function M.biases(c)
  if c.model_type == "qwen2" then return true, false, false end
  if c.model_type == "qwen3" then return c.attention_bias or false, c.attention_bias or false, false end
  if c.model_type == "mistral" then return false, false, false end
  return c.attention_bias or false, c.attention_bias or false, c.mlp_bias or false
end

local LLAMA_NORMS = { "input_layernorm", "post_attention_layernorm" }
local GEMMA3_NORMS = { "input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm" }

-- Ordered list of {name=, numel=, module=, shape=} in the order model:parameters() gives them.
local function llama_params(c)
  local H, I, L, V = c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.vocab_size
  local Hq, KV = c.num_attention_heads, c.num_key_value_heads
  if KV == nil then KV = KV_DEFAULT[c.model_type] end -- (false: JSON null, None, as none given)
  KV = KV or Hq
  local D = head_dim(c)
  local qkv_bias, o_bias, mlp_bias = M.biases(c)
  local out = {}
  local add = adder(out)
  local function linear(mod, i, o, bias)
    add(mod, "weight", { o, i })
    if bias then add(mod, "bias", { o }) end
  end
  add("model.embed_tokens", "weight", { V, H })
  for l = 0, L - 1 do
    local p = "model.layers." .. l
    linear(p .. ".self_attn.q_proj", H, Hq * D, qkv_bias)
    linear(p .. ".self_attn.k_proj", H, KV * D, qkv_bias)
    linear(p .. ".self_attn.v_proj", H, KV * D, qkv_bias)
    linear(p .. ".self_attn.o_proj", Hq * D, H, o_bias)
    if c.model_type == "qwen3" or c.model_type == "gemma3_text" then -- per-head RMSNorms of q and k
      add(p .. ".self_attn.q_norm", "weight", { D })
      add(p .. ".self_attn.k_norm", "weight", { D })
    end
    linear(p .. ".mlp.gate_proj", H, I, mlp_bias)
    linear(p .. ".mlp.up_proj", H, I, mlp_bias)
    linear(p .. ".mlp.down_proj", I, H, mlp_bias)
    for _, n in ipairs(c.model_type == "gemma3_text" and GEMMA3_NORMS or LLAMA_NORMS) do add(p .. "." .. n, "weight", { H }) end
  end
  add("model.norm", "weight", { H })
  if not c.tie_word_embeddings then linear("lm_head", H, V, false) end
  return out
end

-- Phi-3: Llama's layer with the fused checkpoint modules (qkv_proj: (Hq + 2 KV)·D rows; gate_up_proj: 2·I), no biases
local function phi3_params(c)
  local H, I, L, V = c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.vocab_size
  local Hq = c.num_attention_heads
  local KV = c.num_key_value_heads or Hq -- (Phi3Config: None is num_attention_heads)
  local D = head_dim(c)
  local out = {}
  local add = adder(out)
  add("model.embed_tokens", "weight", { V, H })
  for l = 0, L - 1 do
    local p = "model.layers." .. l
    add(p .. ".self_attn.qkv_proj", "weight", { (Hq + 2 * KV) * D, H })
    add(p .. ".self_attn.o_proj", "weight", { H, Hq * D })
    add(p .. ".mlp.gate_up_proj", "weight", { 2 * I, H })
    add(p .. ".mlp.down_proj", "weight", { H, I })
    add(p .. ".input_layernorm", "weight", { H })
    add(p .. ".post_attention_layernorm", "weight", { H })
  end
  add("model.norm", "weight", { H })
  if not c.tie_word_embeddings then add("lm_head", "weight", { V, H }) end
  return out
end

-- Gemma 3 (Gemma3ForCausalLM, zrun.models.gemma3): Llama's list with q_norm / k_norm and four norms a layer, the
-- config's defaults as transformers' Gemma3TextConfig fills them (head_dim 256, ...)
local function gemma3_params(c) return llama_params(require("zrun.models.hf_config").gemma3_text(c)) end

local function gpt2_params(c)
  local E, L, V, P = c.n_embd, c.n_layer, c.vocab_size, c.n_positions or 1024
  local inner = c.n_inner or 4 * E
  local out = {}
  local add = adder(out)
  local function wb(mod, wshape, bn)
    add(mod, "weight", wshape)
    add(mod, "bias", { bn })
  end
  add("transformer.wte", "weight", { V, E })
  add("transformer.wpe", "weight", { P, E })
  for l = 0, L - 1 do
    local p = "transformer.h." .. l
    wb(p .. ".ln_1", { E }, E)
    wb(p .. ".attn.c_attn", { E, 3 * E }, 3 * E)
    wb(p .. ".attn.c_proj", { E, E }, E)
    wb(p .. ".ln_2", { E }, E)
    wb(p .. ".mlp.c_fc", { E, inner }, inner)
    wb(p .. ".mlp.c_proj", { inner, E }, E)
  end
  wb("transformer.ln_f", { E }, E)
  if c.tie_word_embeddings == false then add("lm_head", "weight", { V, E }) end
  return out
end

local families = {
  llama = llama_params, mistral = llama_params, qwen2 = llama_params, qwen3 = llama_params, phi3 = phi3_params, gpt2 = gpt2_params,
  gemma3_text = gemma3_params,
}

-- Which family a config belongs to (llama when the fields say so and model_type is absent).
function M.family(c)
  local t = c.model_type
  if t == nil then
    if c.n_embd then t = "gpt2" elseif c.hidden_size and c.num_hidden_layers then t = "llama" end
  end
  if not families[t] then
    error(fmt("memory: model_type '%s' is not known (supported: llama, mistral, qwen2, qwen3, phi3, gemma3_text, gpt2)",
      tostring(t)), 0)
  end
  return t
end

-- Resolves a model, a config table, or a name/path (built-in config, HF model dir, config.json,
-- cached hub id) to {config=, module=, name=}. Nothing is allocated.
function M.resolve(x)
  local Module = require "zrun.nn.module"
  if type(x) == "table" and Module.is_module(x) then
    return { module = x, config = rawget(x, "config"), name = x.__name }
  end
  if type(x) == "string" and x:match("%.json$") then -- that file, not the config.json of its folder
    local f = io.open(x, "rb")
    if f then
      local text = f:read("*a")
      f:close()
      local ok, cfg = pcall(require("cjson").decode, text)
      if not ok or type(cfg) ~= "table" then error(fmt("memory: %s is not a JSON model config: %s", x, tostring(cfg)), 0) end
      -- JSON null -> nil ("n_inner": null, "head_dim": null, as save_pretrained writes them), as for a model folder
      return { config = require("zrun.hf").strip_nulls(cfg), name = x }
    end
  end
  if type(x) == "string" then
    local cfg = require("zrun.models.llama").config(x)
    return { config = cfg, name = x }
  end
  if type(x) == "table" then return { config = x, name = x._name_or_path or x.model_type or "config" } end
  error("memory: expected a model, a config table or a model name/path, got " .. type(x), 0)
end

-- List of parameters {name, numel, module, shape} from a config, or from a live module.
function M.param_list(x)
  local r = type(x) == "table" and x.config and (x.module or x.name) and x or M.resolve(x)
  if r.module then
    local out = {}
    for name, p in r.module:named_parameters() do
      local mod = name:match("^(.*)%.[^.]+$") or ""
      out[#out + 1] = { name = name, module = mod, numel = p:numel(), shape = p:shape(), tensor = p }
    end
    return out
  end
  return families[M.family(r.config)](r.config)
end

-- total parameters (shared ones once) and the largest module's direct parameters, as
-- DeepSpeed's model_to_params counts them. A tied head is a module of its own in HF
-- (lm_head holds the embedding matrix), which can only matter when it is the largest.
function M.count(x)
  local r = M.resolve(x)
  local list = M.param_list(r)
  local total, per_mod = 0, {}
  for _, p in ipairs(list) do
    total = total + p.numel
    per_mod[p.module] = (per_mod[p.module] or 0) + p.numel
  end
  local largest = 0
  for _, n in pairs(per_mod) do if n > largest then largest = n end end
  return total, largest, list, r
end

-- ---------- DeepSpeed's formulas ----------

-- estimate_zero2_model_states_mem_needs: returns cpu_mem, gpu_mem (bytes, truncated as int()).
function M.zero2_needs(total_params, gpus_per_node, num_nodes, cpu_offload, buffer_factor)
  gpus_per_node, num_nodes, buffer_factor = gpus_per_node or 1, num_nodes or 1, buffer_factor or 1.5
  local total_gpus = num_nodes * gpus_per_node
  local cpu_mem, gpu_mem
  if cpu_offload then
    gpu_mem = 2 * total_params
    cpu_mem = total_params * max(4 * total_gpus, 16) * buffer_factor
  else
    -- 2 bytes of 16-bit params, plus 18 bytes sharded: 16-bit and fp32 grads, fp32 master, Adam m and v
    gpu_mem = 2 * total_params + floor(18 * total_params / total_gpus)
    cpu_mem = total_params * 4 * gpus_per_node * buffer_factor
  end
  return floor(cpu_mem), floor(gpu_mem)
end

-- estimate_zero3_model_states_mem_needs: returns cpu_mem, gpu_mem, largest_layer_memory.
function M.zero3_needs(total_params, largest_layer_params, gpus_per_node, num_nodes, cpu_offload,
                       cpu_offload_params, zero_init, buffer_factor)
  gpus_per_node, num_nodes, buffer_factor = gpus_per_node or 1, num_nodes or 1, buffer_factor or 1.5
  local total_gpus = num_nodes * gpus_per_node
  local gpus_factor = 1 / num_nodes
  local largest_layer_memory = 4 * largest_layer_params
  local cpu_mem, gpu_mem
  if cpu_offload then
    if cpu_offload_params then
      gpu_mem = largest_layer_memory
      if zero_init then cpu_mem = total_params * 18 * gpus_factor * buffer_factor
      else cpu_mem = total_params * max(4 * gpus_per_node, 18 * gpus_factor) * buffer_factor end
    else
      gpu_mem = largest_layer_memory + floor(2 * total_params / total_gpus)
      if zero_init then cpu_mem = total_params * 16 * gpus_factor * buffer_factor
      else cpu_mem = total_params * max(4 * gpus_per_node, 16 * gpus_factor) * buffer_factor end
    end
  else
    gpu_mem = largest_layer_memory + floor(18 * total_params / total_gpus)
    if zero_init then cpu_mem = largest_layer_params * 4 * gpus_per_node * buffer_factor
    else cpu_mem = total_params * 4 * gpus_per_node * buffer_factor end
  end
  return floor(cpu_mem), floor(gpu_mem), largest_layer_memory
end

local function header(total, largest, gpn, nodes)
  local s = fmt("Estimated memory needed for params, optim states and gradients for a:\n" ..
    "HW: Setup with %d %s, %d %s per node.\nSW: Model with %dM total params", nodes,
    nodes > 1 and "nodes" or "node", gpn, gpn > 1 and "GPUs" or "GPU", floor(total / 1e6))
  if largest then s = s .. fmt(", %dM largest layer params", floor(largest / 1e6)) end
  return s .. ".\n  per CPU  |  per GPU |   Options"
end

-- Python's f"{cpu/2**30:7.2f}GB": rounded as Python rounds (ties to even on the exact value).
local function row(cpu, gpu, opts)
  local P = require "zrun.pyformat"
  return fmt(" %sGB | %sGB | %s", P.fixedw(cpu / 2 ^ 30, 7, 2), P.fixedw(gpu / 2 ^ 30, 6, 2), opts)
end

local function options(o)
  local gpn = o.gpus_per_node or o.num_gpus_per_node or 1
  local nodes = o.num_nodes or o.nodes or 1
  if gpn < 1 or nodes < 1 or gpn ~= floor(gpn) or nodes ~= floor(nodes) then
    error(fmt("memory estimate: gpus_per_node and num_nodes must be positive integers, got %s and %s",
      tostring(gpn), tostring(nodes)), 0)
  end
  return gpn, nodes, o.additional_buffer_factor or 1.5
end

-- zr.memory.estimate_zero2(model_or_config, {gpus_per_node=, num_nodes=, additional_buffer_factor=,
-- quiet=}) prints DeepSpeed's ZeRO-2 table and returns {total_params=, rows={{cpu=, gpu=,
-- offload_optimizer=}}, text=}.
function M.estimate_zero2(x, o)
  o = o or {}
  local gpn, nodes, abf = options(o)
  local total = o.total_params or (M.count(x))
  local res = { total_params = total, gpus_per_node = gpn, num_nodes = nodes, rows = {} }
  local lines = { header(total, nil, gpn, nodes) }
  for _, off in ipairs { true, false } do
    local cpu, gpu = M.zero2_needs(total, gpn, nodes, off, abf)
    local opt = "offload_optimizer=" .. (off and "cpu " or "none")
    res.rows[#res.rows + 1] = { cpu = cpu, gpu = gpu, offload_optimizer = off, options = opt }
    lines[#lines + 1] = row(cpu, gpu, opt)
  end
  res.text = table.concat(lines, "\n")
  if not o.quiet then print(res.text) end
  return res
end

-- zr.memory.estimate_zero3(...): the same for ZeRO-3, rows for every offload and zero_init
-- combination, in DeepSpeed's order.
function M.estimate_zero3(x, o)
  o = o or {}
  local gpn, nodes, abf = options(o)
  local total, largest = o.total_params, o.largest_layer_params
  if not total or not largest then
    local t, l = M.count(x)
    total, largest = total or t, largest or l
  end
  local res = { total_params = total, largest_layer_params = largest, gpus_per_node = gpn, num_nodes = nodes, rows = {} }
  local lines = { header(total, largest, gpn, nodes) }
  for _, off in ipairs { true, false } do
    for _, offp in ipairs { true, false } do
      if off or not offp then
        for _, zi in ipairs { true, false } do
          local cpu, gpu = M.zero3_needs(total, largest, gpn, nodes, off, offp, zi, abf)
          local opt = fmt("offload_param=%s, offload_optimizer=%s, zero_init=%d", offp and "cpu " or "none",
            off and "cpu " or "none", zi and 1 or 0)
          res.rows[#res.rows + 1] = { cpu = cpu, gpu = gpu, offload_optimizer = off, offload_param = offp,
            zero_init = zi, options = opt }
          lines[#lines + 1] = row(cpu, gpu, opt)
        end
      end
    end
  end
  res.text = table.concat(lines, "\n")
  if not o.quiet then print(res.text) end
  return res
end

-- ---------- CLI: zrun estimate MODEL [--gpus-per-node N] [--nodes M] [--stage 2|3] ----------

local USAGE = "usage: zrun estimate MODEL [--gpus-per-node N] [--nodes M] [--stage 2|3] [--buffer-factor F]\n" ..
  "  MODEL: a Hugging Face model dir, a config.json, a cached hub id, or a built-in name\n" ..
  "         (" .. "meta-llama/Llama-3.2-1B, meta-llama/Meta-Llama-3-8B, gpt2, zrun/tiny-llama, ...)"

-- Parses --key value / --key=value / --flag; positional arguments in order. With `known` (the
-- options that take a value), any other option is refused as unknown before its value is looked
-- for: "<who>: unknown option --x" and the usage (main.c puts "zrun: " before it).
function M.parse_args(args, flags, known, who, usage)
  local o, pos, i = {}, {}, 1
  while i <= #args do
    local a = args[i]
    local k, v = a:match("^%-%-([%w%-]+)=(.*)$")
    if not k then k = a:match("^%-%-([%w%-]+)$") end
    if not k and a:match("^%-.") and known then k = a end
    if k and known and not known[k] and not (flags and flags[k]) then
      error(fmt("%s: unknown option %s%s\n%s", who or "options", k == a and "" or "--", k, usage or ""), 0)
    end
    if k then
      if flags and flags[k] then o[k] = true
      else
        if v == nil then
          i = i + 1
          v = args[i]
          if v == nil then error(fmt("%s--%s needs a value", who and who .. ": " or "", k), 0) end
        end
        o[k] = v
      end
    else
      pos[#pos + 1] = a
    end
    i = i + 1
  end
  return o, pos
end

-- The options a usage text names (--name), plus undocumented aliases: parse_args's `known`.
function M.usage_options(usage, ...)
  local known = {}
  for k in usage:gmatch("%-%-([%w%-]+)") do known[k] = true end
  for _, k in ipairs({ ... }) do known[k] = true end
  return known
end

local function posint(s, what)
  local n = tonumber(s)
  if not n or n < 1 or n ~= floor(n) then error(fmt("%s must be a positive integer, got '%s'", what, tostring(s)), 0) end
  return n
end

-- `zrun estimate`: args, the words after it (USAGE above). Prints DeepSpeed's ZeRO-2 and ZeRO-3
-- model-state tables for MODEL (--stage 2|3: one of them) and returns the exit status: 0, or 1
-- after the usage without exactly one MODEL (0 with --help). Raises for a bad option or value.
function M.main_estimate(args)
  local o, pos = M.parse_args(args or {}, { help = true }, M.usage_options(USAGE, "gpus"), "estimate", USAGE)
  if o.help or #pos ~= 1 then
    print(USAGE)
    return o.help and 0 or 1
  end
  local opts = { gpus_per_node = posint(o["gpus-per-node"] or o.gpus or 1, "--gpus-per-node"),
    num_nodes = posint(o.nodes or 1, "--nodes"), additional_buffer_factor = tonumber(o["buffer-factor"] or 1.5) }
  local stage = o.stage and tonumber(o.stage)
  if o.stage and stage ~= 2 and stage ~= 3 then error("zrun estimate: --stage must be 2 or 3, got " .. o.stage, 0) end
  local total, largest, _, r = M.count(pos[1])
  opts.total_params, opts.largest_layer_params = total, largest
  if stage ~= 3 then
    print("ZeRO-2 (DeepSpeed's estimate_zero2_model_states_mem_needs_all_live):")
    M.estimate_zero2(pos[1], opts)
  end
  if not stage then print("") end
  if stage ~= 2 then
    print("ZeRO-3 (DeepSpeed's estimate_zero3_model_states_mem_needs_all_live):")
    M.estimate_zero3(pos[1], opts)
  end
  print("\nModel states only (DeepSpeed's estimator). Activations, buffers and zrun's exact layout:\n" ..
    "  zrun plan " .. pos[1] .. " --micro-batch B --seq-len T --gpus-per-node N --nodes M")
  return 0
end

return M
