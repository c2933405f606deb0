-- JSON (RFC 8259), read only as far as an object's top-level members and the spans of their
-- values, for Envoy's LuaJIT (Lua 5.1: no integer division or bitwise operators). Loaded
-- before unasked_usage.lua or answer_facts.lua, in the same chunk (lua_filters.py joins
-- them).
--
-- Every reader takes (s, i) at its first byte and returns the index after it, or nil when
-- the text is not JSON there. Nesting deeper than MAX_DEPTH counts as not JSON (bounded
-- recursion). Raw control characters inside strings are not looked for: an event that has
-- them is no JSON to the caller's parser either, edited or not. Scans use plain `find` and
-- `byte` (LuaJIT compiles them; a pattern `find` walks byte by byte in C, about 5x the
-- cost of this whole reader on a typical chunk).

local byte, find, sub, char, concat = string.byte, string.find, string.sub, string.char,
  table.concat
local floor = math.floor

local MAX_DEPTH = 128
local ESCAPED = {[34] = '"', [92] = "\\", [47] = "/", [98] = "\b", [102] = "\f",
  [110] = "\n", [114] = "\r", [116] = "\t"}

-- The first `needle` (one byte) at or after `pos` in `s`, remembered per needle: scanning
-- forward through one string costs one pass, however many times it is asked.
local seen_in, seen_from, seen_at = {}, {}, {}
local function next_of(s, pos, needle)
  if seen_in[needle] == s and seen_from[needle] <= pos then
    local at = seen_at[needle]
    if at == false then return nil end
    if at >= pos then return at end
  end
  local at = find(s, needle, pos, true)
  seen_in[needle], seen_from[needle], seen_at[needle] = s, pos, at or false
  return at
end

local function forget_scans()
  seen_in["\\"], seen_in["\r"] = nil, nil
end

local function skip_ws(s, i)
  local c = byte(s, i)
  while c == 32 or c == 10 or c == 13 or c == 9 do
    i = i + 1
    c = byte(s, i)
  end
  return i
end

local function skip_string(s, i)
  local p = i + 1
  while true do
    local q = find(s, '"', p, true)
    if q == nil then return nil end
    local b = next_of(s, p, "\\")
    if b == nil or b > q then return q + 1 end
    local c = byte(s, b + 1)
    if c == 117 then
      if find(s, "^%x%x%x%x", b + 2) == nil then return nil end
      p = b + 6
    elseif c ~= nil and ESCAPED[c] ~= nil then
      p = b + 2
    else
      return nil
    end
  end
end

local function digits(s, p)
  local c = byte(s, p)
  while c ~= nil and c >= 48 and c <= 57 do
    p = p + 1
    c = byte(s, p)
  end
  return p
end

local function skip_number(s, i)
  local p = i
  if byte(s, p) == 45 then p = p + 1 end
  local c = byte(s, p)
  if c == 48 then
    p = p + 1
  elseif c ~= nil and c >= 49 and c <= 57 then
    p = digits(s, p + 1)
  else
    return nil
  end
  if byte(s, p) == 46 then
    local q = digits(s, p + 1)
    if q == p + 1 then return nil end
    p = q
  end
  c = byte(s, p)
  if c == 101 or c == 69 then
    p = p + 1
    c = byte(s, p)
    if c == 43 or c == 45 then p = p + 1 end
    local q = digits(s, p)
    if q == p then return nil end
    p = q
  end
  return p
end

local function utf8(code)
  if code < 0x80 then return char(code) end
  if code < 0x800 then return char(0xC0 + floor(code / 64), 0x80 + code % 64) end
  if code < 0x10000 then
    return char(0xE0 + floor(code / 4096), 0x80 + floor(code / 64) % 64, 0x80 + code % 64)
  end
  return char(0xF0 + floor(code / 262144), 0x80 + floor(code / 4096) % 64,
    0x80 + floor(code / 64) % 64, 0x80 + code % 64)
end

