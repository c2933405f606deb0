"""Replicas of one gateway sharing what each learns, through Redis in short rounds
(docs/fleet.md). Nothing here is on the request path."""
