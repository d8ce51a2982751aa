-- Subcommands of the zrun program: `zrun report` (the ds_report analogue), `zrun check`, `zrun plot`, ...
local M = {}

local function report()
  local zr = require "zrun"
  local b = zr._C.build_info()
  local function yn(v) return v and "yes" or "no" end
  local rows = {
    { "zrun", ("%s (git %s)"):format(b.version, b.git_rev) },
    { "home", ZRUN_HOME },
    { "compiler", b.compiler .. ", built " .. b.built },
    { "LuaJIT", jit and jit.version or "?" },
    { "OpenMP threads", ("%d (of %d CPUs; set OMP_NUM_THREADS to change)"):format(b.omp_threads, b.cpus) },
    { "BLAS", b.openblas and ((b.openblas_config or "") .. ", " .. b.openblas_threads .. " threads" ..
      (b.openblas_core_note and ("; " .. b.openblas_core_note) or "")) or "none (built-in matmul kernel)" },
    { "MPI", b.mpi and b.mpi_version or "no (single process only)" },
    { "launch N ranks here", b.mpi and zr.dist.mpirun_command("N", { argv = { "recipe.lua" } }) or "-" },
    { "PCRE2 (tokenizers)", b.pcre2 and b.pcre2_version or "no" },
    { "utf8proc (normalizers)", b.utf8proc and (b.utf8proc_version .. ", Unicode " .. b.unicode_version) or "no" },
    { "readline (REPL)", yn(b.readline) },
    { "CUDA backend", b.cuda and "compiled in" or "not compiled in (rebuild where nvcc is available)" },
    { "NCCL", b.nccl and "compiled in" or "no" },
  }
  if b.cuda then
    rows[#rows + 1] = { "CUDA runtime / driver", ("%s / %s"):format(b.cuda_runtime or "?", b.cuda_driver or "?") }
    if b.nccl_version then rows[#rows + 1] = { "NCCL version", b.nccl_version } end
    local cu = zr._C.cuda
    local n = cu and cu.device_count() or 0
    if n == 0 then
      rows[#rows + 1] = { "GPUs", "none visible (" .. (cu and cu.unavailable_reason() or "?") .. "): zrun runs on the CPU" }
    else
      for i = 0, n - 1 do rows[#rows + 1] = { ("GPU cuda:%d"):format(i), cu.device_name(i) } end
    end
  end
  local w = 0
  for _, r in ipairs(rows) do if #r[1] > w then w = #r[1] end end
  print("zrun report")
  print(string.rep("-", 60))
  for _, r in ipairs(rows) do print(("%-" .. w .. "s  %s"):format(r[1], r[2])) end
end

local SUBCOMMANDS = { "report", "check", "estimate", "plan", "plot", "zero-to-fp32", "inspect" }

-- Names in folder dir (nil when it cannot be listed).
local function names_in(dir)
  local ok, list = pcall(require("zrun._C").listdir, dir)
  return ok and type(list) == "table" and list or nil
end

-- The one line `zrun PATH` prints when PATH is no file (main.c): a recipe named relative to zrun's folder from
-- another one gets the full path, a typo in a script's or a subcommand's name the name it was likely meant to be.
function M.missing_script(path)
  local suggest = require("zrun.config").suggest
  local home = ZRUN_HOME or "."
  local relative = path:sub(1, 1) ~= "/"
  local function is_file(p) return require("zrun._C").path_type(p) == "file" end
  if relative and is_file(home .. "/" .. path) then
    return ("cannot open %s: no such file in this folder; zrun's own is %s/%s"):format(path, home, path)
  end
  if not path:find("/", 1, true) and not path:find("%.lua$") then
    local s = suggest(path, SUBCOMMANDS)
    if s then return ("'%s' is neither a script nor a subcommand (did you mean 'zrun %s'?)"):format(path, s) end
  end
  local dir, base = path:match("^(.-)([^/]*)$")
  local where = { dir == "" and "." or dir }
  if relative then where[2] = home .. "/" .. dir end
  for _, d in ipairs(where) do
    local names = names_in(d)
    local s = names and suggest(base, names)
    if s then
      local p = (d == where[1] and dir or home .. "/" .. dir) .. s
      return ("cannot open %s: no such file (did you mean %s?)"):format(path, p)
    end
  end
  return ("cannot open %s: no such file (zrun SCRIPT.lua runs a Lua script; zrun --help lists the subcommands)"):format(path)
end

-- zrun SUBCOMMAND args...: report, check, estimate, plan, plot, zero-to-fp32, inspect.
function M.main(cmd, ...)
  if cmd == "report" then
    local extra = ...
    if extra ~= nil then error(("zrun report takes no arguments, got '%s'"):format(tostring(extra)), 0) end
    return report()
  end
  if cmd == "check" then
    local ok, config = pcall(require, "zrun.config")
    if not ok then error("zrun check: the config module is not available: " .. tostring(config), 0) end
    os.exit(config.check_main({ ... }))
  end
  if cmd == "plot" then os.exit(require("zrun.plot").main({ ... })) end
  if cmd == "zero-to-fp32" then os.exit(require("zrun.zero_to_fp32").main({ ... })) end
  if cmd == "inspect" then os.exit(require("zrun.inspect_file").main({ ... })) end
  if cmd == "estimate" or cmd == "plan" then
    local ok, est = pcall(require, cmd == "estimate" and "zrun.memory_estimate" or "zrun.memory_plan")
    if not ok then error("zrun " .. cmd .. ": not available in this build: " .. tostring(est), 0) end
    return os.exit(est["main_" .. cmd]({ ... }) or 0)
  end
  error("unknown subcommand '" .. tostring(cmd) .. "'", 0)
end

return M
