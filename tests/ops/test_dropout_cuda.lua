-- dropout on CUDA vs the CPU: the same seed gives the same mask on both devices.
local C = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "cuda_common.lua")
if C.skip_without_gpu("dropout") then return end
local zr, T, close, randn, both = C.zr, C.T, C.close, C.randn, C.both

T.test("dropout: same seed, same mask on both devices", function()
  for _, dt in ipairs { "f32", "bf16" } do
    local x = randn({ 127, 33 })
    local function run(dev)
      zr.manual_seed(5)
      local t = x:to(dt):to(dev):detach(); t.requires_grad = true
      local y = zr.dropout(t, 0.3, true)
      ;(y:float() * 2):sum():backward()
      return y, t.grad
    end
    local yc, gc = run("cpu")
    local yg, gg = run("cuda")
    close(yg:cpu(), yc, dt, "dropout forward")
    close(gg:cpu(), gc, dt, "dropout backward")
  end
end)

T.done()
