-- Models to and from Hugging Face directories: save_pretrained then from_pretrained gives the same
-- weights and logits; config() reads a directory; missing directories give a clear error.
local zr = require "zrun"
local T = zr.testing
local dir = os.tmpname()
os.remove(dir)

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

T.test("bf16 load converts stored dtype", function()
  local back = zr.models.llama.from_pretrained(dir, { dtype = "bf16" })
  T.eq(back:parameters()[1]:dtype(), "bf16")
end)

T.test("missing model directory is named", function()
  T.raises(function() zr.models.llama.from_pretrained(dir .. "/nope") end, "no model found")
end)

os.execute("rm -rf '" .. dir .. "'")
T.done()
