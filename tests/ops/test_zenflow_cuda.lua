-- ZenFlow's column kernels on CUDA vs their CPU twins (runtime/zero/zenflow.h): column sums, the
-- batched one-pass |a - prev| sums of update_interval "auto" (zenflow_absdiff_sums),
-- gather/scatter of selected columns, AdamW on them (f32 and bf16 parameters, the gradient whole or
-- its selected columns gathered), at awkward sizes; then a zenflow engine run on the GPU vs the CPU, and
-- an overlap_step checkpoint resumed on the GPU against the uninterrupted GPU run; update_interval "auto"
-- ends the same windows on the GPU as on the CPU.
local C = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "cuda_common.lua")
if C.skip_without_gpu("zenflow") then return end
local zr, T, close = C.zr, C.T, C.close
local K = zr._C

local function idx(list) return zr.tensor(list, { dtype = "i32" }) end

T.test("zenflow kernels: CUDA equals the CPU at awkward sizes (f32, bf16; 1-D; no columns)", function()
  for _, sh in ipairs { { 7, 13, { 0, 4, 5, 12 } }, { 1, 31, nil }, { 129, 257, { 1, 2, 3, 100, 200, 256 } },
    { 5, 3, { 2 } } } do
    local rows, cols, list = sh[1], sh[2], sh[3]
    local k = list and #list or cols
    local ix = list and idx(list)
    local ixc = ix and ix:cuda()
    local g = zr.randn(rows, cols)
    local sc, sg = zr.zeros(cols), zr.zeros(cols, { device = "cuda" })
    K.zenflow_colsum(sc, g); K.zenflow_colsum(sg, g:cuda())
    close(sg:cpu(), sc, "f32", "colsum " .. rows .. "x" .. cols)
    for _, dt in ipairs { "f32", "bf16" } do
      local p = zr.randn(rows, cols):to(dt)
      local oc, og = zr.zeros(rows * k, { dtype = dt }), zr.zeros(rows * k, { dtype = dt, device = "cuda" })
      K.zenflow_gather(oc, p, ix); K.zenflow_gather(og, p:cuda(), ixc)
      T.eq(T.diff(og:cpu(), oc), 0, "gather " .. dt)
      local pc, pg = p:clone(), p:cuda()
      local src = zr.randn(rows * k):to(dt)
      K.zenflow_scatter(pc, src, ix); K.zenflow_scatter(pg, src:cuda(), ixc)
      T.eq(T.diff(pg:cpu(), pc), 0, "scatter " .. dt)
      for _, gathered in ipairs { false, true } do -- g whole, or its selected columns (rows, k)
        local gk = g
        if gathered then gk = zr.zeros(rows * k); K.zenflow_gather(gk, g, ix) end
        local mc, vc = zr.randn(rows * k) * 0.01, zr.rand(rows * k) * 0.01
        local mg, vg = mc:cuda(), vc:cuda()
        pc, pg = p:clone(), p:cuda()
        for step = 1, 3 do
          K.zenflow_adamw(pc, gk, ix, mc, vc, 1e-2, 0.9, 0.999, 1e-8, 0.1, step)
          K.zenflow_adamw(pg, gk:cuda(), ixc, mg, vg, 1e-2, 0.9, 0.999, 1e-8, 0.1, step)
        end
        local what = ("adamw %dx%d %s gathered=%s"):format(rows, cols, dt, tostring(gathered))
        close(pg:cpu():to("f32"), pc:to("f32"), dt, what)
        close(mg:cpu(), mc, "f32", what .. " m")
        close(vg:cpu(), vc, "f32", what .. " v")
      end
    end
  end
end)

