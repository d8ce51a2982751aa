-- Reductions on CUDA vs the CPU: sum, mean, max (values, indices with ties and NaN, backward)
-- over dims.
local C = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "cuda_common.lua")
if C.skip_without_gpu("reduce") then return end
local abs, max = math.abs, math.max
local zr, T, close, randn = C.zr, C.T, C.close, C.randn

T.test("reductions: sum, mean, max (values, indices, backward) over dims", function()
  local cases = {
    { { 1 }, nil }, { { 7 }, nil }, { { 127 }, nil }, { { 1000003 }, nil }, { { 1000003 }, { 1 } },
    { { 37, 129 }, { 2 } }, { { 37, 129 }, { 1 } }, { { 37, 129 }, { 1, 2 } }, { { 5, 7, 11 }, { 1, 3 } },
    { { 3, 5000 }, { 2 } }, { { 2000, 3 }, { 2 } }, { { 600, 1500 }, { 2 } }, { { 4, 300000 }, { 2 } },
  }
  for _, dt in ipairs { "f32", "bf16", "f16" } do
    for _, cs in ipairs(cases) do
      local x0 = randn(cs[1]):to(dt)
      local what = ("%s dims %s"):format(table.concat(cs[1], ","), cs[2] and table.concat(cs[2], ",") or "all")
      for _, kind in ipairs { "sum", "mean", "max" } do
        local function run(x)
          x = x:detach(); x.requires_grad = true
          local y, idx
          if kind == "max" and cs[2] and #cs[2] == 1 then y, idx = x:max(cs[2][1], true)
          elseif kind == "max" then y = cs[2] and x:max(cs[2]) or x:max()
          else y = x[kind](x, cs[2], true) end
          local w = zr.ones(y:shape(), { dtype = dt, device = y:device() }) * 0.5
          ;(y * w):sum():backward()
          return y, x.grad, idx
        end
        local yc, gc, ic = run(x0)
        local yg, gg, ig = run(x0:cuda())
        -- sums of many f32 terms: the CPU sums blocks in f32, the GPU in f64
        local slack = kind == "max" and 1 or 1 + math.sqrt(x0:numel()) / 50
        -- a sum that cancels is judged against the size of its terms, not of its result
        local per_out = x0:to("f64"):abs():sum():item() / yc:numel()
        local fl = kind == "sum" and per_out or kind == "mean" and per_out * yc:numel() / x0:numel() or nil
        close(yg:cpu(), yc, dt, kind .. " " .. what, slack, fl)
        close(gg:cpu(), gc, dt, kind .. " grad " .. what)
        if ic then close(ig:cpu(), ic, "f64", "argmax " .. what) end
      end
    end
  end
  -- max lets NaN win and takes the first of equal maxima, like the CPU
  local t = zr.tensor({ { 1, 5, 5, 2 }, { 0 / 0, 1, 9, 0 / 0 }, { 3, 3, 3, 3 } })
  local vc, ic = t:max(2)
  local vg, ig = t:cuda():max(2)
  close(vg:cpu(), vc, "f32", "max with NaN")
  close(ig:cpu(), ic, "f64", "argmax with ties and NaN")
end)

T.done()
