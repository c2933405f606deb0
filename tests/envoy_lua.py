"""Runs an Envoy Lua filter script's `envoy_on_response` outside Envoy, in LuaJIT (lupa), over
a response body given as its writes.

The stand-ins follow Envoy's Lua API (envoyproxy.io docs, HTTP Lua filter: the stream
handle's `headers()` and `bodyChunks()`, the header object's `get`/`add`/`replace`/`remove`,
the buffer's `length()`, `getBytes(index, length)` and `setBytes(string)`) and its filter's
coroutine rules (source/extensions/filters/http/lua/lua_filter.cc): the script runs as a
coroutine started with the response headers; `bodyChunks()`'s iterator yields until the next
chunk arrives and is resumed with it; after the chunk that ends the stream it returns nil
within the same resume, so the script may still edit that chunk; a stream ended by trailers
resumes it with nothing. A chunk is usable only during the resume that delivered it (Envoy
marks it dead afterwards: "object used outside of proper scope"). A script error fails the
test, as it would break the stream in Envoy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from lupa import luajit21

_HARNESS = r"""
local function check(self)
  if self.dead then error("object used outside of proper scope") end
end

local Buffer = {}
Buffer.__index = Buffer
function Buffer.length(self) check(self); return #self.bytes end
function Buffer.getBytes(self, index, length)
  check(self)
  if index < 0 or length < 0 or index + length > #self.bytes then
    error("index/length must be >= 0 and (index + length) must be <= buffer size")
  end
  return string.sub(self.bytes, index + 1, index + length)
end
function Buffer.setBytes(self, bytes)
  check(self)
  self.bytes = bytes
  return #bytes
end

local Headers = {}
Headers.__index = Headers
function Headers.get(self, key) return self.map[string.lower(key)] end
function Headers.add(self, key, value) self.map[string.lower(key)] = value end
function Headers.replace(self, key, value) self.map[string.lower(key)] = value end
function Headers.remove(self, key) self.map[string.lower(key)] = nil end

return function(response_headers, writes, trailers)
  local headers = setmetatable({map = {}}, Headers)
  for key, value in pairs(response_headers) do headers.map[key] = value end
  local ended = false
  local handle = {}
  local metadata = {}
  local dynamic = {}
  function dynamic.set(self, namespace, key, value)
    metadata[namespace .. "/" .. key] = value
  end
  local info = {}
  function info.dynamicMetadata(self) return dynamic end
  function handle.streamInfo(self) return info end
  function handle.headers(self) return headers end
  function handle.bodyChunks(self)
    return function()
      if ended then return nil end
      return coroutine.yield()
    end
  end
  local script = coroutine.create(envoy_on_response)
  local ok, err = coroutine.resume(script, handle)
  if not ok then error(err) end
  local out = {}
  local count = #writes
  for k = 1, count do
    local chunk = setmetatable({bytes = writes[k], dead = false}, Buffer)
    ended = k == count and not trailers
    if coroutine.status(script) == "suspended" then
      ok, err = coroutine.resume(script, chunk)
      if not ok then error(err) end
    end
    chunk.dead = true
    out[k] = chunk.bytes
  end
  if trailers and coroutine.status(script) == "suspended" then
    ended = true
    ok, err = coroutine.resume(script)
    if not ok then error(err) end
  end
  return out, headers.map, metadata
end
"""


@dataclass
class Response:
    writes: list[bytes]  # what the caller receives for each write, in order
    headers: dict[str, str]
    # Dynamic metadata the script set (`streamInfo():dynamicMetadata():set`), as
    # "namespace/key" → value.
    metadata: dict[str, str] = field(default_factory=dict)

    @property
    def body(self) -> bytes:
        return b"".join(self.writes)


class LuaFilter:
    """One LuaJIT state with the script loaded, as Envoy keeps one per worker thread."""

    def __init__(self, script: str) -> None:
        self._lua = luajit21.LuaRuntime(encoding=None, unpack_returned_tuples=True)
        self._lua.execute(script.encode())
        self._run = self._lua.execute(_HARNESS.encode())

    def respond(self, writes: Sequence[bytes], headers: dict[str, str] | None = None,
                trailers: bool = False) -> Response:
        """The response through `envoy_on_response`: `writes` are the body chunks as Envoy
        hands them over (the last one ends the stream unless `trailers`)."""
        given = {b"content-type": b"text/event-stream"} if headers is None else {
            key.encode(): value.encode() for key, value in headers.items()}
        out, after, metadata = self._run(self._lua.table_from(given),
                                         self._lua.table_from(list(writes)), trailers)
        return Response([out[k + 1] for k in range(len(writes))],
                        {key.decode(): value.decode() for key, value in after.items()},
                        {key.decode(): value.decode() for key, value in metadata.items()})
