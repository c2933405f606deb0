"""HTTP/2 framing (RFC 9113) and the few HPACK encodings (RFC 7541) a gRPC server answers with.

Only what the server side of gRPC needs: frame headers in and out, the fixed response header
block, and trailers. Our header blocks use literals *without indexing* only, so the encoder
keeps no dynamic table and never has to follow the peer's table-size settings.
"""

from __future__ import annotations

import struct

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
FRAME_HEADER = struct.Struct(">HBBBI")  # 24-bit length as (high 16, low 8), type, flags, id
MESSAGE_PREFIX = struct.Struct(">BI")  # gRPC: compressed flag, message length

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS = 0, 1, 2, 3, 4
PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 5, 6, 7, 8, 9

END_STREAM = 0x1
ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20

SETTINGS_HEADER_TABLE_SIZE = 0x1
SETTINGS_ENABLE_PUSH = 0x2
SETTINGS_MAX_CONCURRENT_STREAMS = 0x3
SETTINGS_INITIAL_WINDOW_SIZE = 0x4
SETTINGS_MAX_FRAME_SIZE = 0x5
SETTINGS_MAX_HEADER_LIST_SIZE = 0x6

NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0x0, 0x1, 0x2, 0x3
STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL = 0x5, 0x6, 0x7, 0x8
COMPRESSION_ERROR, ENHANCE_YOUR_CALM = 0x9, 0xB

DEFAULT_WINDOW = 65_535
DEFAULT_MAX_FRAME = 16_384
MAX_FRAME_LIMIT = 2**24 - 1
MAX_WINDOW = 2**31 - 1
DEFAULT_TABLE_SIZE = 4_096
TABLE_SIZE_ZERO = b"\x20"  # HPACK dynamic table size update to 0 (RFC 7541 §6.3)


class ProtocolError(Exception):
    """A connection-level protocol error (RFC 9113 §5.4.1): GOAWAY with `code`, then close."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code


def header(kind: int, flags: int, stream_id: int, size: int) -> bytes:
    return FRAME_HEADER.pack(size >> 8, size & 0xFF, kind, flags, stream_id)


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return header(kind, flags, stream_id, len(payload)) + payload


def settings(values: dict[int, int]) -> bytes:
    return frame(SETTINGS, 0, 0, b"".join(struct.pack(">HI", k, v) for k, v in values.items()))


def window_update(stream_id: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream_id, struct.pack(">I", increment))


def rst_stream(stream_id: int, code: int) -> bytes:
    return frame(RST_STREAM, 0, stream_id, struct.pack(">I", code))


def goaway(last_stream_id: int, code: int, debug: bytes = b"") -> bytes:
    return frame(GOAWAY, 0, 0, struct.pack(">II", last_stream_id, code) + debug)


def _integer(value: int, prefix_bits: int, first: int) -> bytes:
    """HPACK integer with an N-bit prefix; `first` carries the pattern bits above it."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out = [first | limit]
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _string(raw: bytes) -> bytes:
    return _integer(len(raw), 7, 0) + raw  # never Huffman-coded: simpler, and always valid


def literal(name: bytes, value: bytes) -> bytes:
    """Literal header field without indexing, new name (RFC 7541 §6.2.2)."""
    return b"\x00" + _string(name) + _string(value)


# `:status: 200` is static-table entry 8; `content-type` is static name 31.
RESPONSE_HEADERS = b"\x88" + _integer(31, 4, 0) + _string(b"application/grpc")


def trailers(status: int, message: str = "") -> bytes:
    block = literal(b"grpc-status", str(status).encode())
    if message:
        block += literal(b"grpc-message", _percent_encode(message[:1024]))
    return block


def _percent_encode(message: str) -> bytes:
    """gRPC's grpc-message encoding: printable ASCII except '%' as is, the rest %XX."""
    return b"".join(
        bytes([byte]) if 0x20 <= byte <= 0x7E and byte != 0x25 else b"%%%02X" % byte
        for byte in message.encode())
