-- Keyword-argument tables checked where the public API takes them: a key the function does not read
-- is one line naming the function, the key, the nearest known one and the ones it takes (a misspelt
-- `dtyp`, or transformers' `device_map`, would otherwise be dropped: the model built in f32 on the CPU).
--   opts = require("zrun.kwargs").check("from_pretrained", opts, { "dtype", "device" })
local M = {}
local fmt, concat, sort = string.format, table.concat, table.sort

-- opts (nil: {}) when every key is one of `known` (a list of names), else raises. Returns opts.
function M.check(who, opts, known)
  if opts == nil then return {} end
  if type(opts) ~= "table" then error(fmt("%s: options must be a table {name = value}, got %s", who, type(opts)), 0) end
  for k in pairs(opts) do
    local ok = false
    for _, n in ipairs(known) do if n == k then ok = true; break end end
    if not ok then
      local s = type(k) == "string" and require("zrun.config").suggest(k, known)
      local names = {}
      for i, n in ipairs(known) do names[i] = n end
      sort(names)
      error(fmt("%s: unknown option '%s'%s; it takes %s", who, tostring(k), s and fmt(" (did you mean '%s'?)", s) or "",
        concat(names, ", ")), 0)
    end
  end
  return opts
end

-- The keys of opts named in `keys` (a list), as a new table: what a function hands on to another
-- that takes fewer.
function M.pick(opts, keys)
  local out = {}
  if opts then for _, k in ipairs(keys) do out[k] = opts[k] end end
  return out
end

return M
