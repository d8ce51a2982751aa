-- zrun: `local zr = require "zrun"`. Tensors and ops come from the C core (zrun._C); this file
-- adds the Lua-side pieces (operators, printing, no_grad, memory) and loads the submodules lazily.
local C = require "zrun._C"
local zr = {}

for k, v in pairs(C) do zr[k] = v end
zr._C = C
zr.version = "0.1.0"

-- A launch zrun cannot join (a partial torchrun environment, mixed launchers that disagree) stops
-- here, before any work, with the reason and the fix (zrun.dist.check_launch).
do
  local bad = require("zrun.dist").check_launch()
  if bad then error(bad, 0) end
end

-- Under mpirun, srun or torchrun each process takes the GPU of its local rank, so that a plain
-- "cuda" in a recipe means one GPU per rank (zr.cuda.set_device chooses otherwise).
do
  local lr = tonumber(os.getenv("OMPI_COMM_WORLD_LOCAL_RANK") or os.getenv("LOCAL_RANK") or
    os.getenv("MPI_LOCALRANKID") or os.getenv("SLURM_LOCALID") or "")
  local n = lr and C.cuda and C.cuda.device_count() or 0
  if n > 1 then C.cuda.set_device(lr % n) end
end

require("zrun.tensor").install(zr)

-- Runs fn with autograd recording off; returns fn's results.
function zr.no_grad(fn, ...)
  local prev = C.set_grad_enabled(false)
  local res = { pcall(fn, ...) }
  C.set_grad_enabled(prev)
  if not res[1] then error(res[2], 0) end
  return unpack(res, 2)
end
-- Runs fn with autograd recording on (inside a no_grad); returns fn's results.
zr.enable_grad = function(fn, ...)
  local prev = C.set_grad_enabled(true)
  local res = { pcall(fn, ...) }
  C.set_grad_enabled(prev)
  if not res[1] then error(res[2], 0) end
  return unpack(res, 2)
end

-- deepspeed.initialize's analogue: engine, optimizer, dataloader, scheduler.
function zr.initialize(opts) return require("zrun.engine").initialize(opts) end

-- transformers' EarlyStoppingCallback for zr.Trainer{callbacks=}: {early_stopping_patience=, early_stopping_threshold=}.
function zr.EarlyStoppingCallback(o) return require("zrun.trainer_callbacks").EarlyStoppingCallback(o) end

-- TRL's SFTTrainer: zr.Trainer on chat / instruction rows (messages, prompt + completion, text),
-- tokenized with the chat template and masked as TRL does (zrun.sft).
function zr.SFTTrainer(o) return require("zrun.sft").SFTTrainer(o) end

-- torch.load's analogue: what a torch.save file (.pt, .bin, .pth) holds, as plain Lua tables with
-- its tensors read as zrun tensors (opts: dtype, device); nothing the file names is run.
function zr.torch_load(path, opts) return require("zrun.torch_file").torch_load(path, opts) end

-- Submodules load on first use: zr.nn, zr.optim, zr.data, zr.memory, ...
local lazy = {
  nn = "zrun.nn", optim = "zrun.optim", data = "zrun.data", memory = "zrun.memory",
  testing = "zrun.testing", models = "zrun.models", config = "zrun.config", dist = "zrun.dist",
  tokenizers = "zrun.tokenizers", datasets = "zrun.datasets", sft = "zrun.sft", chat = "zrun.chat", jinja = "zrun.jinja", zero = "zrun.zero_to_fp32",
  schedulers = "zrun.schedulers", hf = "zrun.hf", engine = "zrun.engine", Trainer = "zrun.trainer", checkpoint_module = "zrun.checkpoint",
  plot = "zrun.plot", progress = "zrun.progress", peft = "zrun.peft", generation = "zrun.generation",
}
-- Names of the lazily loaded submodules (the REPL completes them before they are loaded).
function zr.__lazy_names()
  local out = {}
  for k in pairs(lazy) do out[#out + 1] = k end
  return out
end

setmetatable(zr, {
  __index = function(t, k)
    local mod = lazy[k]
    if mod then
      local m = require(mod)
      rawset(t, k, m)
      return m
    end
  end,
})

return zr
