-- Under mpirun: every rank of a zrun engine loads DeepSpeed's ZeRO checkpoint CASE (a folder under
-- tests/golden/torch_files) at zrun stage STAGE, then its parameters (gathered) equal the saved
-- fp32 weights, the step counts go on from the checkpoint's, and 16 steps on the ranks' batches
-- lower the loss (averaged over the ranks). zrun ds_checkpoint_check.lua CASE STAGE
local zr = require "zrun"
local dist = zr.dist
local case, stage = arg[1], tonumber(arg[2])
local DIR = (ZRUN_HOME or ".") .. "/tests/golden/torch_files/"
local tied = case == "ds_zero3" or case == "ds_nozero_bf16"
local m
if tied then -- built tied, the file's untied lm_head.weight left out (from_pretrained refuses it: transformers unties)
  m = zr.testing.tied_llama(DIR .. "llama_micro_bin")
else
  m = zr.models.llama.from_pretrained(DIR .. "llama_micro_bin")
end
if case == "ds_zero3" then m.model.embed_tokens.weight:requires_grad_(false)
elseif not (case:find("^ds_universal") or case == "ds_nozero_bf16" or case == "ds_nozero_fp16") then
  m.lm_head.weight:requires_grad_(false)
end
local engine = zr.initialize { model = m, config = { train_micro_batch_size_per_gpu = 1,
  optimizer = { type = "AdamW", params = { lr = 1e-2 } }, zero_optimization = { stage = stage } } }
engine:load_checkpoint(DIR .. case)
local name = ("%s at stage %d on %d ranks"):format(case, stage, dist.world_size())
local ok, err = pcall(function()
  assert(engine.global_steps == 2 and engine.opt_steps == 2, "step counts " .. engine.global_steps .. " " .. engine.opt_steps)
  local ref = zr.load_safetensors(DIR .. case .. "/reference.safetensors")
  local all = {}
  for i = 1, #engine.params do all[i] = i end
  if stage == 3 then engine.zero:gather(all) end
  for k, p in m:named_parameters() do
    local d = (p:to({ dtype = "f32" }) - ref[k]):abs():max():item()
    assert(d == 0, ("rank %d: %s differs from the checkpoint by %g"):format(dist.rank(), k, d))
  end
  if stage == 3 then engine.zero:release(all) end
  local first, last
  for _ = 1, 16 do
    local r = dist.rank()
    local ids = zr.tensor({ { 1 + r, 5, 7, 9 + r, 3, 11, 4, 8 } }, { dtype = "i64" })
    local loss = engine(ids, ids).loss
    engine:backward(loss)
    engine:step()
    local l = zr.tensor({ loss:item() })
    dist.all_reduce(l)
    l = l:item() / dist.world_size()
    first = first or l
    last = l
  end
  assert(last < first - 0.04, ("the loss did not fall: %.4f -> %.4f"):format(first, last))
  assert(engine.global_steps == 18, "global_steps " .. engine.global_steps)
end)
if dist.rank() == 0 then print((ok and "PASS " or "FAIL ") .. name .. (ok and "" or (": " .. tostring(err)))) end
if not ok then os.exit(1) end
