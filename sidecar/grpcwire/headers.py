"""HPACK decoding of request header blocks (RFC 7541), with the `hpack` package, and the
checks RFC 9113 §8.2-8.3 asks of a request's fields.

The decoder's dynamic table must follow every block of the connection, in order, so every
block is decoded, including those of calls we refuse.
"""

from __future__ import annotations

import re

import hpack
from hpack.table import HeaderTable

from sidecar.grpcwire import frames as f
from sidecar.grpcwire.auth import CHANNEL_TOKEN_HEADER
from sidecar.grpcwire.frames import ProtocolError

_TOKEN = CHANNEL_TOKEN_HEADER.encode()
_REQUEST_PSEUDO = frozenset({b":method", b":scheme", b":path", b":authority"})
_REQUIRED_PSEUDO = frozenset({b":method", b":scheme", b":path"})
# RFC 9113 §8.2.2: fields of HTTP/1.1 connection management are malformed in HTTP/2.
_CONNECTION_SPECIFIC = frozenset({b"connection", b"proxy-connection", b"keep-alive",
                                  b"transfer-encoding", b"upgrade"})
# §8.2.1: no controls, space, upper case or non-ASCII in names (nor a colon, but in the
# pseudo-headers' first place); no NUL, CR or LF in values, nor whitespace at either end.
_BAD_NAME = re.compile(rb"[\x00-\x20A-Z\x7f-\xff]|.:")
_BAD_VALUE = re.compile(rb"[\x00\r\n]|\A[ \t]|[ \t]\Z")

# What a call needs from its request header block: the method path and the channel token.
RequestHead = tuple[bytes, bytes | None]


class HeaderDecoder:
    """HPACK decoding with a memo of repeated blocks.

    Envoy's gRPC client sends the same request header block for every call of a method
    (its `:path` as a literal that is never added to the table, so decoding it means
    Huffman-decoding it again each time, in Python). A block whose decoding left the dynamic
    table untouched decodes the same way for as long as the table stays the same, so it is
    remembered until some block changes the table."""

    _MEMO_MAX = 64
    _BLOCK_MAX = 4096

    def __init__(self) -> None:
        self._decoder = hpack.Decoder()
        self._table = _CountingTable()
        self._decoder.header_table = self._table
        self._memo: dict[bytes, list[tuple[bytes, bytes]]] = {}
        self._heads: dict[bytes, RequestHead] = {}  # checked request blocks of the memo

    def request(self, block: bytes) -> RequestHead:
        """Decode a block that opens a call; ProtocolError if the request is malformed."""
        head = self._heads.get(block)
        if head is not None:
            return head
        head = request_head(self.decode(block))
        if block in self._memo:
            self._heads[block] = head
        return head

    def decode(self, block: bytes) -> list[tuple[bytes, bytes]]:
        headers = self._memo.get(block)
        if headers is not None:
            return headers
        before = self._table.changes, self._table.maxsize
        try:
            headers = [(bytes(name), bytes(value))
                       for name, value in self._decoder.decode(block, raw=True)]
        except hpack.HPACKError as error:
            raise ProtocolError(f.COMPRESSION_ERROR, f"bad header block: {error}") from None
        if (self._table.changes, self._table.maxsize) != before:
            self._memo.clear()
            self._heads.clear()
        elif (len(self._memo) < self._MEMO_MAX and len(block) <= self._BLOCK_MAX
              and block[:1] and block[0] & 0xE0 != 0x20):
            # (a block that opens with a table size update changes the table even when the
            # size stays the same, e.g. a resize to 0 that empties it: never remembered)
            self._memo[block] = headers
        return headers


def request_head(headers: list[tuple[bytes, bytes]]) -> RequestHead:
    """The path and channel token of a request; ProtocolError (PROTOCOL_ERROR) when the
    fields make a malformed request (RFC 9113 §8.1.1, a stream error we treat as the
    connection's)."""
    path: bytes | None = None
    token: bytes | None = None
    seen: set[bytes] = set()
    regular = False
    for name, value in headers:
        if not name or _BAD_NAME.search(name) or _BAD_VALUE.search(value):
            raise _malformed(f"bad field {name[:40]!r}")
        if name[0] == 0x3A:  # ':'
            if regular or name not in _REQUEST_PSEUDO or name in seen:
                raise _malformed(f"misplaced, unknown or repeated {name[:40]!r}")
            seen.add(name)
            if name == b":path":
                path = value
            continue
        regular = True
        if name in _CONNECTION_SPECIFIC or (name == b"te" and value != b"trailers"):
            raise _malformed(f"connection-specific field {name!r}")
        if name == _TOKEN:
            # Repeated, it is refused (b"" never matches), whichever copy is right.
            token = value if token is None else b""
    if not path or not seen >= _REQUIRED_PSEUDO:
        raise _malformed("a request without :method, :scheme or :path")
    return path, token


def check_trailers(headers: list[tuple[bytes, bytes]]) -> None:
    for name, _ in headers:
        if name[:1] == b":":
            raise _malformed("a pseudo-header in trailers")


def _malformed(reason: str) -> ProtocolError:
    return ProtocolError(f.PROTOCOL_ERROR, f"malformed request: {reason}")


class _CountingTable(HeaderTable):
    """hpack's dynamic table, counting every change (insertions and evictions, which are
    all the table's own methods make)."""

    def __init__(self) -> None:
        super().__init__()
        self.changes = 0

    def add(self, name: bytes, value: bytes) -> None:
        self.changes += 1
        super().add(name, value)

    def _shrink(self) -> None:
        self.changes += 1
        super()._shrink()
