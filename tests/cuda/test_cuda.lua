-- The CUDA backend beyond single ops, on a GPU machine: `./zrun tests/cuda/test_cuda.lua`. Device
-- round trips, casts, copies and fills; same-seed random numbers on both devices; the tiny Llama
-- and GPT-2 golden files (f32 and bf16); NCCL collectives; ZeRO stages 0-3 vs the CPU run; errors
-- for mixed devices and out-of-memory; the caching allocator. Every op against its CPU twin is
-- tests/ops/test_<op>_cuda.lua. Prints SKIP without a GPU.
local C = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "../ops/cuda_common.lua")
if C.skip_without_gpu("cuda") then return end
local abs = math.abs
local zr, T, close, randn, both, SIZES = C.zr, C.T, C.close, C.randn, C.both, C.SIZES

T.test("device basics and round trips for every dtype", function()
  for _, dt in ipairs { "f32", "bf16", "f16", "f64", "i32", "i64", "u8" } do
    for _, n in ipairs(SIZES) do
      local c = (zr.rand({ n }) * 200 - 100):to(dt)
      local g = c:cuda()
      T.eq(g:device(), "cuda:0", "device")
      T.eq(g:dtype(), dt, "dtype")
      local back = g:cpu()
      T.eq(back:device(), "cpu")
      close(back, c, "f64", "round trip " .. dt .. " n=" .. n)
    end
  end
end)

T.test("host <-> device copies of contiguous views at an offset (one transfer, no staging)", function()
  for _, dt in ipairs { "f32", "bf16", "i64" } do
    local h = (zr.rand({ 9, 31 }) * 100):to(dt)
    local rows = h:narrow(1, 4, 3) -- contiguous, 93 elements in
    local g = zr.zeros({ 9, 31 }, { device = "cuda", dtype = dt })
    g:narrow(1, 2, 3):copy_(rows)
    local back = g:cpu()
    close(back:narrow(1, 2, 3), rows, "f64", "upload into rows 2-4 " .. dt)
    close(back:narrow(1, 5, 5), zr.zeros({ 5, 31 }):to(dt), "f64", "rows after untouched " .. dt)
    local d = zr.zeros({ 9, 31 }):to(dt)
    d:narrow(1, 7, 3):copy_(g:narrow(1, 2, 3))
    close(d:narrow(1, 7, 3), rows, "f64", "download into rows 7-9 " .. dt)
    close(d:narrow(1, 1, 6), zr.zeros({ 6, 31 }):to(dt), "f64", "rows before untouched " .. dt)
  end
end)

T.test("casts on the device match the CPU casts (all pairs, strided, broadcast)", function()
  local dts = { "f32", "bf16", "f16", "f64", "i32", "i64", "u8" }
  local src = zr.rand({ 127, 9 }) * 250 -- in range for every dtype (u8 included): no UB casts
  for _, s in ipairs(dts) do
    local cs = src:to(s)
    local gs = cs:cuda()
    for _, d in ipairs(dts) do
      close(gs:to(d):cpu(), cs:to(d), "f64", ("cast %s->%s"):format(s, d))
      -- strided source (transpose) into a contiguous destination, with a cast
      close(gs:transpose(1, 2):contiguous():to(d):cpu(), cs:transpose(1, 2):contiguous():to(d), "f64",
        ("transposed cast %s->%s"):format(s, d))
    end
  end
  -- broadcast copy (expand) and copy into a strided view
  local row = randn({ 1, 13 })
  local g = zr.zeros({ 7, 13 }, { device = "cuda" })
  g:copy_(row:cuda():expand(7, 13))
  close(g:cpu(), row:expand(7, 13):contiguous(), "f32", "expand copy")
  local big = zr.zeros({ 11, 17 }, { device = "cuda", dtype = "bf16" })
  local part = big:narrow(2, 3, 5)
  local src2 = randn({ 11, 5 })
  part:copy_(src2:cuda())
  close(big:cpu():narrow(2, 3, 5), src2:to("bf16"), "f64", "copy into narrowed view")
  close(big:cpu():narrow(2, 1, 2), zr.zeros({ 11, 2 }), "f64", "untouched columns")
  -- numbers too large for f16 become inf on both sides; i64 beyond 2^31 survive
  local huge = zr.tensor({ 1e6, -7e4, 3, 65504 })
  close(huge:cuda():to("f16"):cpu(), huge:to("f16"), "f64", "f16 overflow")
  local l = zr.tensor({ 3e9, -5e9, 1 }, { dtype = "i64" })
  close(l:cuda():to("f64"):cpu(), l:to("f64"), "f64", "i64 > 2^31")
end)