T.test("zenflow_absdiff_sums on CUDA equals the CPU: 600 entries, odd sizes and offsets, prev or not, keep; " ..
  "deterministic, an entry's sum the same alone as among others", function()
  zr.manual_seed(11)
  -- 600 entries: a 24 KB table, more than the first pinned slot (16 KB) holds
  local sizes, E = { 1, 7, 0, 3, 4096, 16383, 16384, 16385, 32769, 100003, 1000003, 5 }, 600
  local cpu, gpu, rows = {}, {}, {}
  for i = 1, E do
    local n = sizes[i] or (i * 7919) % 20011
    local off = ({ 1, 4, 0 })[i % 3 + 1] -- 1: no float4 loads; 4: 16-byte aligned inside the storage
    local function pair()
      local c = zr.randn(n + off):narrow(1, 1 + off, n)
      local g = zr.zeros(n + off, { device = "cuda" }):narrow(1, 1 + off, n)
      g:copy_(c)
      return c, g
    end
    local ac, ag = pair()
    local pc, pg
    if i % 5 ~= 0 then pc, pg = pair() end
    local have, keep = pc ~= nil and i % 2 == 0, pc ~= nil and i % 3 ~= 1
    local slot = (i * 37) % E + 1 -- a permutation of 1..E: slots out of entry order
    cpu[i], gpu[i] = { slot, ac, pc, have, keep }, { slot, ag, pg, have, keep }
    rows[i] = { n = n, off = off, a = ac, p = pc and pc:clone() }
  end
  local function no_keep(list)
    local out = {}
    for i, e in ipairs(list) do out[i] = { e[1], e[2], e[3], e[4], false } end
    return out
  end
  -- queued back to back, read once: the pinned slots are reused while copies may still be queued
  local s1, s2 = zr.full({ E }, -1, { device = "cuda" }), zr.full({ E }, -1, { device = "cuda" })
  K.zenflow_absdiff_sums(s1, no_keep(gpu))
  K.zenflow_absdiff_sums(s2, no_keep(gpu))
  local alone = {}
  for _, i in ipairs { 1, 3, 8, 11, 12, 100, 599 } do
    alone[i] = zr.full({ E }, -1, { device = "cuda" })
    local e = gpu[i]
    K.zenflow_absdiff_sums(alone[i], { { e[1], e[2], e[3], e[4], false } })
  end
  T.eq(T.diff(s1:cpu(), s2:cpu()), 0, "two runs: the same bits")
  local f1 = s1:cpu():flat_table()
  for i, t in pairs(alone) do
    T.eq(t:cpu():flat_table()[gpu[i][1]], f1[gpu[i][1]], "entry " .. i .. " alone and among 600")
  end
  local sc, sg = zr.full({ E }, -1), zr.full({ E }, -1, { device = "cuda" })
  K.zenflow_absdiff_sums(sc, cpu)
  K.zenflow_absdiff_sums(sg, gpu)
  local c, g = sc:flat_table(), sg:cpu():flat_table()
  for i = 1, E do
    local slot, r = cpu[i][1], rows[i]
    local what = ("entry %d (n %d, offset %d, prev %s, keep %s)"):format(i, r.n, r.off, tostring(cpu[i][4]),
      tostring(cpu[i][5]))
    T.eq(f1[slot], g[slot], what .. ": the same without keep")
    if math.abs(g[slot] - c[slot]) > 2.5e-7 * math.abs(c[slot]) then -- both double sums rounded to f32: one ulp
      error(("%s: cuda %.9g vs cpu %.9g"):format(what, g[slot], c[slot]))
    end
    if r.p then
      T.eq(T.diff(gpu[i][3]:cpu(), cpu[i][5] and r.a or r.p), 0, what .. ": prev afterwards")
    end
  end
  T.raises(function() K.zenflow_absdiff_sums(sg, { { 1, zr.randn(3) } }) end, "on one device")
end)

