-- Mutated DeepSpeed checkpoint files (tests/golden/torch_files) consolidated by zrun.zero_to_fp32:
-- each must give the weights or a one-line error naming the checkpoint, never a Lua error. Longer
-- than test_deepspeed_checkpoint.lua's loop; not part of the suite. Works in /tmp/dsfz.
--   zrun tests/fuzz/ds_checkpoint_mutants.lua [SEED] [COUNT]
os.execute("mkdir -p /tmp/dsfz")
local z = require "zrun.zero_to_fp32"
local SRC = (ZRUN_HOME or ".") .. "/tests/golden/torch_files/"
math.randomseed(tonumber(arg[1]) or 1)
local kinds, bad, errs = {}, 0, 0
local cases = { "ds_zero2", "ds_zero3", "ds_zero2_aligned" }
for k = 1, tonumber(arg[2]) or 200 do
  local c = cases[k % 3 + 1]
  os.execute("rm -rf /tmp/dsfz/c && mkdir -p /tmp/dsfz/c && cp -r " .. SRC .. c .. "/global_step2 " .. SRC .. c .. "/latest /tmp/dsfz/c/")
  local files = {}
  for f in io.popen("ls /tmp/dsfz/c/global_step2"):lines() do files[#files + 1] = f end
  local f = "/tmp/dsfz/c/global_step2/" .. files[math.random(#files)]
  local h = io.open(f, "rb"); local s = h:read("*a"); h:close()
  local bytes = {}
  for i = 1, #s do bytes[i] = s:sub(i, i) end
  for _ = 1, math.random(3) do
    local pos = math.random(3) == 1 and math.random(#bytes) or math.random(math.min(#bytes, 1600))
    bytes[pos] = string.char(math.random(0, 255))
  end
  h = io.open(f, "wb"); h:write(table.concat(bytes)); h:close()
  local ok, err = pcall(z.get_fp32_state_dict_from_zero_checkpoint, "/tmp/dsfz/c")
  if not ok then
    errs = errs + 1
    err = tostring(err)
    if err:find("attempt to") or err:find("bad argument") or not err:find("/tmp/dsfz/c", 1, true) then
      bad = bad + 1
      local key = err:sub(1, 140)
      if not kinds[key] then kinds[key] = true; print(key) end
    end
  end
end
print("errors", errs, "unclean", bad)