T.test("transposing copies (tiled path), with and without a cast", function()
  for _, dt in ipairs { "f32", "bf16", "i64", "u8" } do
    local x = (zr.rand({ 3, 70, 45 }) * 100):to(dt)
    local g = x:cuda()
    close(g:permute(1, 3, 2):contiguous():cpu(), x:permute(1, 3, 2):contiguous(), "f64", "3-D transpose " .. dt)
    close(g:permute(3, 2, 1):contiguous():cpu(), x:permute(3, 2, 1):contiguous(), "f64", "permute 3,2,1 " .. dt)
    close(g:select(1, 2):transpose(1, 2):to("f32"):cpu(), x:select(1, 2):transpose(1, 2):to("f32"), "f64",
      "2-D transpose with cast " .. dt)
  end
end)

T.test("permuting copies with a contiguous last dim (row path), with and without a cast", function()
  for _, dt in ipairs { "f32", "bf16", "f16", "i64" } do
    for _, sh in ipairs { { 2, 3, 5, 64 }, { 3, 7, 11, 16 }, { 1, 4, 9, 24 }, { 2, 2, 3, 10 } } do
      local x = (zr.rand(sh) * 100):to(dt)
      local g = x:cuda()
      local what = ("%s %dx%dx%dx%d"):format(dt, sh[1], sh[2], sh[3], sh[4])
      close(g:transpose(2, 3):contiguous():cpu(), x:transpose(2, 3):contiguous(), "f64", "(B,H,T,D) -> (B,T,H,D) " .. what)
      close(g:permute(3, 1, 2, 4):contiguous():cpu(), x:permute(3, 1, 2, 4):contiguous(), "f64", "permute 3,1,2,4 " .. what)
      close(g:transpose(2, 3):to("f32"):cpu(), x:transpose(2, 3):to("f32"), "f64", "permute + cast to f32 " .. what)
      close(g:narrow(4, 2, sh[4] - 1):contiguous():cpu(), x:narrow(4, 2, sh[4] - 1):contiguous(), "f64", "unaligned rows " .. what)
      local d = zr.zeros({ sh[1], sh[3], sh[2], sh[4] }, { dtype = dt, device = "cuda" })
      d:transpose(2, 3):copy_(g) -- strided destination
      close(d:cpu(), x:transpose(2, 3):contiguous(), "f64", "into a permuted destination " .. what)
    end
  end
end)

T.test("fills: zeros, ones, full, fill_ on strided views", function()
  for _, dt in ipairs { "f32", "bf16", "f16", "f64", "i32", "i64", "u8" } do
    local o = zr.ones({ 1000003 }, { device = "cuda", dtype = dt })
    T.eq(o:to("f64"):sum():item(), 1000003, "ones sum " .. dt)
    local f = zr.full({ 5, 7 }, 3.3, { device = "cuda", dtype = dt })
    close(f:cpu(), zr.full({ 5, 7 }, 3.3, { dtype = dt }), "f64", "full " .. dt)
  end
  local g = zr.zeros({ 9, 8 }, { device = "cuda" })
  g:transpose(1, 2):narrow(1, 2, 3):fill_(-1.5)
  local c = zr.zeros({ 9, 8 })
  c:transpose(1, 2):narrow(1, 2, 3):fill_(-1.5)
  close(g:cpu(), c, "f32", "fill_ through a transposed narrow")
  local u = zr.zeros({ 1001 }, { device = "cuda", dtype = "bf16" })
  u:narrow(1, 2, 999):fill_(2) -- contiguous but not 16-byte aligned
  T.eq(u:to("f64"):sum():item(), 1998, "unaligned fill")
  T.eq(u[1], 0, "element before the view")
end)

