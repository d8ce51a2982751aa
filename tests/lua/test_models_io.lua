-- Models to and from Hugging Face directories: save_pretrained then from_pretrained gives the same
-- weights and logits; config() reads a directory; config.json is written as transformers 5 writes
-- it; generation_config.json carries through; missing directories give a clear error.
local zr = require "zrun"
local T = zr.testing
local dir = os.tmpname()
os.remove(dir)
local cjson = require "cjson"
local read = T.read_file
local write = T.write_file

T.test("llama save_pretrained / from_pretrained round trip", function()
  zr.manual_seed(4)
  local m = zr.models.llama.LlamaForCausalLM("zrun/tiny-llama")
  m:save_pretrained(dir)
  local cfg = zr.models.llama.config(dir)
  T.eq(cfg.hidden_size, 64); T.eq(cfg.model_type, "llama")
  local back = zr.models.llama.from_pretrained(dir)
  local ids = (zr.rand({ 2, 9 }) * 250):to("i64")
  T.near(back(ids).logits, m(ids).logits, 0)
  local n = 0
  for name, p in back:named_parameters() do n = n + 1 end
  T.eq(n, 21)
end)

T.test("llama from_pretrained skips the per-layer rotary_emb.inv_freq older checkpoints hold, as transformers", function()
  -- (transformers 4.3x saved model.layers.N.self_attn.rotary_emb.inv_freq; transformers 5 drops the key on load)
  local m = zr.models.llama.from_pretrained(dir)
  local sd = {}
  for name, p in m:named_parameters() do sd[name] = p end
  for i = 0, 1 do sd[("model.layers.%d.self_attn.rotary_emb.inv_freq"):format(i)] = zr.ones({ 8 }) end
  local old = dir .. "/inv_freq"
  zr.hf.save_pretrained(old, sd, m.config)
  local back = zr.models.llama.from_pretrained(old)
  local ids = (zr.rand({ 1, 7 }) * 250):to("i64")
  T.near(back(ids).logits, m(ids).logits, 0, 0, "same logits")
  -- any other key the model lacks is still refused
  sd["model.layers.0.self_attn.extra"] = zr.ones({ 2 })
  zr.hf.save_pretrained(old, sd, m.config)
  T.raises(function() zr.models.llama.from_pretrained(old) end, 'Unexpected key(s) in state_dict: "model.layers.0.self_attn.extra".')
end)

