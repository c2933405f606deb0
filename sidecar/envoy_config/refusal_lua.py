"""The refusal catalogue (observe/refusal_catalogue.py) as a Lua chunk, for the hold of
bounded replies (upstream_errors.py): Envoy's Lua has no JSON library, so the chunk scans
the lower-cased body for what each entry names — `"type": "…"` (or TGI's `"error_type"`),
`"code": "…"`, the phrase — with JSON's optional whitespace around the colon. That is a
scan, not a reader: it is kept only because it gives the same answer as refusals.py on
every catalogue entry, compact and spaced (tests/unit/observe/test_refusal_catalogue.py
runs both on each), and the catalogue's values are plain tokens and phrases that no JSON
writer escapes.

The chunk defines two functions:

- `refusal_verdict(status, text)`: the first matching entry's verdict (`context_window` or
  `request_error`), or nil;
- `unrecognised_mark(text)`: `type=…;code=…` of an error no entry knows, tokens only.
"""

from __future__ import annotations

from sidecar.observe.refusal_catalogue import CATALOGUE, REFUSAL_STATUSES
from sidecar.observe.refusals import MAX_TOKEN_CHARS, SCANNED_BYTES

_MAGIC = set("^$()%.[]*+-?")


def _lua_pattern(text: str) -> str:
    """`text` as a Lua pattern that matches it literally."""
    return "".join(f"%{c}" if c in _MAGIC else c for c in text)


def _lua_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _entry(status: int, verdict: str, error_type: str | None, error_code: str | None,
           phrase: str | None) -> str:
    fields = [f'status = "{status}"', f'verdict = "{verdict}"']
    if error_type is not None:
        fields.append(f"kind = {_lua_string(_lua_pattern(error_type.lower()))}")
    if error_code is not None:
        fields.append(f"code = {_lua_string(_lua_pattern(error_code.lower()))}")
    if phrase is not None:
        fields.append(f"phrase = {_lua_string(phrase.lower())}")
    return "  {" + ", ".join(fields) + "},"


_BODY = """\
local REFUSAL_SCANNED = %(scanned)d
local REFUSAL_TOKEN_CHARS = %(token_chars)d

local function names_value(text, name, value)
  return string.find(text, '"' .. name .. '"%%s*:%%s*"' .. value .. '"') ~= nil
end

function refusal_verdict(status, text)
  if not REFUSAL_STATUSES[status] or #text > REFUSAL_SCANNED then return nil end
  if string.find(text, "^%%s*[%%[{]") == nil then return nil end
  for _, entry in ipairs(REFUSALS) do
    if entry.status == status
        and (entry.kind == nil or names_value(text, "type", entry.kind)
             or names_value(text, "error_type", entry.kind))
        and (entry.code == nil or names_value(text, "code", entry.code))
        and (entry.phrase == nil or string.find(text, entry.phrase, 1, true) ~= nil) then
      return entry.verdict
    end
  end
  return nil
end

local function token(value)
  if value == nil then return "" end
  return string.sub(string.gsub(value, "[^%%w_.-]", ""), 1, REFUSAL_TOKEN_CHARS)
end

function unrecognised_mark(text)
  if #text > REFUSAL_SCANNED then return "type=;code=" end
  local _, inner = string.find(text, '"error"%%s*:%%s*{')
  local from = inner or 1
  local kind = string.match(text, '"type"%%s*:%%s*"([^"]*)"', from)
      or string.match(text, '"error_type"%%s*:%%s*"([^"]*)"')
  local code = string.match(text, '"code"%%s*:%%s*"([^"]*)"', from)
      or string.match(text, '"code"%%s*:%%s*(%%d+)', from)
  return "type=" .. token(kind) .. ";code=" .. token(code)
end
"""


def refusal_chunk() -> str:
    """The Lua chunk (plain Lua 5.1, as Envoy's LuaJIT runs it)."""
    entries = "\n".join(_entry(e.status, e.verdict.value, e.error_type, e.error_code, e.phrase)
                        for e in CATALOGUE)
    statuses = ", ".join(f'["{s}"] = true' for s in sorted(REFUSAL_STATUSES))
    return (f"local REFUSALS = {{\n{entries}\n}}\n"
            f"local REFUSAL_STATUSES = {{{statuses}}}\n"
            + _BODY % {"scanned": SCANNED_BYTES, "token_chars": MAX_TOKEN_CHARS})