T.test("zenflow engine on the GPU equals the CPU run (f32, re-selection, boundaries; overlap_step; update_interval auto)",
  function()
  -- auto: inputs of very different scales (windows of several micro-steps); the same windows end on both
  local scale = zr.tensor((function()
    local v = {}
    for j = 1, 24 do v[j] = 4 * 0.7 ^ (j - 1) end
    return v
  end)()):view(1, 24)
  local function run(device, overlap, auto)
    zr.manual_seed(5)
    local model = zr.nn.Sequential(zr.nn.Linear(24, 40), zr.nn.Tanh(), zr.nn.Linear(40, 7))
    model:to(device)
    local zf = auto and { topk_ratio = 0.2, update_interval = "auto", auto_ratio = 1, full_warm_up_rounds = 1,
      overlap_step = overlap }
      or { topk_ratio = 0.2, select_strategy = "step", select_interval = 6, update_interval = 3, full_warm_up_rounds = 1,
        overlap_step = overlap }
    local e = zr.initialize { model = model, config = { train_micro_batch_size_per_gpu = 4, steps_per_print = 1000,
      gradient_clipping = 0.5, optimizer = { type = "AdamW", params = { lr = 1e-2, weight_decay = 0.01 } },
      zero_optimization = { stage = 2, offload_optimizer = { device = "cpu" }, zenflow = zf } } }
    local ends = {}
    for t = 1, (auto and 24 or 13) do
      zr.manual_seed(50 + t)
      local x, y = zr.randn(4, 24), zr.randn(4, 7)
      if auto then x = x * scale end
      x, y = x:to(device), y:to(device)
      e:backward((e(x) - y):square():mean())
      ends[t] = e:step() and "1" or "0"
    end
    local out = {}
    for i, p in ipairs(e:parameters()) do out[i] = p:detach():cpu() end
    return out, table.concat(ends)
  end
  for _, case in ipairs { { false }, { true }, { false, true }, { true, true } } do
    local overlap, auto = case[1], case[2]
    local what = (overlap and " (overlap_step)" or "") .. (auto and " (update_interval auto)" or "")
    local g, gb = run("cuda", overlap, auto)
    local c, cb = run("cpu", overlap, auto)
    T.eq(gb, cb, "the micro-steps that ended a window" .. what)
    if auto then T.eq(cb:find("00", 3) ~= nil, true, "windows of several micro-steps (" .. cb .. ")") end
    for i = 1, #c do close(g[i], c[i], "f32", "parameter " .. i .. what, 10) end
  end
end)

T.test("zenflow overlap_step checkpoint on the GPU: the resumed run repeats the uninterrupted one bit for bit; " ..
  "offload = true (moments on the host) is the same run", function()
  local dir = os.tmpname(); os.remove(dir)
  local function engine(offload)
    zr.manual_seed(5)
    local model = zr.nn.Sequential(zr.nn.Linear(24, 40), zr.nn.Tanh(), zr.nn.Linear(40, 7)):to("cuda")
    return zr.initialize { model = model, config = { train_micro_batch_size_per_gpu = 4, steps_per_print = 1000,
      optimizer = { type = "AdamW", params = { lr = 1e-2, weight_decay = 0.01 } },
      zero_optimization = { stage = 2, offload_optimizer = { device = "cpu" }, overlap_comm = offload or nil,
        zenflow = { topk_ratio = 0.2, select_strategy = "step", select_interval = 6, update_interval = 3,
        full_warm_up_rounds = 1, overlap_step = true, offload = offload } } } }
  end
  local function run(e, from, to)
    for t = from, to do
      zr.manual_seed(50 + t)
      local x, y = zr.randn(4, 24):cuda(), zr.randn(4, 7):cuda()
      e:backward((e(x) - y):square():mean())
      e:step()
      if t == 6 and from == 0 then e:save_checkpoint(dir, "t6") end -- a boundary, an update pending
    end
    local out = {}
    for i, p in ipairs(e:parameters()) do out[i] = p:detach():cpu():flat_table() end
    return out
  end
  local function same(got, want, what)
    for i = 1, #want do
      for j = 1, #want[i] do
        if got[i][j] ~= want[i][j] then
          error(("parameter %d element %d: %s %.9g, uninterrupted %.9g"):format(i, j, what, got[i][j], want[i][j]), 0)
        end
      end
    end
  end
  local want = run(engine(), 0, 14)
  local e = engine()
  e:load_checkpoint(dir, "t6")
  same(run(e, 7, 14), want, "resumed")
  os.execute("rm -rf '" .. dir .. "'")
  local eo = engine(true)
  for i, q in ipairs(eo.zenflow.p) do T.eq(q.m:device(), "cpu", "offload: parameter " .. i .. "'s moments on the host") end
  same(run(eo, 0, 14), want, "offload")
  local r = engine(true)
  r:load_checkpoint(dir, "t6")
  same(run(r, 7, 14), want, "offload, resumed")
  os.execute("rm -rf '" .. dir .. "'")
end)

T.done()
