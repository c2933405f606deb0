"""HPACK decoding of request header blocks (RFC 7541), with the `hpack` package.

The decoder's dynamic table must follow every block of the connection, in order, so every
block is decoded, including those of calls we refuse.
"""

from __future__ import annotations

import hpack
from hpack.table import HeaderTable

from sidecar.grpcwire import frames as f
from sidecar.grpcwire.frames import ProtocolError


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
        elif (len(self._memo) < self._MEMO_MAX and len(block) <= self._BLOCK_MAX
              and block[:1] and block[0] & 0xE0 != 0x20):
            # (a block that opens with a table size update changes the table even when the
            # size stays the same, e.g. a resize to 0 that empties it: never remembered)
            self._memo[block] = headers
        return headers


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