T.test("same seed gives the same random numbers on CPU and GPU", function()
  for _, dt in ipairs { "f32", "bf16", "f64", "f16" } do
    for _, n in ipairs { 1, 7, 127, 1000003 } do
      zr.manual_seed(1234)
      local c1, c2, c3 = zr.randn({ n }, { dtype = dt }), zr.rand({ n }, { dtype = dt }), zr.randn({ 3 }, { dtype = dt })
      zr.manual_seed(1234)
      local g1 = zr.randn({ n }, { dtype = dt, device = "cuda" })
      local g2 = zr.rand({ n }, { dtype = dt, device = "cuda" })
      local g3 = zr.randn({ 3 }, { dtype = dt, device = "cuda" })
      close(g2:cpu(), c2, "f64", "rand " .. dt .. " n=" .. n) -- uniform: exact
      -- normal: libm vs CUDA log/sin/cos may differ in the last bit of the double
      local tol = dt == "f64" and "f64" or "f32"
      close(g1:cpu(), c1, tol, "randn " .. dt .. " n=" .. n, 10)
      close(g3:cpu(), c3, tol, "randn after offsets advance " .. dt, 10)
    end
  end
  -- uniform_/normal_ on a non-contiguous GPU view
  zr.manual_seed(7)
  local c = zr.zeros({ 6, 5 }); c:transpose(1, 2):normal_(2, 3)
  zr.manual_seed(7)
  local g = zr.zeros({ 6, 5 }, { device = "cuda" }); g:transpose(1, 2):normal_(2, 3)
  close(g:cpu(), c, "f32", "normal_ on a transposed view", 10)
end)

