-- Usage the caller did not ask for, taken back out of an OpenAI Chat stream (the why and the
-- rules: unasked_usage.py and docs/observations.md). Envoy's Lua filter runs this as a
-- coroutine per response (envoyproxy.io docs, HTTP Lua filter: `bodyChunks()` yields
-- between chunks; a chunk's `getBytes(index, length)` and `setBytes(string)`).
-- MAX_CARRY_BYTES and MAX_HELD_BYTES are prepended by unasked_usage.py.

local byte, find, sub, char, concat = string.byte, string.find, string.sub, string.char,
  table.concat
local floor = math.floor

-- JSON (RFC 8259), read only as far as the top-level members and the spans of their values.
-- Every reader takes (s, i) at its first byte and returns the index after it, or nil when
-- the text is not JSON there. Nesting deeper than MAX_DEPTH counts as not JSON (bounded
-- recursion).

local MAX_DEPTH = 128
local ESCAPED = {[34] = '"', [92] = "\\", [47] = "/", [98] = "\b", [102] = "\f",
  [110] = "\n", [114] = "\r", [116] = "\t"}

local function skip_ws(s, i)
  local _, e = find(s, "^[ \t\n\r]*", i)
  return e + 1
end

local function skip_string(s, i)
  local p = i + 1
  while true do
    local q = find(s, '["\\%z\1-\31]', p)
    if q == nil then return nil end
    local c = byte(s, q)
    if c == 34 then return q + 1 end
    if c ~= 92 then return nil end -- a raw control character
    c = byte(s, q + 1)
    if c == 117 then
      if find(s, "^%x%x%x%x", q + 2) == nil then return nil end
      p = q + 6
    elseif c ~= nil and ESCAPED[c] ~= nil then
      p = q + 2
    else
      return nil
    end
  end
end

local function skip_number(s, i)
  local p = i
  if byte(s, p) == 45 then p = p + 1 end
  local c = byte(s, p)
  if c == 48 then
    p = p + 1
  elseif c ~= nil and c >= 49 and c <= 57 then
    local _, e = find(s, "^%d*", p + 1)
    p = e + 1
  else
    return nil
  end
  if byte(s, p) == 46 then
    local _, e = find(s, "^%d+", p + 1)
    if e == nil then return nil end
    p = e + 1
  end
  c = byte(s, p)
  if c == 101 or c == 69 then
    local _, e = find(s, "^[+-]?%d+", p + 1)
    if e == nil then return nil end
    p = e + 1
  end
  return p
end

local skip_value

local function skip_object(s, i, depth)
  local p = skip_ws(s, i + 1)
  if byte(s, p) == 125 then return p + 1 end
  while true do
    if byte(s, p) ~= 34 then return nil end
    p = skip_string(s, p)
    if p == nil then return nil end
    p = skip_ws(s, p)
    if byte(s, p) ~= 58 then return nil end
    p = skip_value(s, skip_ws(s, p + 1), depth)
    if p == nil then return nil end
    p = skip_ws(s, p)
    local c = byte(s, p)
    if c == 125 then return p + 1 end
    if c ~= 44 then return nil end
    p = skip_ws(s, p + 1)
  end
end

local function skip_array(s, i, depth)
  local p = skip_ws(s, i + 1)
  if byte(s, p) == 93 then return p + 1 end
  while true do
    p = skip_value(s, p, depth)
    if p == nil then return nil end
    p = skip_ws(s, p)
    local c = byte(s, p)
    if c == 93 then return p + 1 end
    if c ~= 44 then return nil end
    p = skip_ws(s, p + 1)
  end
end

skip_value = function(s, i, depth)
  local c = byte(s, i)
  if c == 34 then return skip_string(s, i) end
  if c == 123 or c == 91 then
    if depth >= MAX_DEPTH then return nil end
    if c == 123 then return skip_object(s, i, depth + 1) end
    return skip_array(s, i, depth + 1)
  end
  if c == 116 then return find(s, "^true", i) and i + 4 or nil end
  if c == 102 then return find(s, "^false", i) and i + 5 or nil end
  if c == 110 then return find(s, "^null", i) and i + 4 or nil end
  return skip_number(s, i)
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

-- The members of the object at s[i] ('{'): a list of {key, from, value, to} (from: the key's
-- opening quote; value..to-1: the value's bytes), and the index after the object; nil when
-- it is not JSON.
local function members(s, i)
  local list = {}
  local p = skip_ws(s, i + 1)
  if byte(s, p) == 125 then return list, p + 1 end
  while true do
    if byte(s, p) ~= 34 then return nil end
    local key_end = skip_string(s, p)
    if key_end == nil then return nil end
    local colon = skip_ws(s, key_end)
    if byte(s, colon) ~= 58 then return nil end
    local value = skip_ws(s, colon + 1)
    local value_end = skip_value(s, value, 1)
    if value_end == nil then return nil end
    list[#list + 1] = {key = string_text(s, p, key_end), from = p, value = value,
      to = value_end}
    p = skip_ws(s, value_end)
    local c = byte(s, p)
    if c == 125 then return list, p + 1 end
    if c ~= 44 then return nil end
    p = skip_ws(s, p + 1)
  end
end

-- The last member named `key` (the one a JSON parser keeps), or nil.
local function member(list, key)
  for k = #list, 1, -1 do
    if list[k].key == key then return list[k] end
  end
  return nil
end

-- The data of an event when it is one JSON object: its members; nil otherwise.
local function read_object(data)
  local p = skip_ws(data, 1)
  if byte(data, p) ~= 123 then return nil end
  local list, after = members(data, p)
  if list == nil or skip_ws(data, after) <= #data then return nil end
  return list
end

local function is_empty_array(s, m)
  return byte(s, m.value) == 91 and byte(s, skip_ws(s, m.value + 1)) == 93
end

local function is_null(s, m)
  return m.to - m.value == 4 and byte(s, m.value) == 110
end

-- Whether a choice of the `choices` array carries a finish_reason other than null.
local function finishes(s, choices)
  if choices == nil or byte(s, choices.value) ~= 91 then return false end
  local p = skip_ws(s, choices.value + 1)
  while byte(s, p) ~= 93 do
    local after = skip_value(s, p, 1)
    if byte(s, p) == 123 then
      local reason = member(members(s, p), "finish_reason")
      if reason ~= nil and not is_null(s, reason) then return true end
    end
    p = skip_ws(s, after)
    if byte(s, p) == 44 then p = skip_ws(s, p + 1) end
  end
  return false
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

-- SSE (the WHATWG HTML standard, "Server-sent events", parsing an event stream): lines end
-- with CRLF, LF or CR; an empty line ends an event; a `data` field's value loses one leading
-- space, and an event's data lines are joined with LF.

-- The index of the last byte of the event whose lines start at or after `pos` (a line
-- start), or nil and the start of its unfinished line. A CR at the very end ends an empty
-- line (its LF, if one follows, is an empty line of its own, which dispatches nothing) but
-- not yet a non-empty one (it may be half of a CRLF).
local function event_end(buf, pos)
  local n = #buf
  while true do
    local t = find(buf, "[\r\n]", pos)
    if t == nil then return nil, pos end
    local after = t + 1
    if byte(buf, t) == 13 then
      if t == n and t ~= pos then return nil, pos end
      if byte(buf, after) == 10 then after = after + 1 end
    end
    if t == pos then return after - 1 end
    pos = after
  end
end

-- The event's data lines: the joined data (nil when it has none) and the lines as
-- {from, value, to} (value: first byte of the value; to: first byte of the terminator);
-- and whether it has any field at all (false: only comments, or an empty line).
local function event_data(ev)
  local values, lines, fields = nil, nil, false
  local pos = 1
  while true do
    local t = find(ev, "[\r\n]", pos)
    if t == nil or t == pos then break end
    if byte(ev, pos) ~= 58 then fields = true end
    if sub(ev, pos, pos + 3) == "data" then
      local c = byte(ev, pos + 4)
      local value = nil
      if c == 58 then
        value = byte(ev, pos + 5) == 32 and pos + 6 or pos + 5
      elseif pos + 4 == t then
        value = t
      end
      if value ~= nil then
        values = values or {}
        lines = lines or {}
        values[#values + 1] = sub(ev, value, t - 1)
        lines[#lines + 1] = {from = pos, value = value, to = t}
      end
    end
    pos = (byte(ev, t) == 13 and byte(ev, t + 1) == 10) and t + 2 or t + 1
  end
  if values == nil then return nil, nil, fields end
  return #values == 1 and values[1] or concat(values, "\n"), lines, true
end

-- The event with its data replaced: other lines stay as they are; the data goes where its
-- first line was (as many lines as it has), its later data lines are left out.
local function with_data(ev, lines, data)
  local first = lines[1]
  if #lines == 1 and find(data, "\n", 1, true) == nil then
    return sub(ev, 1, first.value - 1) .. data .. sub(ev, first.to)
  end
  local ending = byte(ev, first.to) == 13 and byte(ev, first.to + 1) == 10 and "\r\n"
    or sub(ev, first.to, first.to)
  local out = {sub(ev, 1, first.value - 1)}
  local piece_start = 1
  while true do
    local newline = find(data, "\n", piece_start, true)
    out[#out + 1] = sub(data, piece_start, (newline or 0) - 1)
    if newline == nil then break end
    out[#out + 1] = ending .. "data: "
    piece_start = newline + 1
  end
  local pos = first.to
  for k = 2, #lines do
    out[#out + 1] = sub(ev, pos, lines[k].from - 1)
    pos = (byte(ev, lines[k].to) == 13 and byte(ev, lines[k].to + 1) == 10)
      and lines[k].to + 2 or lines[k].to + 1
  end
  out[#out + 1] = sub(ev, pos)
  return concat(out)
end

-- A chunk as it goes to the caller: its `"usage": null` members dropped, `extra` spliced.
local function edited(chunk, extra)
  if chunk.drop == nil and extra == nil then return chunk.ev end
  return with_data(chunk.ev, chunk.lines,
    rebuild(chunk.data, chunk.list, chunk.drop or {}, extra))
end

-- The usage chunk's members the held final chunk lacks (by key), as raw text; nil if none.
local function extra_members(data, list, held)
  local has = {usage = true, choices = true}
  for _, m in ipairs(held.list) do has[m.key] = true end
  local extra = nil
  for _, m in ipairs(list) do
    if not has[m.key] then
      local text = sub(data, m.from, m.to - 1)
      extra = extra == nil and text or extra .. "," .. text
    end
  end
  return extra
end

-- One whole event: appended to `out` (edited), held, or dropped (the usage chunk). The held
-- final chunk goes out before the next event, with the usage chunk's extra members in it if
-- that event is the usage chunk. An event without fields (comments only, or the LF of a
-- CRLF whose CR ended the previous event at the end of a chunk) dispatches nothing: it
-- passes at once and leaves the held chunk waiting.
local function on_event(state, out, ev)
  local data, lines, fields = event_data(ev)
  if not fields then
    out[#out + 1] = ev
    return
  end
  local held = state.held
  state.held = nil
  local list = data ~= nil and read_object(data) or nil
  if list == nil then
    if held ~= nil then out[#out + 1] = edited(held) end
    out[#out + 1] = ev
    return
  end
  local choices, usage = member(list, "choices"), member(list, "usage")
  if usage ~= nil and choices ~= nil and byte(data, usage.value) == 123
      and is_empty_array(data, choices) then
    if held ~= nil then out[#out + 1] = edited(held, extra_members(data, list, held)) end
    return
  end
  if held ~= nil then out[#out + 1] = edited(held) end
  local chunk = {ev = ev, lines = lines, data = data, list = list}
  if usage ~= nil and is_null(data, usage) then
    chunk.drop = {}
    for k, m in ipairs(list) do
      if m.key == "usage" then chunk.drop[k] = true end
    end
  end
  if #ev <= MAX_HELD_BYTES and finishes(data, choices) then
    state.held = chunk
  else
    out[#out + 1] = edited(chunk)
  end
end

-- A fake start of line that stands for the bytes of an oversized event already passed: "x"
-- for a line under way, "x\r" for one that ended with a CR (an LF may follow), "" for none.
local function passed_line(buf, from)
  if from > #buf then return "" end
  return byte(buf, #buf) == 13 and "x\r" or "x"
end

-- One body chunk's bytes in, the bytes for the caller out. Whole events are edited; a cut
-- one is carried (up to MAX_CARRY_BYTES; beyond, it passes unedited, and so does the rest
-- of it as it comes).
local function on_bytes(state, bytes)
  local buf = state.carry == "" and bytes or state.carry .. bytes
  local out = {}
  local start, scan = 1, state.scan
  if state.passing ~= nil then -- the rest of an oversized event, after a fake line start
    local fake = #state.passing
    local e, unfinished = event_end(buf, 1)
    if e == nil then
      state.carry, state.scan = passed_line(buf, unfinished), 1
      state.passing = state.carry
      return sub(buf, fake + 1)
    end
    out[1] = sub(buf, fake + 1, e)
    state.passing = nil
    start, scan = e + 1, e + 1
  end
  while true do
    local e, unfinished = event_end(buf, scan)
    if e == nil then
      scan = unfinished
      break
    end
    on_event(state, out, sub(buf, start, e))
    start, scan = e + 1, e + 1
  end
  if #buf - start + 1 > MAX_CARRY_BYTES then
    if state.held ~= nil then
      out[#out + 1] = edited(state.held)
      state.held = nil
    end
    out[#out + 1] = sub(buf, start)
    state.carry, state.scan = passed_line(buf, scan), 1
    state.passing = state.carry
  else
    state.carry = start == 1 and buf or sub(buf, start)
    state.scan = scan - start + 1
  end
  return concat(out)
end

function envoy_on_response(handle)
  local headers = handle:headers()
  local kind = string.lower(headers:get("content-type") or "")
  if find(kind, "text/event-stream", 1, true) == nil then return end
  -- The edited stream is shorter than a declared length: the caller would wait for the rest.
  headers:remove("content-length")
  local state = {carry = "", scan = 1, held = nil, passing = nil}
  local broken = false
  local last, last_bytes = nil, nil
  for chunk in handle:bodyChunks() do
    local bytes = chunk:getBytes(0, chunk:length())
    if not broken then
      local ok, result = pcall(on_bytes, state, bytes)
      if ok then
        chunk:setBytes(result)
        bytes = result
      else -- never expected: from here on the stream passes as it comes, nothing lost
        broken = true
        bytes = (state.held ~= nil and state.held.ev or "") .. state.carry .. bytes
        chunk:setBytes(bytes)
      end
    end
    last, last_bytes = chunk, bytes
  end
  -- The stream's end came with the last chunk (still ours to edit until this function
  -- returns or yields): a held final chunk goes out in it. An unfinished last event is
  -- dropped, as every SSE parser drops it. (A stream ended by trailers has no chunk left.)
  if not broken and state.held ~= nil and last ~= nil then
    pcall(last.setBytes, last, last_bytes .. edited(state.held))
  end
end