T.test("generation_config.json carries through from_pretrained -> save_pretrained, as transformers", function()
  local src, out = dir .. "/gen_src", dir .. "/gen_out"
  zr.models.llama.from_pretrained(dir):save_pretrained(src)
  -- a model built from a config: GenerationConfig.from_model_config's file (the config's token ids)
  local g = cjson.decode(read(src .. "/generation_config.json"))
  T.eq(g._from_model_config, true)
  -- a model directory's own settings (TinyLlama-chat's, with sampling) are kept, floats as floats
  write(src .. "/generation_config.json", '{"bos_token_id": 1, "do_sample": true, "eos_token_id": [2, 5], ' ..
    '"max_length": 2048, "pad_token_id": 0, "temperature": 1.0, "top_p": 0.9}')
  local m = zr.models.llama.from_pretrained(src)
  T.eq(m.generation_config.max_length, 2048)
  local files = m:save_pretrained(out)
  T.eq(files[#files], "generation_config.json")
  g = cjson.decode(read(out .. "/generation_config.json"))
  T.eq(g.do_sample, true); T.eq(g.max_length, 2048); T.eq(g.pad_token_id, 0); T.eq(g.top_p, 0.9)
  T.eq(table.concat(g.eos_token_id, ","), "2,5"); T.eq(g._from_model_config, nil)
  T.eq(read(out .. "/generation_config.json"):find('"temperature": 1.0', 1, true) ~= nil, true, "temperature a float")
  -- GPT-2 too
  local gm = zr.models.gpt2.GPT2LMHeadModel({ n_embd = 16, n_layer = 1, n_head = 2, vocab_size = 41, n_positions = 16 })
  gm:save_pretrained(dir .. "/gen_gpt2")
  write(dir .. "/gen_gpt2/generation_config.json", '{"max_new_tokens": 7}')
  zr.models.gpt2.from_pretrained(dir .. "/gen_gpt2"):save_pretrained(dir .. "/gen_gpt2_out")
  T.eq(cjson.decode(read(dir .. "/gen_gpt2_out/generation_config.json")).max_new_tokens, 7)
end)

T.test("bf16 load converts stored dtype", function()
  local back = zr.models.llama.from_pretrained(dir, { dtype = "bf16" })
  T.eq(back:parameters()[1]:dtype(), "bf16")
end)

T.test("missing model directory is named", function()
  T.raises(function() zr.models.llama.from_pretrained(dir .. "/nope") end, "no model found")
end)


T.test("llama config.json is written as transformers 5 writes it, plus the legacy keys", function()
  local c = cjson.decode(read(dir .. "/config.json"))
  -- zrun/tiny-llama: rope_theta 10000, llama3 factor 4 over 32 positions
  T.eq(c.rope_parameters.rope_type, "llama3"); T.eq(c.rope_parameters.rope_theta, 10000)
  T.eq(c.rope_parameters.factor, 4); T.eq(c.rope_parameters.original_max_position_embeddings, 32)
  T.eq(c.rope_theta, 10000, "legacy rope_theta"); T.eq(c.rope_scaling.rope_type, "llama3", "legacy rope_scaling")
  T.eq(c.rope_scaling.rope_theta, nil, "no theta inside the legacy rope_scaling")
  T.eq(c.dtype, "float32"); T.eq(c.torch_dtype, "float32"); T.eq(c.device, nil)
  T.eq(c.model_type, "llama"); T.eq(c.architectures[1], "LlamaForCausalLM")
  -- floats stay floats for transformers' typed config classes
  local text = read(dir .. "/config.json")
  T.eq(text:find('"rope_theta": 10000.0', 1, true) ~= nil, true, "rope_theta written as a float")
  T.eq(text:find('"factor": 4.0', 1, true) ~= nil, true, "factor written as a float")
end)

T.test("a config.json's dtype is the checkpoint's precision; the model is built as asked", function()
  local c = cjson.decode(read(dir .. "/config.json"))
  c.dtype, c.torch_dtype = "bfloat16", nil
  write(dir .. "/config.json", zr.hf.encode_json(c))
  T.eq(zr.models.llama.config(dir).torch_dtype, "bfloat16", "read as torch_dtype")
  T.eq(zr.models.llama.from_pretrained(dir):parameters()[1]:dtype(), "f32", "default f32")
  T.eq(zr.models.llama.LlamaForCausalLM(zr.models.llama.config(dir)):parameters()[1]:dtype(), "f32", "built from the config")
end)

T.test("from_pretrained: a refused field names the override that loads without it", function()
  local c = cjson.decode(read(dir .. "/config.json"))
  c.attention_dropout = 0.1
  write(dir .. "/config.json", zr.hf.encode_json(c))
  T.raises(function() zr.models.llama.from_pretrained(dir) end, "attention_dropout is 0.1")
  local m = zr.models.llama.from_pretrained(dir, { config = { attention_dropout = 0 } })
  T.eq(m.config.attention_dropout, 0)
end)

T.test("gpt2 save_pretrained / from_pretrained round trip, and OpenAI's checkpoint names", function()
  zr.manual_seed(6)
  local m = zr.models.gpt2.GPT2LMHeadModel({ n_embd = 16, n_layer = 2, n_head = 2, vocab_size = 41, n_positions = 16 })
  local gdir = dir .. "/gpt2"
  m:save_pretrained(gdir)
  local c = cjson.decode(read(gdir .. "/config.json"))
  T.eq(c.model_type, "gpt2"); T.eq(c.activation_function, "gelu_new"); T.eq(c.attn_pdrop, 0)
  local ids = (zr.rand({ 2, 7 }) * 40):to("i64")
  T.near(zr.models.gpt2.from_pretrained(gdir)(ids).logits, m(ids).logits, 0, 0, "round trip")
  -- the original openai-community/gpt2 layout: no "transformer." prefix, causal-mask buffers
  local sd = {}
  for name, p in m:named_parameters() do sd[name:gsub("^transformer%.", "")] = p end
  sd["h.0.attn.bias"] = zr.ones({ 1, 1, 16, 16 })
  sd["h.1.attn.masked_bias"] = zr.full({ 1 }, -1e4)
  zr.hf.save_state_dict(gdir, sd)
  T.near(zr.models.gpt2.from_pretrained(gdir)(ids).logits, m(ids).logits, 0, 0, "OpenAI names")
  -- transformers' default dropout 0.1 (openai-community/gpt2 has it), off in eval
  c.attn_pdrop, c.resid_pdrop, c.embd_pdrop = 0.1, 0.1, 0.1
  write(gdir .. "/config.json", zr.hf.encode_json(c))
  local d = zr.models.gpt2.from_pretrained(gdir)
  T.eq(d.config.attn_pdrop, 0.1)
  d:eval()
  T.near(d(ids).logits, m(ids).logits, 0, 0, "dropout off in eval")
  -- opts.config overrides config.json's fields, as keyword arguments of transformers' from_pretrained
  T.eq(zr.models.gpt2.from_pretrained(gdir, { config = { attn_pdrop = 0 } }).config.attn_pdrop, 0)
end)

os.execute("rm -rf '" .. dir .. "'")
T.done()
