"""Telemetry: joined request rows, fallback rows, their storage, reports and rollups
(docs/telemetry.md). Nothing here runs on the routing hot path except `Joiner.decided`, a
dict insert."""