-- Golden tiny Llama (transformers, f32) on the GPU: f32 to near-fp32 tolerance (every gradient),
-- and bf16 against the same f32 golden values with a bf16 tolerance.
-- GPT-2 (vocabulary 257) runs its head on a padded, -1e30-biased copy on the GPU. Mistral (head_dim
-- 12, rows as long as its sliding_window) and Qwen2 (q/k/v biases in the fused product) as Llama; Qwen3 (q_norm /
-- k_norm between the one q/k/v product's views and the rope: the unfused path; qwen3_bias with biases on q/k/v/o,
-- untied, rows as long as its window) too.
T.test("tiny Llama, Mistral, Qwen2, Qwen3, Phi-3 and GPT-2 golden files on CUDA: f32 (logits, loss, grads) and bf16 (logits, loss)", function()
  local cjson = require "cjson"
  for _, m in ipairs { { "tests/golden/llama_tiny.safetensors", zr.models.llama.LlamaForCausalLM },
                       { "tests/golden/mistral_tiny.safetensors", zr.models.mistral.MistralForCausalLM },
                       { "tests/golden/qwen2_tiny.safetensors", zr.models.qwen2.Qwen2ForCausalLM },
                       { "tests/golden/qwen3_tiny.safetensors", zr.models.qwen3.Qwen3ForCausalLM },
                       { "tests/golden/qwen3_bias.safetensors", zr.models.qwen3.Qwen3ForCausalLM },
                       -- Phi-3: fused qkv_proj / gate_up_proj; partial rotary (zr.rope's partial CUDA path) with
                       -- longrope's long factors; the whole head with longrope
                       { "tests/golden/phi3_tiny.safetensors", zr.models.phi3.Phi3ForCausalLM },
                       { "tests/golden/phi3_partial.safetensors", zr.models.phi3.Phi3ForCausalLM },
                       { "tests/golden/phi3_longrope.safetensors", zr.models.phi3.Phi3ForCausalLM },
                       { "tests/golden/gpt2_tiny.safetensors", zr.models.gpt2.GPT2LMHeadModel } } do
  local g, meta = zr.load_safetensors(m[1])
  local cfg = cjson.decode(meta.config)
  for _, dt in ipairs { "f32", "bf16" } do
    local c = {}
    for k, v in pairs(cfg) do c[k] = v end
    c.dtype, c.device = dt, "cuda"
    local model = m[2](c)
    local sd = {}
    for n in model:named_parameters() do sd[n] = g[n] end
    model:load_state_dict(sd, true)
    local out = model(g.input_ids:cuda(), g.labels:cuda())
    T.eq(out.logits:device(), "cuda:0")
    local logits = out.logits:float():cpu()
    if dt == "f32" then
      T.near(logits, g.logits, 1e-4, 1e-4, "f32 logits on cuda")
      T.near(out.loss:cpu(), g.loss, 1e-5, 1e-5, "f32 loss on cuda")
      out.loss:backward()
      for n, p in model:named_parameters() do
        T.near(p.grad:cpu(), g["grad." .. n], 1e-4, 1e-3, "f32 grad on cuda of " .. n)
      end
    else
      close(logits, g.logits, "bf16", "bf16 logits on cuda vs f32 golden", 2)
      local l, want = out.loss:float():item(), g.loss:item()
      assert(math.abs(l - want) <= 2e-2 * math.abs(want), ("bf16 loss %.6f vs golden %.6f"):format(l, want))
      out.loss:backward()
      for n, p in model:named_parameters() do assert(p.grad and p.grad:device() == "cuda:0", "bf16 grad of " .. n) end
    end
  end
  end

-- pad_token_id is the embedding's padding_idx (transformers' nn.Embedding(..., pad_token_id)), on
-- the GPU as on the CPU: the pad row's gradient exactly 0 (f32 and bf16: the mask is eq + where on
-- the ids), the other rows' and the loss as the CPU's run of the same weights.
T.test("Llama pad_token_id on CUDA: the pad row gets no gradient from the lookup; loss and grads as the CPU's", function()
  local base = { hidden_size = 32, intermediate_size = 64, num_hidden_layers = 2, num_attention_heads = 4,
    vocab_size = 50, pad_token_id = 3, initializer_range = 0.3 }
  zr.manual_seed(21)
  local ref = zr.models.llama.LlamaForCausalLM(base)
  local sd = ref:state_dict()
  local ids = (zr.rand({ 2, 12 }) * 49):to("i64")
  ids:narrow(2, 3, 2):fill_(3)
  local out = ref(ids, ids)
  out.loss:backward()
  local want = ref.model.embed_tokens.weight.grad
  T.eq(want:narrow(1, 4, 1):abs():sum():item(), 0, "cpu pad row")
  for _, dt in ipairs { "f32", "bf16" } do
    local c = {}
    for k, v in pairs(base) do c[k] = v end
    c.dtype, c.device = dt, "cuda"
    local m = zr.models.llama.LlamaForCausalLM(c)
    m:load_state_dict(sd, true)
    local o = m(ids:cuda(), ids:cuda())
    o.loss:backward()
    local g = m.model.embed_tokens.weight.grad:float():cpu()
    T.eq(g:narrow(1, 4, 1):abs():sum():item(), 0, dt .. " pad row on cuda")
    if dt == "f32" then
      T.near(o.loss:cpu(), out.loss, 1e-5, 1e-5, "f32 loss on cuda")
      T.near(g, want, 1e-4, 1e-3, "f32 embedding grad on cuda")
    else
      close(o.loss:float():cpu(), out.loss, "bf16", "bf16 loss on cuda", 2)
      close(g, want, "bf16", "bf16 embedding grad on cuda", 4)
    end
  end
end)
end)

T.test("NCCL async collectives (world size 1): the compute stream waits for the result", function()
  local dist = zr.dist
  for _, dt in ipairs { "f32", "bf16" } do
    local src = randn({ 3000017 }):to(dt)
    local t, out = src:cuda(), zr.zeros({ 3000017 }, { dtype = dt, device = "cuda" })
    local h1 = dist.all_reduce(t, "avg", { async_op = true })
    local h2 = dist.all_gather(out, src:cuda() * 2, { async_op = true }) -- its input is only held by the handle
    collectgarbage(); collectgarbage()
    local filler = randn({ 4096, 4096 }):cuda()
    for _ = 1, 3 do filler = filler * 1.0001 end -- compute queued while the collectives run
    h1:wait(); h2:wait()
    local y = out * 0.5 -- ordered after the all-gather by the wait
    close(t:cpu(), src, dt, "async all_reduce avg " .. dt)
    close(y:cpu(), src, dt, "async all_gather " .. dt)
    local shard = zr.zeros({ 3000017 }, { dtype = dt, device = "cuda" })
    dist.reduce_scatter(shard, src:cuda(), "sum", { async_op = true }):wait()
    close(shard:cpu(), src, dt, "async reduce_scatter " .. dt)
  end
end)

