"""Envoy Lua filters of the sidecar's own scripts (the unasked-usage stripper, the live
answer reader): a script is this package's Lua files joined after its constants, and it
runs only for requests carrying a marker header (a matcher skips it for every other)."""

from __future__ import annotations

from importlib.resources import files

from envoy_data_plane.envoy.config.core.v3 import DataSource
from envoy_data_plane.envoy.extensions.filters.http.lua.v3 import Lua
from envoy_data_plane.envoy.extensions.filters.network.http_connection_manager.v3 import (
    HttpFilter,
)
from envoy_data_plane.google.protobuf import Any
from envoy_data_plane.xds.type.matcher.v3 import RegexMatcher, RegexMatcherGoogleRe2, StringMatcher

from sidecar.envoy_config.matchers import negated, request_header, skipped_when


def lua_script(names: tuple[str, ...], constants: dict[str, int]) -> str:
    """`local NAME = value` for each constant, then the files, in order."""
    here = files("sidecar.envoy_config")
    parts = [here.joinpath(name).read_text("utf-8") for name in names]
    return "".join(f"local {name} = {value}\n" for name, value in constants.items()) \
        + "\n".join(parts)


def marked_lua_filter(name: str, marker: str, script: str) -> HttpFilter:
    """The Lua filter `name`, skipped unless the request carries the header `marker`."""
    marked = request_header(marker, StringMatcher(safe_regex=RegexMatcher(
        google_re2=RegexMatcherGoogleRe2(), regex=".+")))
    lua = Lua(default_source_code=DataSource(inline_string=script))
    return skipped_when(negated(marked), name, "envoy.filters.http.lua", Any.pack(lua))
