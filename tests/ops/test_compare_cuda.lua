-- where, masked_fill and the comparisons on CUDA vs the CPU (broadcast, scalars, bf16, i64).
local C = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "cuda_common.lua")
if C.skip_without_gpu("compare") then return end
local zr, T, close, randn, both = C.zr, C.T, C.close, C.randn, C.both

T.test("where, masked_fill and comparisons on CUDA vs CPU", function()
  local a0, b0 = randn({ 7, 13 }), randn({ 13 })
  local m = zr.gt(a0, 0)
  both("where", "f32", { m, a0, b0 }, function(c, a, b) return zr.where(c, a, b) end)
  both("masked_fill", "bf16", { randn({ 5, 7 }), zr.gt(randn({ 7 }), 0) },
    function(x, mk) return zr.masked_fill(x, mk, -1e4) end)
  local ints = (zr.rand({ 9 }) * 5):to("i64")
  both("where on i64", "f32", { zr.gt(randn({ 9 }), 0), ints, zr.full({ 9 }, 7, { dtype = "i64" }) },
    function(c, a, b) return zr.where(c, a, b) end)
  for _, op in ipairs { "eq", "ne", "lt", "le", "gt", "ge" } do
    local a = (zr.rand({ 31, 7 }) * 4):to("i32"):to("f32")
    local b = (zr.rand({ 7 }) * 4):to("i32"):to("f32")
    close(zr[op](a:cuda(), b:cuda()):cpu(), zr[op](a, b), "f64", op .. " broadcast")
    close(zr[op](a:to("bf16"):cuda(), 2):cpu(), zr[op](a:to("bf16"), 2), "f64", op .. " scalar bf16")
    close(zr[op](ints:cuda(), 2):cpu(), zr[op](ints, 2), "f64", op .. " i64 vs scalar")
  end
  close(zr.logical_not(m:cuda()):cpu(), zr.logical_not(m), "f64", "logical_not")
end)

T.done()