-- ZeRO engine on the GPU (world size 1: NCCL for the collectives) vs the same run on the CPU.
T.test("ZeRO stages 0-3 on CUDA match the CPU run (tiny Llama, 3 steps, clipping; offload, prefetch)", function()
  local cfg = zr.models.llama.config("zrun/tiny-llama")
  local function run(dev, stage, offload, gas, prefetch)
    gas = gas or 1
    zr.manual_seed(1234)
    local c = {}
    for k, v in pairs(cfg) do c[k] = v end
    c.device = dev
    local model = zr.models.llama.LlamaForCausalLM(c)
    local engine = zr.initialize({ model = model, config = {
      train_micro_batch_size_per_gpu = 2, gradient_accumulation_steps = gas, gradient_clipping = 1.0,
      steps_per_print = 1000000,
      optimizer = { type = "AdamW", params = { lr = 1e-3, betas = { 0.9, 0.95 }, eps = 1e-8, weight_decay = 0.1 } },
      zero_optimization = { stage = stage, reduce_bucket_size = 3000, stage3_prefetch_bucket_size = prefetch,
        offload_optimizer = offload and { device = "cpu", pin_memory = true } or nil },
    } })
    local losses = {}
    for s = 1, 3 * gas do
      zr.manual_seed(100 + s)
      local ids = (zr.rand({ 2, 12 }) * 250):to("i64"):to(dev)
      local loss = engine(ids, ids).loss
      losses[s] = loss:item()
      engine:backward(loss)
      engine:step()
    end
    local ps = engine:gather_parameters()
    local w = {}
    for i, p in ipairs(ps) do w[i] = p:cpu():clone() end
    return losses, w
  end
  for _, c in ipairs { { 0 }, { 1 }, { 2 }, { 3 }, { 3, false, 1, 3000 }, { 1, true }, { 2, true, 2 }, { 3, true, 2 } } do
    local stage, offload, gas, prefetch = c[1], c[2], c[3], c[4]
    local what = ("stage %d%s%s%s"):format(stage, offload and " offload (pinned)" or "", gas and (" gas " .. gas) or "",
      prefetch and (" prefetch " .. prefetch) or "")
    local lc, wc = run("cpu", stage, offload, gas, prefetch)
    local lg, wg = run("cuda", stage, offload, gas, prefetch)
    T.near(lg, lc, 1e-4, 1e-4, "losses, " .. what)
    for i = 1, #wc do T.near(wg[i], wc[i], 1e-4, 1e-4, ("%s weights of parameter %d"):format(what, i)) end
  end
end)

