-- Packed sequences: rows that hold several sequences one after another, told apart by their
-- position_ids, as transformers reads a padding-free batch (TRL's packing = true with "bfd", or
-- padding_free = true): where a row's position does not go up by one from the token before, a new
-- sequence starts (masking_utils.find_packed_sequence_indices, used when no attention_mask is
-- passed), and attention stays inside each sequence. Everything else in a layer is per token.
-- Where the attention op takes the sequences' bounds (zr.sdpa_segments_ok: the CPU, CUDA's flash
-- kernels in 16 bits at head_dim 64, 128, 256 or a multiple of 8 between 64 and 128) zrun runs it once over the batch's rows joined into one
-- (1, B·T) row, each query masked to its own sequence's keys (the segments), the rope tables gathered
-- per token: no gathers. Elsewhere (CUDA f32, other head_dims) it runs the attention over groups of
-- sequences of about one length: each group gathered into
-- a (sequences, longest, ...) batch, right-padded (zr.embedding as a row gather: its backward adds
-- the gradients back), through the model's usual causal attention op, and the real rows gathered
-- back in token order. Causal attention never lets a real token see the padding after it, and the
-- padding's rows (copies of token 0, their outputs dropped) get zero gradient, so the result is
-- each sequence's own, with one attention launch per group instead of one per sequence.
local zr = require "zrun"

local M = {}

-- false: the grouped path everywhere (the tests run both paths); true: the segments where they run.
M.use_segments = true

-- Whether a model's attention over dtype, head_dim on device runs on the segments (M.segments' flat).
function M.flat_ok(device, dtype, head_dim)
  return M.use_segments and zr.sdpa_segments_ok(device, dtype, head_dim)
end

