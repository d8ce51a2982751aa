-- Packed sequences: rows that hold several sequences one after another, told apart by their
-- position_ids, as transformers reads a padding-free batch (TRL's packing = true with "bfd", or
-- padding_free = true): where a row's position does not go up by one from the token before, a new
-- sequence starts (masking_utils.find_packed_sequence_indices, used when no attention_mask is
-- passed), and attention stays inside each sequence. zrun runs the attention sequence by
-- sequence: the batch's tokens seen as one row (1, B·T, ...), split at the sequences' edges
-- (zr.split: one gradient buffer in backward), each part through the model's usual attention op
-- with its own positions, and the parts joined again. Everything else in a layer is per token.
local zr = require "zrun"

local M = {}

-- The sequences of position_ids (B, T) integers: a list of {len =, p0 =} over the B·T tokens in
-- order (p0: the first token's position), with .max_position, or nil when each row is one sequence
-- from position 0 (the plain batch: nothing to split).
function M.segments(position_ids, B, T)
  if position_ids:dim() ~= 2 or position_ids:size(1) ~= B or position_ids:size(2) ~= T then
    error(("position_ids must be (batch, seq_len) = (%d, %d) as input_ids, got %s"):format(B, T,
      table.concat(position_ids:shape(), " x ")), 0)
  end
  local p = position_ids:flat_table()
  local segs, maxp, plain = {}, 0, true
  local cur
  for i = 1, B * T do
    local v = p[i]
    if v < 0 or v ~= math.floor(v) then error(("position_ids: %s at token %d is not a position"):format(tostring(v), i), 0) end
    if v > maxp then maxp = v end
    if cur and (i - 1) % T ~= 0 and v == p[i - 1] + 1 then
      cur.len = cur.len + 1
    else
      cur = { len = 1, p0 = v }
      segs[#segs + 1] = cur
      if (i - 1) % T ~= 0 or v ~= 0 then plain = false end
    end
  end
  if plain then return nil end
  segs.max_position = maxp
  return segs
end

-- fn(parts, seg) over each sequence: xs, a list of (B, T, ...) tensors, are seen as (1, B·T, ...)
-- and split at the sequences' edges; fn gets the sequence's (1, len, ...) part of each and returns
-- its (1, len, W) result; the results joined are returned as (B, T, W).
function M.per_segment(xs, segs, fn)
  local B, T = xs[1]:size(1), xs[1]:size(2)
  local lens = {}
  for i, s in ipairs(segs) do lens[i] = s.len end
  local split = {}
  for k, x in ipairs(xs) do
    local shape = x:shape()
    table.remove(shape, 1)
    shape[1] = B * T
    split[k] = zr.split(x:reshape(1, unpack(shape)), lens, 2)
  end
  local outs = {}
  for i, s in ipairs(segs) do
    local parts = {}
    for k = 1, #xs do parts[k] = split[k][i] end
    outs[i] = fn(parts, s)
  end
  local y = #outs == 1 and outs[1] or zr.cat(outs, 2)
  return y:view(B, T, y:size(3))
end

return M