-- data_types.grad_accum_dtype in the model's 16-bit dtype (DeepSpeed's default for a bf16 / fp16 model): a 16-bit
-- gradient partition, training close to zrun's default fp32 one. fp16 with a static loss scale (256), so that
-- neither run skips a step and the curves stay comparable (the dynamic scaler next to DeepSpeed's:
-- tests/bench/finetune_vs_hf.sh's fp16 row).
for _, prec in ipairs { { "bf16", "bf16", { enabled = true } }, { "fp16", "f16", { enabled = true, loss_scale = 256 } } } do
  local gad16, dtype, section = prec[1], prec[2], prec[3]
  T.test(("data_types.grad_accum_dtype %s: a %s gradient partition, training close to fp32 (stages 0, 2, 3)"):format(gad16, dtype), function()
    local cfg = zr.models.llama.config("zrun/tiny-llama")
    local function run(gad, stage)
      zr.manual_seed(1234)
      local c = {}
      for k, v in pairs(cfg) do c[k] = v end
      c.device, c.dtype = "cuda", dtype
      local engine = zr.initialize({ model = zr.models.llama.LlamaForCausalLM(c), config = {
        train_micro_batch_size_per_gpu = 2, gradient_accumulation_steps = 2, gradient_clipping = 1.0,
        steps_per_print = 1000000, [gad16] = section, data_types = gad and { grad_accum_dtype = gad } or nil,
        optimizer = { type = "AdamW", params = { lr = 1e-3, betas = { 0.9, 0.95 }, eps = 1e-8, weight_decay = 0.1 } },
        zero_optimization = { stage = stage, reduce_bucket_size = 3000 } } })
      local losses = {}
      zr.manual_seed(101)
      local ids = (zr.rand({ 2, 12 }) * 250):to("i64"):cuda() -- one batch, learnt by heart: the loss must fall
      for s = 1, 6 do -- 6 micro-batches, 3 optimizer steps
        local loss = engine(ids, ids).loss
        losses[s] = loss:float():item()
        engine:backward(loss)
        engine:step()
      end
      T.eq(engine.skipped_steps, 0, ("stage %d, %s gradients: skipped steps"):format(stage, gad or "fp32"))
      local w = {}
      for i, p in ipairs(engine:gather_parameters()) do w[i] = p:float():cpu() end
      return losses, w, engine.zero:state(3):dtype()
    end
    for _, stage in ipairs { 0, 2, 3 } do
      local l32, w32, g32 = run(nil, stage)
      local l16, w16, g16 = run(gad16, stage)
      T.eq(g32, "f32", "stage " .. stage .. ": fp32 partition by default")
      T.eq(g16, dtype, "stage " .. stage .. ": " .. dtype .. " partition")
      assert(l16[6] < l16[1] - 0.3, ("stage %d: the loss did not fall: %g -> %g"):format(stage, l16[1], l16[6]))
      T.near(l16, l32, 2e-2, 2e-2, "stage " .. stage .. " losses")
      for i = 1, #w32 do T.near(w16[i], w32[i], 2e-2, 2e-2, ("stage %d weights of parameter %d"):format(stage, i)) end
    end
  end)
end

T.test("mixing devices names which tensor is where", function()
  local c, g = zr.ones({ 3 }), zr.ones({ 3 }, { device = "cuda" })
  T.raises(function() return c + g end, "input 2 is on cuda:0 but input 1 is on cpu")
  T.raises(function() return g * c end, "input 2 is on cpu but input 1 is on cuda:0")
  T.raises(function() g:add_(c) end, "is on")
  T.raises(function() zr.cuda.set_device(99) end, "cuda:99 is not available")
end)

T.test("out of memory names the device, its free memory and the categories", function()
  local err = T.raises(function() return zr.empty({ 2.5e12 }, { device = "cuda" }) end, "out of memory on cuda:0")
  for _, want in ipairs { "free of", "params", "activations", "reserved" } do
    assert(tostring(err):find(want, 1, true), ("OOM message lacks '%s': %s"):format(want, tostring(err)))
  end
  -- the device still works afterwards
  T.eq(zr.ones({ 5 }, { device = "cuda" }):sum():item(), 5, "after OOM")
end)

T.test("a failed allocation collects Lua's garbage and tries again; held tensors still run out", function()
  collectgarbage(); collectgarbage()
  local s0 = zr.cuda.memory_summary(0)
  local n = math.floor(s0.device_total / 6 / 2) -- bf16 elements: a sixth of the device
  collectgarbage("stop") -- no collection but the allocator's
  local ok, err = pcall(function()
    for _ = 1, 20 do -- over three devices' worth, none kept
      local t = zr.empty({ n }, { device = "cuda", dtype = "bf16" })
    end
  end)
  collectgarbage("restart")
  assert(ok, "unreached tensors made an out-of-memory error: " .. tostring(err))
  local s1 = zr.cuda.memory_summary(0)
  assert(s1.oom_collections >= s0.oom_collections + 2,
    ("collections on failed allocations: %d -> %d"):format(s0.oom_collections, s1.oom_collections))
  local held = {}
  T.raises(function()
    for i = 1, 20 do held[i] = zr.empty({ n }, { device = "cuda", dtype = "bf16" }) end
  end, "out of memory on cuda:0")
  assert(#held >= 1 and #held < 6, "tensors held before the error: " .. #held) -- another process may hold some
  held = nil
  collectgarbage(); collectgarbage()
  zr.cuda.empty_cache()
  T.eq(zr.ones({ 5 }, { device = "cuda" }):sum():item(), 5, "after the error")
end)

T.test("caching allocator: steady state needs no cudaMalloc; empty_cache; summary", function()
  local function step()
    local x = zr.randn({ 3000, 257 }, { device = "cuda" })
    local y = (x:silu() * 2 + x):sum(2)
    local z = zr.randn({ 1000003 }, { device = "cuda", dtype = "bf16" }):exp():mean()
    return y:sum():item() + z:item()
  end
  step(); step()
  collectgarbage(); collectgarbage()
  local s1 = zr.cuda.memory_summary(0)
  for _ = 1, 5 do step(); collectgarbage() end
  local s2 = zr.cuda.memory_summary(0)
  T.eq(s2.n_cuda_malloc, s1.n_cuda_malloc, "cudaMalloc calls in the steady state")
  assert(s2.n_cache_hits > s1.n_cache_hits, "the cache served the repeated allocations")
  assert(s2.reserved >= s2.allocated, "reserved covers allocated")
  local p = zr.zeros({ 1000, 1000 }, { device = "cuda" })
  p:category("params")
  local s3 = zr.cuda.memory_summary(0)
  assert(s3.categories.params.allocated >= 4e6, "params category counts the GPU tensor")
  assert(s3.device_total > 1e9 and s3.device_free > 0, "device memory info")
  p = nil
  local big = zr.empty({ 64 * 2 ^ 20 }, { device = "cuda", dtype = "bf16" }) -- 128 MiB: a segment of its own
  big = nil
  collectgarbage(); collectgarbage()
  local s4 = zr.cuda.memory_summary(0)
  zr.cuda.empty_cache()
  local s5 = zr.cuda.memory_summary(0)
  assert(s5.reserved <= s4.reserved - 128 * 2 ^ 20, ("empty_cache gave back the free segments: reserved %d -> %d")
    :format(s4.reserved, s5.reserved))
  assert(s5.n_cuda_free > s4.n_cuda_free and s5.cached < s4.cached, "empty_cache called cudaFree")
  zr.cuda.synchronize()
end)

-- Unpadded rows: a new token count every micro-batch. Blocks split off the segments the largest
-- micro-batch made serve every smaller one (a cache of whole blocks would cudaMalloc for each new
-- size), and the bytes a step wrote are intact (no block overlaps another). The token counts stay
-- above 1024 so that no tensor of the step crosses 1 MiB: requests up to 1 MiB are served from
-- their own 2 MiB segments (PyTorch's small pool), and a t x 512 tensor moving there would take
-- new ones (the block pool's model, and the H100: 2 more cudaMalloc with t in 300..4000).
T.test("caching allocator: varying token counts after the largest need no cudaMalloc", function()
  local function step(t)
    local acts = {}
    for i = 1, 8 do
      local width = ({ 2048, 8192, 512, 1 })[(i - 1) % 4 + 1]
      acts[i] = zr.full({ t, width }, i, { device = "cuda", dtype = "bf16" })
    end
    for i = 1, 8 do
      local lo, hi = -(-acts[i]):max():item(), acts[i]:max():item()
      T.eq(lo .. " " .. hi, i .. " " .. i, ("step of %d tokens, tensor %d's least and greatest"):format(t, i))
    end
  end
  step(4000)
  collectgarbage(); collectgarbage()
  local s1 = zr.cuda.memory_summary(0)
  local t = 3999
  for _ = 1, 20 do
    t = 1100 + (t * 7919) % 2900
    step(t)
    collectgarbage(); collectgarbage()
  end
  local s2 = zr.cuda.memory_summary(0)
  T.eq(s2.n_cuda_malloc, s1.n_cuda_malloc, "cudaMalloc calls after the largest micro-batch")
end)

T.done()