-- Groups of sequences, built once per forward: longest first, a sequence joins the group while
-- its 64-row tiles are at least 3/4 of the group's (every sequence of one tile joins the first such
-- group); a sequence not starting at position 0 goes alone (its own rope positions).
local TILE = 64
local function tiles(n) return math.ceil(n / TILE) end
local function grouping(segs, device)
  local order, start, at = {}, {}, 0
  for i, s in ipairs(segs) do order[i], start[i], at = i, at, at + s.len end
  table.sort(order, function(a, b)
    if segs[a].len ~= segs[b].len then return segs[a].len > segs[b].len end
    return a < b
  end)
  local groups, cur = {}, nil
  for _, i in ipairs(order) do
    local s = segs[i]
    if s.p0 ~= 0 or not cur or tiles(s.len) * 4 < tiles(cur.T) * 3 then
      cur = { T = s.len, p0 = s.p0, members = {} }
      groups[#groups + 1] = cur
    end
    cur.members[#cur.members + 1] = i
    if s.p0 ~= 0 then cur = nil end
  end
  -- the gather indices (0-based token rows; padding reads token 0) and each token's row in the groups' outputs
  local inv, row = {}, 0
  for _, g in ipairs(groups) do
    local idx = {}
    for b, i in ipairs(g.members) do
      local r = {}
      for t = 1, g.T do r[t] = t <= segs[i].len and start[i] + t - 1 or 0 end
      idx[b] = r
      for t = 1, segs[i].len do inv[start[i] + t] = row + (b - 1) * g.T + t - 1 end
    end
    -- (kept until the graph that reads them is gone: not a temporary of the forward or checkpoint that made them)
    g.idx = zr.persist(zr.tensor(idx, { dtype = "i64" }):to(device))
    row = row + #g.members * g.T
  end
  segs.groups, segs.inv = groups, zr.persist(zr.tensor(inv, { dtype = "i64" }):to(device))
end

-- The sequences of position_ids (B, T) integers: a list of {len =, p0 =} over the B·T tokens in
-- order (p0: the first token's position), with .max_position, .table_length and either (flat) .seg, the
-- segments of the rows joined into one (1, B·T) row for the attention ops' {segments =} (i32 (2, 1, B·T)
-- on device: each token's first token and one past its last, a new sequence at each row's start), or
-- the groups M.attend runs (their indices on device); nil when each row is one sequence from position 0
-- (the plain batch) and no window masks a key.
-- window (optional): {size = W, full = true when some layers attend without it}, the model's sliding
-- window (transformers' sliding_window: query t sees keys t - W + 1 .. t of its sequence). Where it masks
-- a key (a sequence longer than W) the batch takes the flat path, plain rows too (position_ids nil: each
-- row 0 .. T - 1; .plain is true then): .seg holds the windowed segments (as zr.sdpa_window_segments
-- makes them), and with window.full the layers that attend fully read .full_seg; .window is W then. Plain rows
-- whose attention does not take the flat path get .rows instead, each row's windowed segments (2, B, T) on device
-- (the layers without the window attend causally). The grouped path has no window: an error says where it runs.
function M.segments(position_ids, B, T, device, flat, window)
  local p
  if position_ids == nil then
    p = {}
    for i = 1, B * T do p[i] = (i - 1) % T end
  elseif position_ids:dim() ~= 2 or position_ids:size(1) ~= B or position_ids:size(2) ~= T then
    error(("position_ids must be (batch, seq_len) = (%d, %d) as input_ids, got %s"):format(B, T,
      table.concat(position_ids:shape(), " x ")), 0)
  else
    p = (position_ids:device() == "cpu" and position_ids or position_ids:to("cpu")):flat_table() -- (read on the host)
  end
  local segs, maxp, plain = {}, 0, true
  local cur
  for i = 1, B * T do
    local v = p[i]
    if v < 0 or v ~= math.floor(v) then
      error(("position_ids: %s at token %d is not a position"):format(tostring(v), i), 0)
    end
    if v > maxp then maxp = v end
    if cur and (i - 1) % T ~= 0 and v == p[i - 1] + 1 then
      cur.len = cur.len + 1
    else
      cur = { len = 1, p0 = v }
      segs[#segs + 1] = cur
      if (i - 1) % T ~= 0 or v ~= 0 then plain = false end
    end
  end
  local longest = 0
  for _, sq in ipairs(segs) do if sq.len > longest then longest = sq.len end end
  local W = window and longest > window.size and window.size or nil
  if plain and not W then return nil end
  -- rope tables hold this many positions (a power of two: a table's rows do not depend on its length, and the
  -- model caches one per length; padding-free rows of every length would otherwise each add one)
  segs.max_position, segs.table_length = maxp, 2 ^ math.ceil(math.log(maxp + 1) / math.log(2) - 1e-9)
  if W and not flat and plain then
    -- plain rows where the attention runs a composition (CUDA f32, head_dims the flash kernels do not take): each
    -- row's own windowed segments, (2, B, T), which zr.scaled_dot_product_attention masks by (.rows)
    segs.window, segs.plain = W, true
    segs.rows = zr.sdpa_window_segments(B, T, W):to(device or "cpu")
    return segs
  elseif W and not flat then
    error(("sliding_window %d masks keys of a sequence of %d tokens in a batch of packed sequences, which zrun's " ..
      "attention windows only where it joins them into one row: the CPU, or CUDA in bf16/f16 at head_dim 64, 128, 256 " ..
      "or a multiple of 8 between 64 and 128 (zr.sdpa_segments_ok); train there, without packing, or on sequences of at most %d " ..
      "tokens"):format(W, longest, W), 0)
  end
  if flat then
    -- (each a temporary of the model's forward, which the attention's nodes keep; with checkpointing the
    -- model persists it, for the layers' recomputation)
    local function upload(sg) return zr.tensor(sg, { dtype = "i32" }):view(2, 1, B * T):to(device or "cpu") end
    local N, at = B * T, 0
    local sg, wg = {}, W and {}
    for _, s in ipairs(segs) do
      for t = at + 1, at + s.len do
        sg[t], sg[N + t] = at, at + s.len
        -- the window (zr.sdpa_window_segments' rule): keys t - W + 1 .. t, queries t .. t + W - 1, in the sequence
        if W then wg[t], wg[N + t] = math.max(at, t - W), math.min(at + s.len, t - 1 + W) end
      end
      at = at + s.len
    end
    if W then
      segs.window, segs.plain = W, plain
      if window.full then segs.full_seg = upload(sg) end
      segs.seg = upload(wg)
    else
      segs.seg = upload(sg)
    end
  else
    grouping(segs, device or "cpu")
  end
  return segs
end

-- A right-padded batch (input_ids, labels, attention_mask (B, T) on the host; padding only after a row's
-- tokens) as the padding-free batch of its rows: their tokens joined into one (1, N) row, position_ids
-- counting from 0 in each, the label of each row's first token -100 (never scored in its row, and it would
-- be the previous row's last token's target). Causal attention never lets a token see the padding after
-- it, and every other op of a layer is per token, so each row's outputs are the padded batch's; the
-- padding's tokens are not computed. nil (run it padded) where nothing is padding, where a row is all
-- padding, or where a padded position has a label other than -100 (the padded batch scores it).
-- Returns {input_ids =, labels =, position_ids =} (i64, on the host) and a function mapping another (B, T)
-- labels tensor of the batch the same way (the statistics' labels).
function M.unpad(batch)
  local m = batch.attention_mask
  if not m or batch.position_ids or m:dim() ~= 2 or m:device() ~= "cpu" then return nil end
  local B, T = m:size(1), m:size(2)
  local mf, lens, N = m:flat_table(), {}, 0
  for b = 1, B do
    local n = 0
    for t = (b - 1) * T + 1, b * T do if mf[t] ~= 0 then n = n + 1 end end
    if n == 0 then return nil end
    lens[b], N = n, N + n
  end
  if N == B * T then return nil end
  local lf = batch.labels:flat_table()
  for k = 1, B * T do if mf[k] == 0 and lf[k] ~= -100 then return nil end end
  local function gather(f, first)
    local out, k = {}, 0
    for b = 1, B do
      for t = 1, lens[b] do
        k = k + 1
        out[k] = first and t == 1 and first or f[(b - 1) * T + t]
      end
    end
    return zr.tensor({ out }, { dtype = "i64" })
  end
  local pos, k = {}, 0
  for b = 1, B do for t = 1, lens[b] do k = k + 1; pos[k] = t - 1 end end
  return { input_ids = gather(batch.input_ids:flat_table()), labels = gather(lf, -100),
    position_ids = zr.tensor({ pos }, { dtype = "i64" }) }, function(x) return gather(x:flat_table(), -100) end
end

-- fn(parts, group) over each group of sequences: xs, a list of (B, T, W_k) tensors, are gathered
-- into the group's (n, group.T, W_k) parts; fn returns the group's (n, group.T, W) result, its
-- sequences starting at position group.p0; the results' real rows come back as (B, T, W).
function M.attend(xs, segs, fn)
  local B, T = xs[1]:size(1), xs[1]:size(2)
  local outs = {}
  for k, g in ipairs(segs.groups) do
    local parts = {}
    for j, x in ipairs(xs) do parts[j] = zr.embedding(x:reshape(B * T, x:size(3)), g.idx) end
    local y = fn(parts, g)
    outs[k] = y:reshape(y:size(1) * y:size(2), y:size(3))
  end
  local all = #outs == 1 and outs[1] or zr.cat(outs, 1)
  local y = zr.embedding(all, segs.inv)
  return y:view(B, T, y:size(2))
end

return M
