-- OpenBLAS's kernels for this CPU (kernels/cpu/blas_core.c): where Debian's OpenBLAS (DYNAMIC_ARCH) falls back to a
-- core without AVX on a CPU that has it (a model it does not know: 0.3.21 on Sapphire Rapids, a VM's generic
-- model), zrun takes the kernels the CPU's features allow and `zrun report` says so; a user's OPENBLAS_CORETYPE
-- stands. Checked against /proc/cpuinfo's flags (the kernel's view of the CPU), whatever machine this runs on.
local zr = require "zrun"
local T = zr.testing
local Z = os.getenv("ZRUN_BIN") or arg[-1]

local function blas_line(env)
  local out, rc = T.run((env or "") .. " " .. Z .. " report")
  T.eq(rc, 0, "zrun report: " .. out)
  return out:match("\nBLAS%s+([^\n]*)")
end
local function cpu_flags()
  local f = io.open("/proc/cpuinfo")
  if not f then return nil end
  local flags = f:read("*a"):match("\nflags%s*:%s*([^\n]*)")
  f:close()
  local set = {}
  for w in (flags or ""):gmatch("%S+") do set[w] = true end
  return flags and set
end
local NO_AVX = { Prescott = true, Katmai = true, Coppermine = true, Northwood = true, Banias = true, Core2 = true,
  Penryn = true, Dunnington = true, Nehalem = true, Atom = true }

local line = blas_line()
if not line or not line:find("OpenBLAS", 1, true) then
  T.skip("OpenBLAS's kernels", "zrun is built without OpenBLAS (" .. tostring(line) .. ")")
  return T.done()
end
local core = line:match("USE_OPENMP (%S+)") or line:match("DYNAMIC_ARCH.- (%a[%w]+) MAX_THREADS")

T.test("a CPU with AVX2 runs OpenBLAS kernels with AVX (zrun's choice where OpenBLAS fell back)", function()
  local flags = cpu_flags()
  if not flags then return T.skip("flags", "no /proc/cpuinfo") end
  assert(core, "no core name in: " .. line)
  if flags.avx2 and flags.fma then
    T.eq(NO_AVX[core], nil, ("core %s on a CPU with AVX2 (%s)"):format(core, line))
  end
  if line:find("chosen by the CPU's features", 1, true) then
    T.eq(core == "SkylakeX" or core == "Haswell" or core == "Sandybridge", true, line)
  end
end)

T.test("OPENBLAS_CORETYPE set by the user stands", function()
  local l = blas_line("OPENBLAS_CORETYPE=Prescott")
  T.eq(l:find("Prescott", 1, true) ~= nil, true, l)
  T.eq(l:find("chosen by the CPU's features", 1, true), nil, l)
end)

T.done()
