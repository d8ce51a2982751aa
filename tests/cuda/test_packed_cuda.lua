-- Packed sequences on a GPU (tests/lua/test_packed.lua's checks): each sequence's logits and gradients
-- as when run alone, in f32 (the attention's f32 path: the groups) and bf16 (head_dim 64: the Hopper
-- kernels, on the segments where zr.sdpa_segments_ok, and on the groups), and SFTTrainer with bfd
-- packing learning in bf16. Prints SKIP without a GPU.
local C = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "../ops/cuda_common.lua")
if C.skip_without_gpu("packed sequences on CUDA") then return end
local here = (debug.getinfo(1, "S").source:match("^@(.*/)") or "./")
for _, dt in ipairs { "f32", "bf16" } do
  PACKED_DEVICE, PACKED_DTYPE = "cuda", dt
  print("-- packed sequences, cuda " .. dt)
  dofile(here .. "../lua/test_packed.lua")
end
