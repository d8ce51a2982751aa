-- The loops of a kernel's SASS that issue wgmma (HGMMA), with their instruction counts by opcode,
-- read statically from nvdisasm's output: no GPU needed. The CUDA toolkit's nvdisasm is on PyPI
-- (pip download --no-deps nvidia-cuda-nvdisasm; the wheel is a zip holding nvidia/cu13/bin/nvdisasm):
--   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -DZR_HAVE_CUDA \
--        -Iruntime -Ikernels -Ikernels/cuda -cubin kernels/cuda/gemm_sm90.cu -o g.cubin
--   nvdisasm -c g.cubin > g.sass
--   zrun tests/bench/sass_loops.lua g.sass [kernel=SUBSTRING] [top=12] [list=0]
-- kernel: a substring of the mangled names (e.g. ILi0ELi0ELi0ELi1ELi4E, gemm_sm90_kernel<0,0,0,1,4>);
-- a loop is a backward branch and its target, listed when it holds an HGMMA (nested loops each);
-- list=1 prints the innermost such loop's instructions. Static counts: a loop's instructions once,
-- whatever its trip count (session 29: the GEMM's main loop 65 -> 50, the attention backward's
-- step 755 -> 699, each checked against ncu's executed counts on the GPU).
local cli = require("zrun.argparse").new("tests/bench/sass_loops.lua",
  "Instruction counts of the wgmma loops of a kernel, from nvdisasm -c output.")
cli:option("sass", "", "nvdisasm -c output"):positional("sass")
cli:option("kernel", "", "substring of the mangled kernel names"):option("top", 12, "opcodes listed a loop")
cli:option("list", 0, "1: print the innermost wgmma loop's instructions")
local a = cli:parse(arg)
if a.sass == "" then io.stderr:write(cli:help_text()); os.exit(2) end
if a.list ~= 0 and a.list ~= 1 then
  io.stderr:write("sass_loops: list=" .. tostring(a.list) .. "; use 1 (print the innermost loop) or 0\n"); os.exit(2)
end
if a.top < 1 then io.stderr:write("sass_loops: top=" .. tostring(a.top) .. "; list at least 1 opcode\n"); os.exit(2) end
local f = io.open(a.sass)
if not f then io.stderr:write("sass_loops: cannot open " .. a.sass .. "\n"); os.exit(2) end

-- functions: name -> { ins = {{addr, text}}, labels = {label = addr} }
local funcs, order, cur, pending = {}, {}, nil, {}
for line in f:lines() do
  local name = line:match("^(_Z%S+):$")
  if name then
    cur = { ins = {}, labels = {} }
    funcs[name] = cur; order[#order + 1] = name; pending = {}
  elseif cur then
    local label = line:match("^(%.L_x_%d+):")
    if label then
      pending[#pending + 1] = label
    else
      local addr, text = line:match("^%s*/%*(%x+)%*/%s+(.-)%s*;")
      if addr then
        addr = tonumber(addr, 16)
        for _, l in ipairs(pending) do cur.labels[l] = addr end
        pending = {}
        cur.ins[#cur.ins + 1] = { addr, text }
      end
    end
  end
end
f:close()

local function opcode(text)
  local op = text:match("^@!?U?P%w+%s+(%S+)") or text:match("^(%S+)")
  return (op:match("^([^.]+)"))
end

local shown = 0
for _, name in ipairs(order) do
  if a.kernel == "" or name:find(a.kernel, 1, true) then
    local fn, loops = funcs[name], {}
    for i, ins in ipairs(fn.ins) do
      local label = ins[2]:find("BRA", 1, true) and ins[2]:match("%((%.L_x_%d+)%)")
      local target = label and fn.labels[label]
      if target and target < ins[1] then
        local n, hg, ops, body = 0, 0, {}, {}
        for j = 1, i do
          local x = fn.ins[j]
          if x[1] >= target then
            n = n + 1; body[#body + 1] = x
            local op = opcode(x[2])
            ops[op] = (ops[op] or 0) + 1
            if op == "HGMMA" then hg = hg + 1 end
          end
        end
        if hg > 0 then loops[#loops + 1] = { from = target, to = ins[1], n = n, hg = hg, ops = ops, body = body } end
      end
    end
    if #loops > 0 then
      shown = shown + 1
      print(name .. ": " .. #fn.ins .. " instructions")
      local inner
      for _, l in ipairs(loops) do
        local list = {}
        for op, c in pairs(l.ops) do list[#list + 1] = { op, c } end
        table.sort(list, function(x, y) return x[2] > y[2] or (x[2] == y[2] and x[1] < y[1]) end)
        local parts = {}
        for k = 1, math.min(a.top, #list) do parts[k] = list[k][1] .. " " .. list[k][2] end
        print(string.format("  loop %05x-%05x: %d instructions, %d HGMMA (%s)", l.from, l.to, l.n, l.hg,
          table.concat(parts, ", ")))
        if not inner or l.n < inner.n then inner = l end
      end
      if a.list == 1 then
        for _, x in ipairs(inner.body) do print(string.format("    %05x %s", x[1], x[2])) end
      end
    end
  end
end
if shown == 0 then
  io.stderr:write("sass_loops: no function" .. (a.kernel ~= "" and (" matching '" .. a.kernel .. "'") or "") ..
    " with a loop that issues HGMMA in " .. a.sass .. "\n")
  os.exit(1)
end
