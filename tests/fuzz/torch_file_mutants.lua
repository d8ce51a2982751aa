-- Mutated torch.save files (tests/golden/torch_files) read by zrun.torch_file, every tensor asked
-- for: each must give a value or an error naming the file, never a Lua error. Longer than
-- test_torch_file.lua's loop; not part of the suite.
--   zrun tests/fuzz/torch_file_mutants.lua [SEED] [COUNT]
local MUT = os.tmpname()
local tf = require "zrun.torch_file"
local P = require "zrun.torch_pickle"
local DIR = (ZRUN_HOME or ".") .. "/tests/golden/torch_files/"
local seeds = {}
for _, f in ipairs{"values_zip64.pt", "values.pt","values_legacy.pt","llama_micro_sharded/pytorch_model-00002-of-00002.bin","ds_zero3/global_step2/zero_pp_rank_0_mp_rank_00_optim_states.pt","llama_micro_bin/pytorch_model.bin"} do
  local h = io.open(DIR..f,"rb"); seeds[#seeds+1] = h:read("*a"); h:close() end
math.randomseed(tonumber(arg[1]) or 1)
local bad, errs = 0, 0
local kinds = {}
for k = 1, tonumber(arg[2]) or 3000 do
  local s = seeds[k % #seeds + 1]
  local bytes = {}
  for i = 1, #s do bytes[i] = s:byte(i) end
  local region = math.random(3)
  for _ = 1, math.random(4) do
    local pos
    if region == 1 then pos = math.random(#bytes) elseif region == 2 then pos = #bytes - math.random(math.min(#bytes, 600)) + 1 else pos = math.random(math.min(#bytes, 1500)) end
    bytes[pos] = math.random(0, 255)
  end
  if math.random(10) == 1 then for _ = 1, math.random(50) do table.remove(bytes) end end
  local h = io.open(MUT, "wb"); local parts = {}; for i = 1, #bytes do parts[i] = string.char(bytes[i]) end; h:write(table.concat(parts)); h:close()
  local ok, err = pcall(function()
    local obj, file = tf.load(MUT)
    local function walk(v, seen)
      if type(v) ~= "table" or seen[v] then return end
      seen[v] = true
      if P.is_tensor(v) then local ok2, e2 = pcall(v.get, v); if not ok2 and not tostring(e2):find(MUT, 1, true) then error("GET: "..tostring(e2)) end return end
      for a, b in pairs(v) do walk(a, seen); walk(b, seen) end
    end
    walk(obj, {})
    file:close()
  end)
  if not ok then
    errs = errs + 1
    if not tostring(err):find(MUT, 1, true) then bad = bad + 1; local key = tostring(err):sub(1, 90); if not kinds[key] then kinds[key] = true; print(key) end end
  end
end
print("errors", errs, "without name", bad)
os.remove(MUT)
