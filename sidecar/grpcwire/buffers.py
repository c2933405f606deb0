"""Dropping consumed bytes from the front of a receive buffer (the connection's partial
frame, a call's inbox).

Its own module because every reading module needs it and it has one subtlety: the
connection hands out views of these bytearrays (a message to its handler, a frame to the
parser), and a view that outlives its read (a traceback kept by a log handler holds the
frames that had one) pins the bytearray, which then cannot shrink in place.
"""

from __future__ import annotations


def consume(owner: object, name: str, used: int) -> None:
    """Drop the first `used` bytes of the bytearray `owner.<name>`. If a view of it is still
    alive somewhere, the rest moves to a new bytearray instead."""
    if not used:
        return
    data: bytearray = getattr(owner, name)
    try:
        del data[:used]
    except BufferError:
        setattr(owner, name, bytearray(memoryview(data)[used:]))
