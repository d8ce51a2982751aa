-- zr.memory.describe(model_or_config): parameters per module (repeated layers folded into one row
-- with a count), totals, and what the weights and training states weigh. Works from a config
-- (nothing allocated) or a live model. Printing only; the numbers come from memory_estimate.lua.
local E = require "zrun.memory_estimate"

local M = {}
local fmt, concat = string.format, table.concat

local function si(n)
  if n >= 1e9 then return fmt("%.2fB", n / 1e9) end
  if n >= 1e6 then return fmt("%.2fM", n / 1e6) end
  if n >= 1e3 then return fmt("%.2fK", n / 1e3) end
  return tostring(n)
end

local function commas(n)
  local s = fmt("%d", n)
  local out = s:reverse():gsub("(%d%d%d)", "%1,"):reverse()
  return (out:gsub("^,", ""))
end
M.commas = commas

local gib = require("zrun.format").human

-- Returns {rows = {{module=, shape=, params=, count=, total=}}, total=, largest_layer=, tied=, text=}
-- and prints the table (opts.quiet to not print).
function M.describe(x, opts)
  opts = require("zrun.kwargs").check("memory.describe", opts, { "quiet" })
  local total, largest, list, r = E.count(x)
  local rows, by = {}, {}
  for _, p in ipairs(list) do
    -- fold repeated blocks: model.layers.7.mlp.up_proj -> model.layers.*.mlp.up_proj
    local key = p.module:gsub("%.%d+%.", ".*.", 1):gsub("%.%d+$", ".*")
    local pname = p.name:match("[^.]+$")
    local id = key .. "." .. pname
    local row = by[id]
    if not row then
      row = { module = key, param = pname, shape = "(" .. concat(p.shape, ",") .. ")", params = p.numel, count = 0, total = 0 }
      by[id] = row
      rows[#rows + 1] = row
    end
    row.count = row.count + 1
    row.total = row.total + p.numel
  end
  local cfg = r.config or {}
  local tied = cfg.tie_word_embeddings or (E.family(cfg) == "gpt2")
  local w = 6
  for _, row in ipairs(rows) do
    local n = #(row.module .. "." .. row.param)
    if n > w then w = n end
  end
  local lines = {}
  local name = r.name or "model"
  lines[1] = fmt("%s: %s parameters (%s)", name, commas(total), si(total))
  local head = fmt("%-" .. w .. "s  %-16s %10s %5s %10s %7s", "parameter", "shape", "each", "x", "total", "share")
  lines[#lines + 1] = head
  lines[#lines + 1] = string.rep("-", #head)
  for _, row in ipairs(rows) do
    lines[#lines + 1] = fmt("%-" .. w .. "s  %-16s %10s %5d %10s %6.2f%%", row.module .. "." .. row.param, row.shape,
      si(row.params), row.count, si(row.total), 100 * row.total / total)
  end
  lines[#lines + 1] = string.rep("-", #head)
  lines[#lines + 1] = fmt("%-" .. w .. "s  %-16s %10s %5s %10s", "total", "", "", "", si(total))
  if tied then lines[#lines + 1] = "the output head is tied to the input embedding (counted once)" end
  lines[#lines + 1] = fmt("largest module: %s parameters (ZeRO-3 gathers at least this much at once)", si(largest))
  lines[#lines + 1] = fmt("weights: %s in bf16/fp16, %s in fp32; mixed-precision training states (16-bit weights " ..
    "and grads, fp32 master, Adam m and v = 16 bytes/param): %s before sharding", gib(2 * total), gib(4 * total), gib(16 * total))
  local res = { rows = rows, total = total, largest_layer = largest, tied = tied, name = name }
  res.text = concat(lines, "\n")
  setmetatable(res, { __tostring = function(t)
    return fmt("<%s: %s parameters>", t.name, commas(t.total))
  end })
  if not opts.quiet then print(res.text) end
  return res
end

return M