-- The text of a (valid) JSON string s[i..j-1], quotes included: escapes decoded, so that
-- "us\u0061ge" is the key usage.
local function string_text(s, i, j)
  local raw = sub(s, i + 1, j - 2)
  if find(raw, "\\", 1, true) == nil then return raw end
  local out, p = {}, 1
  while true do
    local q = find(raw, "\\", p, true)
    if q == nil then
      out[#out + 1] = sub(raw, p)
      return concat(out)
    end
    out[#out + 1] = sub(raw, p, q - 1)
    local c = byte(raw, q + 1)
    if c == 117 then
      local code = tonumber(sub(raw, q + 2, q + 5), 16)
      p = q + 6
      if code >= 0xD800 and code < 0xDC00 and sub(raw, p, p + 1) == "\\u" then
        local low = tonumber(sub(raw, p + 2, p + 5), 16)
        if low >= 0xDC00 and low < 0xE000 then
          code = 0x10000 + (code - 0xD800) * 1024 + (low - 0xDC00)
          p = p + 6
        end
      end
      out[#out + 1] = utf8(code)
    else
      out[#out + 1] = ESCAPED[c]
      p = q + 2
    end
  end
end

-- Whether the key s[i..j-1] is `word` (decoded only when it has an escape and is longer).
local function key_is(s, i, j, word)
  local length = j - i - 2
  if length == #word then return sub(s, i + 1, j - 2) == word end
  if length < #word then return false end
  local escape = next_of(s, i + 1, "\\")
  return escape ~= nil and escape < j and string_text(s, i, j) == word
end

local skip_value

-- The object at s[i]: the index after it, and where the value of its last member named
-- `wanted` (if given) starts.
local function skip_object(s, i, depth, wanted)
  local p = skip_ws(s, i + 1)
  local found = nil
  if byte(s, p) == 125 then return p + 1 end
  while true do
    if byte(s, p) ~= 34 then return nil end
    local key_end = skip_string(s, p)
    if key_end == nil then return nil end
    local colon = skip_ws(s, key_end)
    if byte(s, colon) ~= 58 then return nil end
    local value = skip_ws(s, colon + 1)
    if wanted ~= nil and key_is(s, p, key_end, wanted) then found = value end
    p = skip_value(s, value, depth)
    if p == nil then return nil end
    p = skip_ws(s, p)
    local c = byte(s, p)
    if c == 125 then return p + 1, found end
    if c ~= 44 then return nil end
    p = skip_ws(s, p + 1)
  end
end

-- The array at s[i]: the index after it, and (`choices`) whether an object in it has a
-- `finish_reason` other than null.
local function skip_array(s, i, depth, choices)
  local p = skip_ws(s, i + 1)
  local finishing = false
  if byte(s, p) == 93 then return p + 1, false end
  while true do
    if choices and byte(s, p) == 123 and depth < MAX_DEPTH then
      local reason
      p, reason = skip_object(s, p, depth + 1, "finish_reason")
      if reason ~= nil and byte(s, reason) ~= 110 then finishing = true end
    else
      p = skip_value(s, p, depth)
    end
    if p == nil then return nil end
    p = skip_ws(s, p)
    local c = byte(s, p)
    if c == 93 then return p + 1, finishing end
    if c ~= 44 then return nil end
    p = skip_ws(s, p + 1)
  end
end

local function literal(s, i, word)
  if sub(s, i, i + #word - 1) == word then return i + #word end
  return nil
end

skip_value = function(s, i, depth)
  local c = byte(s, i)
  if c == 34 then return skip_string(s, i) end
  if c == 123 or c == 91 then
    if depth >= MAX_DEPTH then return nil end
    if c == 123 then return (skip_object(s, i, depth + 1)) end
    return (skip_array(s, i, depth + 1))
  end
  if c == 116 then return literal(s, i, "true") end
  if c == 102 then return literal(s, i, "false") end
  if c == 110 then return literal(s, i, "null") end
  return skip_number(s, i)
end

-- The members of the object that is all of `data` (whitespace around it aside): a list of
-- {key, from, value, to, finishing} (from: the key's opening quote; value..to-1: the
-- value's bytes; finishing: a `choices` array with a choice that has a finish_reason);
-- nil when `data` is not one JSON object.
local function read_object(data)
  local p = skip_ws(data, 1)
  if byte(data, p) ~= 123 then return nil end
  local list = {}
  p = skip_ws(data, p + 1)
  if byte(data, p) == 125 then
    return skip_ws(data, p + 1) > #data and list or nil
  end
  while true do
    if byte(data, p) ~= 34 then return nil end
    local key_end = skip_string(data, p)
    if key_end == nil then return nil end
    local colon = skip_ws(data, key_end)
    if byte(data, colon) ~= 58 then return nil end
    local value = skip_ws(data, colon + 1)
    local key = string_text(data, p, key_end)
    local value_end, finishing
    if key == "choices" and byte(data, value) == 91 then
      value_end, finishing = skip_array(data, value, 2, true)
    else
      value_end = skip_value(data, value, 1)
    end
    if value_end == nil then return nil end
    list[#list + 1] = {key = key, from = p, value = value, to = value_end,
      finishing = finishing}
    p = skip_ws(data, value_end)
    local c = byte(data, p)
    if c == 125 then
      return skip_ws(data, p + 1) > #data and list or nil
    end
    if c ~= 44 then return nil end
    p = skip_ws(data, p + 1)
  end
end

-- The last member named `key` (the one a JSON parser keeps), or nil.
local function member(list, key)
  for k = #list, 1, -1 do
    if list[k].key == key then return list[k] end
  end
  return nil
end

local function is_empty_array(s, m)
  return byte(s, m.value) == 91 and byte(s, skip_ws(s, m.value + 1)) == 93
end

local function is_null(s, m)
  return byte(s, m.value) == 110
end

-- The object's text without the members in `drop` (their separators with them), with
-- `extra` (raw members) before its closing brace; the rest of its bytes unchanged.
local function rebuild(s, list, drop, extra)
  local n = #list
  local out = {sub(s, 1, list[1].from - 1)}
  local previous = nil
  for k = 1, n do
    if not drop[k] then
      if previous ~= nil then
        out[#out + 1] = sub(s, list[previous].to, list[previous + 1].from - 1)
      end
      out[#out + 1] = sub(s, list[k].from, list[k].to - 1)
      previous = k
    end
  end
  if extra ~= nil then
    out[#out + 1] = previous ~= nil and "," .. extra or extra
  end
  out[#out + 1] = sub(s, list[n].to)
  return concat(out)
end
