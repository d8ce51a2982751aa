-- The attention tests' segments from each row's sequence lengths: seg (2, B, T) i32 on the CPU, lo then hi of
-- each token's sequence (its first token, one past its last), and the sequences {b =, s =, n =} (1-based row,
-- 0-based start). rows: a list per row of lengths adding up to Tn.
--   local make_seg = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "segments_of.lua")
local zr = require "zrun"
return function(rows, Tn)
  local B, flat, seqs = #rows, {}, {}
  for b, lens in ipairs(rows) do
    local at = 0
    for _, n in ipairs(lens) do
      for t = at, at + n - 1 do flat[(b - 1) * Tn + t + 1], flat[B * Tn + (b - 1) * Tn + t + 1] = at, at + n end
      seqs[#seqs + 1] = { b = b, s = at, n = n }
      at = at + n
    end
    assert(at == Tn, "a row's lengths add up to T")
  end
  return zr.tensor(flat, { dtype = "i32" }):view(2, B, Tn), seqs
end
