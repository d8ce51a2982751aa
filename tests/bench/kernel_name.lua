-- A kernel's name as the timeline tools print it (timeline_gaps.lua, timeline_kernels.lua): a mangled
-- C++ name's scope and function ("_ZN3foo7bar_kernelIfLi4EEEvPT_" -> "foo::bar_kernel", anonymous
-- namespaces left out), any other name (cuBLAS's nvjet_..., sm90_xmma_...) cut to 60 characters.
return function(name)
  if name:sub(1, 2) ~= "_Z" then return name:sub(1, 60) end
  local i, parts = 3, {}
  if name:sub(i, i) == "N" then i = i + 1 end
  while true do
    local len = name:match("^%d+", i)
    if not len then break end
    i = i + #len
    local part = name:sub(i, i + tonumber(len) - 1)
    if not part:find("^_GLOBAL__N_") then parts[#parts + 1] = part end
    i = i + tonumber(len)
  end
  return #parts > 0 and table.concat(parts, "::") or name:sub(1, 60)
end
