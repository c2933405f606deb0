-- What a live answer said, for shadow traffic's agreement figures (answer_facts.py): how it
-- finished and the names of the tools it called, as dynamic metadata the access log
-- carries. Only for requests the sidecar mirrored (a marker header; a matcher skips the
-- filter for every other request). The answer passes as it arrives, byte for byte: this
-- reads copies. The JSON reader (json_members.lua) and MAX_ANSWER_BYTES, MAX_EVENT_BYTES
-- come before this file.
--
-- Read as JSON, never as byte patterns: an OpenAI Chat completion or stream chunk
-- (`choices[0].finish_reason`, `choices[0].message|delta.tool_calls[].function.name`), an
-- Anthropic message or stream event (`stop_reason`, `delta.stop_reason` of
-- `message_delta`, `content[]`/`content_block` of type `tool_use` and its `name`). SSE
-- framing per the WHATWG rules: CRLF, LF or CR line ends, `data:` lines joined with LF.

local MAX_TOOLS = 16

local function text_of(s, m)
  if m == nil or byte(s, m.value) ~= 34 then return nil end
  return string_text(s, m.value, m.to)
end

local function object_of(s, m)
  if m == nil or byte(s, m.value) ~= 123 then return nil end
  return sub(s, m.value, m.to - 1)
end

-- The array at s[i]: its elements' texts, or nil when it is not one.
local function elements(s, i)
  local out = {}
  local p = skip_ws(s, i + 1)
  if byte(s, p) == 93 then return out end
  while true do
    local e = skip_value(s, p, 2)
    if e == nil then return nil end
    out[#out + 1] = sub(s, p, e - 1)
    p = skip_ws(s, e)
    local c = byte(s, p)
    if c == 93 then return out end
    if c ~= 44 then return nil end
    p = skip_ws(s, p + 1)
  end
end

local function array_of(s, m)
  if m == nil or byte(s, m.value) ~= 91 then return nil end
  return elements(s, m.value)
end

-- A name as the candidate's reader keeps it: an empty one is no call; a name no request
-- could declare (longer than 64 bytes, or with a comma, the list's separator) stands as
-- "~", which the sidecar counts as undeclared.
local function add_tool(facts, name)
  if name == nil or name == "" or #facts.tools >= MAX_TOOLS then return end
  if #name > 64 or find(name, ",", 1, true) ~= nil then name = "~" end
  facts.tools[#facts.tools + 1] = name
  facts.changed = true
end

local function finish_with(facts, reason)
  if reason ~= nil and reason ~= facts.finish then
    facts.finish = reason
    facts.changed = true
  end
end

local function tool_block(facts, text)
  local block = text and read_object(text)
  if block ~= nil and text_of(text, member(block, "type")) == "tool_use" then
    add_tool(facts, text_of(text, member(block, "name")))
  end
end

local function chat_facts(facts, data, top)
  local choices = array_of(data, member(top, "choices"))
  local first = choices and choices[1]
  local choice = first and read_object(first)
  if choice == nil then return end
  finish_with(facts, text_of(first, member(choice, "finish_reason")))
  local message_text = object_of(first, member(choice, "message"))
    or object_of(first, member(choice, "delta"))
  local message = message_text and read_object(message_text)
  local calls = message and array_of(message_text, member(message, "tool_calls"))
  for _, call_text in ipairs(calls or {}) do
    local call = read_object(call_text)
    local fn_text = call and object_of(call_text, member(call, "function"))
    local fn = fn_text and read_object(fn_text)
    if fn ~= nil then add_tool(facts, text_of(fn_text, member(fn, "name"))) end
  end
end

local function messages_facts(facts, data, top)
  local kind = text_of(data, member(top, "type"))
  if kind == "message" then
    finish_with(facts, text_of(data, member(top, "stop_reason")))
    for _, block in ipairs(array_of(data, member(top, "content")) or {}) do
      tool_block(facts, block)
    end
  elseif kind == "message_delta" then
    local delta_text = object_of(data, member(top, "delta"))
    local delta = delta_text and read_object(delta_text)
    finish_with(facts, delta and text_of(delta_text, member(delta, "stop_reason")))
  elseif kind == "content_block_start" then
    tool_block(facts, object_of(data, member(top, "content_block")))
  end
end

local function read_facts(facts, data)
  local top = read_object(data)
  if top == nil then return end
  if member(top, "choices") ~= nil then
    chat_facts(facts, data, top)
  else
    messages_facts(facts, data, top)
  end
end

-- The stream's reading state: `carry`, the unfinished event's text with its line ends
-- already made LF (it never holds "\n\n"); `held`, a CR at the end of the last chunk
-- (maybe half of a CRLF). Each chunk's bytes are normalized once and searched from the
-- last byte of `carry` on, so a long event costs no rescans (only its carry's copies,
-- bounded by MAX_EVENT_BYTES).
local function feed(facts, state, bytes)
  local text = state.held .. bytes
  state.held = ""
  if byte(text, #text) == 13 then
    state.held, text = "\r", sub(text, 1, #text - 1)
  end
  text = string.gsub(text, "\r\n?", "\n")
  local buf = state.carry .. text
  local pos, from = 1, math.max(1, #state.carry)
  while true do
    local stop = find(buf, "\n\n", from, true)
    if stop == nil then break end
    local lines = {}
    for line in string.gmatch(sub(buf, pos, stop), "([^\n]*)\n") do
      if sub(line, 1, 5) == "data:" then
        local value = sub(line, 6)
        if byte(value, 1) == 32 then value = sub(value, 2) end
        lines[#lines + 1] = value
      end
    end
    if #lines > 0 then read_facts(facts, concat(lines, "\n")) end
    pos = stop + 2
    from = pos
  end
  state.carry = sub(buf, pos)
  if #state.carry > MAX_EVENT_BYTES then state.carry = "" end  -- no event of an answer
end

-- Sets what is known so far (again: a later value overwrites), so a caller that hangs up
-- at `[DONE]`, before the stream's end reaches Envoy, still leaves the facts read.
local function publish(handle, facts)
  if not facts.changed then return end
  facts.changed = false
  local metadata = handle:streamInfo():dynamicMetadata()
  if facts.finish ~= nil and #facts.finish <= 64 then
    metadata:set("sidecar.answer", "finish", facts.finish)
  end
  if #facts.tools > 0 then
    metadata:set("sidecar.answer", "tools", concat(facts.tools, ","))
  end
end

function envoy_on_response(handle)
  local kind = handle:headers():get("content-type") or ""
  local stream = find(kind, "text/event-stream", 1, true) ~= nil
  local facts = {tools = {}, changed = false}
  local state = {carry = "", held = ""}
  local parts, size = {}, 0
  for chunk in handle:bodyChunks() do
    local n = chunk:length()
    if n > 0 then
      local bytes = chunk:getBytes(0, n)
      if stream then
        feed(facts, state, bytes)
        publish(handle, facts)
      elseif size + n <= MAX_ANSWER_BYTES then
        size = size + n
        parts[#parts + 1] = bytes
      else
        size, parts = MAX_ANSWER_BYTES + 1, {}  -- too long to read: nothing is kept
      end
    end
  end
  if stream then
    -- An event the stream did not end is read too, as the candidate's reader reads it.
    feed(facts, state, "\n\n")
  elseif size <= MAX_ANSWER_BYTES then
    read_facts(facts, concat(parts))
  end
  publish(handle, facts)
  forget_scans()
end
