-- zrun.jinja's lexer: template source -> tokens {type, value, line}, with jinja2's whitespace
-- control (trim_blocks, lstrip_blocks, "-" and "+"), {% raw %} and comments. syntax() raises the
-- one-line "chat template line N: ..." error the parser and compiler raise too.
local concat, fmt = table.concat, string.format

local utf8 = require("zrun.jinja.strings").utf8

local function syntax(line, msg) error(fmt("chat template line %d: %s", line, msg), 0) end

local UNESC = { n = "\n", t = "\t", r = "\r", ["\\"] = "\\", ["'"] = "'", ['"'] = '"', a = "\a", b = "\b", f = "\f", v = "\v", ["\n"] = "" }
-- Python's unicode-escape decoding of a string literal's body (unknown escapes stay as written).
local function unescape(body)
  local out, i, n = {}, 1, #body
  while i <= n do
    local c = body:sub(i, i)
    if c ~= "\\" or i == n then out[#out + 1] = c; i = i + 1
    else
      local e = body:sub(i + 1, i + 1)
      local width = (e == "x" and 2) or (e == "u" and 4) or (e == "U" and 8)
      local hex = width and body:sub(i + 2, i + 1 + width)
      if hex and #hex == width and hex:match("^%x+$") then
        out[#out + 1] = utf8(tonumber(hex, 16)); i = i + 2 + width
      elseif e:match("[0-7]") then
        local oct = body:match("^[0-7][0-7]?[0-7]?", i + 1)
        out[#out + 1] = utf8(tonumber(oct, 8)); i = i + 1 + #oct
      elseif UNESC[e] then out[#out + 1] = UNESC[e]; i = i + 2
      else out[#out + 1] = "\\" .. e; i = i + 2 end
    end
  end
  return concat(out)
end

local OPS2 = { ["//"] = true, ["**"] = true, ["=="] = true, ["!="] = true, [">="] = true, ["<="] = true }
local OPS1 = "+-/*%~[](){}<>=.:|,;"
local CLOSE = { [")"] = true, ["]"] = true, ["}"] = true }

local function lex(src)
  src = src:gsub("\r\n", "\n"):gsub("\r", "\n")
  if src:sub(-1) == "\n" then src = src:sub(1, -2) end -- jinja2 drops one trailing newline
  local toks, pos, n = {}, 1, #src
  local line, lpos = 1, 1
  local function line_at(p) -- the line of byte p (p only grows)
    for _ in src:sub(lpos, p - 1):gmatch("\n") do line = line + 1 end
    lpos = math.max(lpos, p)
    return line
  end
  local function emit(ty, v, p) toks[#toks + 1] = { ty, v, line_at(p) } end
  local line_starting = true -- did the last thing consumed end with a newline (lstrip_blocks)

  -- jinja2's whitespace control for the text before a tag: "-" strips all trailing whitespace;
  -- lstrip_blocks strips spaces between a line start and a block/comment tag unless "+".
  local function strip_before(text, sign, is_var)
    if sign == "-" then return (text:gsub("%s+$", "")) end
    if sign == "+" or is_var then return text end
    local l = text:match(".*\n()") or 1
    if (l > 1 or line_starting) and text:find("^[ \t\f\v]+$", l) then return text:sub(1, l - 1) end
    return text
  end

  while pos <= n do
    local s = src:find("{[{%%#]", pos)
    if not s then emit("data", src:sub(pos), pos); break end
    local c = src:sub(s + 1, s + 1)
    local sign = src:match("^[-+]", s + 2) or ""
    local text = strip_before(src:sub(pos, s - 1), sign, c == "{")
    if text ~= "" then emit("data", text, pos) end
    local after_raw = c == "%" and (src:match("^{%%[-+]?%s*raw%s*%-%%}%s*()", s) or src:match("^{%%[-+]?%s*raw%s*%%}()", s))
    if after_raw then
      -- {% raw %}: everything up to {% endraw %} is text
      line_starting = src:sub(after_raw - 1, after_raw - 1) == "\n"
      local a, b, esign = src:find("{%%([-+]?)%s*endraw%s*", after_raw)
      if not a then syntax(line_at(s), "missing {% endraw %} for the {% raw %} here") end
      local stop = src:match("^%-%%}%s*()", b + 1) or src:match("^%+%%}()", b + 1) or src:match("^%%}\n?()", b + 1)
      if not stop then syntax(line_at(a), "{% endraw %} is not closed with %}") end
      local body = strip_before(src:sub(after_raw, a - 1), esign, false)
      if body ~= "" then emit("data", body, after_raw) end
      pos = stop
      line_starting = src:sub(stop - 1, stop - 1) == "\n"
    elseif c == "#" then
      local from, q = s + 2 + #sign, nil
      q = src:find("#}", from, true)
      if not q then syntax(line_at(s), "missing end of comment tag #}") end
      local m = src:sub(q - 1, q - 1)
      if q - 1 >= from and m == "-" then pos = src:match("^%s*()", q + 2)
      elseif q - 1 >= from and m == "+" then pos = q + 2
      else pos = q + 2; if src:sub(pos, pos) == "\n" then pos = pos + 1 end end
      line_starting = src:sub(pos - 1, pos - 1) == "\n"
    else
      local block = c == "%"
      emit(block and "bbegin" or "vbegin", nil, s)
      pos = s + 2 + #sign
      local depth = 0
      while true do
        pos = src:match("^%s*()", pos)
        if pos > n then syntax(line_at(n), "unexpected end of template: a tag is not closed with " .. (block and "%}" or "}}")) end
        local endp
        if depth == 0 then
          if block then
            endp = src:match("^%-%%}%s*()", pos) or src:match("^%+%%}()", pos) or src:match("^%%}\n?()", pos)
          else
            endp = src:match("^%-}}%s*()", pos) or src:match("^}}()", pos)
          end
        end
        if endp then
          emit(block and "bend" or "vend", nil, pos)
          pos = endp
          line_starting = src:sub(pos - 1, pos - 1) == "\n"
          break
        end
        local ch = src:sub(pos, pos)
        local m = src:match("^%d+%.%d+[eE][-+]?%d+()", pos) or src:match("^%d+%.%d+()", pos) or src:match("^%d+[eE][-+]?%d+()", pos)
        if m then emit("float", tonumber(src:sub(pos, m - 1)), pos); pos = m
        elseif ch:find("%d") then m = src:match("^%d+()", pos); emit("int", tonumber(src:sub(pos, m - 1)), pos); pos = m
        elseif ch:find("[%a_]") then m = src:match("^[%w_]+()", pos); emit("name", src:sub(pos, m - 1), pos); pos = m
        elseif ch == "'" or ch == '"' then
          local i = pos + 1
          while true do
            local q = src:find("[\\" .. ch .. "]", i)
            if not q then syntax(line_at(pos), "unterminated string literal") end
            if src:sub(q, q) == "\\" then i = q + 2 else i = q; break end
          end
          emit("str", unescape(src:sub(pos + 1, i - 1)), pos); pos = i + 1
        elseif OPS2[src:sub(pos, pos + 1)] then emit("op", src:sub(pos, pos + 1), pos); pos = pos + 2
        elseif OPS1:find(ch, 1, true) then
          if ch == "(" or ch == "[" or ch == "{" then depth = depth + 1
          elseif CLOSE[ch] then
            if depth == 0 then syntax(line_at(pos), "unexpected '" .. ch .. "'") end
            depth = depth - 1
          end
          emit("op", ch, pos); pos = pos + 1
        else syntax(line_at(pos), "unexpected character '" .. ch .. "'") end
      end
    end
  end
  toks[#toks + 1] = { "eof", nil, line_at(n + 1) }
  return toks
end

return { lex = lex, syntax = syntax }
