-- Usage the caller did not ask for, taken back out of an OpenAI Chat stream (the why and the
-- rules: unasked_usage.py and docs/observations.md). Envoy's Lua filter runs this as a
-- coroutine per response (envoyproxy.io docs, HTTP Lua filter: `bodyChunks()` yields
-- between chunks; a chunk's `getBytes(index, length)` and `setBytes(string)`). The JSON
-- reader (json_members.lua), MAX_CARRY_BYTES and MAX_HELD_BYTES come before this file.

-- SSE (the WHATWG HTML standard, "Server-sent events", parsing an event stream): lines end
-- with CRLF, LF or CR; an empty line ends an event; a `data` field's value loses one leading
-- space, and an event's data lines are joined with LF.

-- The first CR or LF at or after `pos`, or nil.
local function line_break(buf, pos)
  local lf = find(buf, "\n", pos, true)
  local cr = next_of(buf, pos, "\r")
  if cr ~= nil and (lf == nil or cr < lf) then return cr end
  return lf
end

-- The index of the last byte of the event whose lines start at or after `pos` (a line
-- start), or nil and the start of its unfinished line. A CR at the very end ends an empty
-- line (its LF, if one follows, is an empty line of its own, which dispatches nothing) but
-- not yet a non-empty one (it may be half of a CRLF).
local function event_end(buf, pos)
  local n = #buf
  while true do
    local t = line_break(buf, pos)
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
-- and whether it has any field at all (false: only comments, or an empty line). `cr`: the
-- event has a CR (else only LF ends its lines).
local function event_data(ev, cr)
  local values, lines, fields = nil, nil, false
  local pos = 1
  while true do
    local t = cr and line_break(ev, pos) or find(ev, "\n", pos, true)
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

-- The usage chunk's members the held final chunk lacks (by key), as raw text, but its usage,
-- choices and the stream's identity (which the final chunk has its own of); nil if none.
local function extra_members(data, list, held)
  local has = {usage = true, choices = true, id = true, object = true, created = true,
    model = true, system_fingerprint = true}
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
local function on_event(state, out, ev, cr)
  local data, lines, fields = event_data(ev, cr)
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
  if #ev <= MAX_HELD_BYTES and choices ~= nil and choices.finishing then
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
    local cr = next_of(buf, start, "\r")
    on_event(state, out, sub(buf, start, e), cr ~= nil and cr <= e)
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
  forget_scans()
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
      -- What the caller is owed should this write fail half-way: the held final chunk and
      -- the carried start of an event (none when passing an oversized one: a fake start).
      local held, carry = state.held, state.passing == nil and state.carry or ""
      local ok, result = pcall(on_bytes, state, bytes)
      if ok then
        chunk:setBytes(result)
        bytes = result
      else -- never expected: from here on the stream passes as it comes, nothing lost
        broken = true
        bytes = (held ~= nil and held.ev or "") .. carry .. bytes
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
