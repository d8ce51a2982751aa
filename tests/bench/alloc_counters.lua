-- The CUDA caching allocator's counters after a recipe or script has run: how many requests it
-- served from its cache, how many cudaMalloc calls it made, what it reserved against the peak in
-- tensors. Runs SCRIPT with the rest of the command line as its own arguments:
--   zrun tests/bench/alloc_counters.lua recipes/sft_llama.lua --config configs/zero2.json ...
local zr = require "zrun"
local script = arg[1]
if not script then
  io.stderr:write("usage: zrun tests/bench/alloc_counters.lua SCRIPT [ARGS...]\n")
  os.exit(2)
end
local rest = {}
for i = 2, #arg do rest[#rest + 1] = arg[i] end
rest[0] = script
local chunk = assert(loadfile(script))
arg = rest -- the script parses its own command line
chunk(unpack(rest))
local m = zr.cuda.memory_summary()
local h = zr.memory.human
print(("allocator: %d requests, %d from the cache, %d cudaMalloc, %d cudaFree; reserved %s (peak %s), " ..
  "peak in blocks %s, peak in tensors %s"):format(m.n_alloc, m.n_cache_hits, m.n_cuda_malloc, m.n_cuda_free,
  h(m.reserved), h(m.peak_reserved), h(m.peak_blocks), h(m.peak)))
