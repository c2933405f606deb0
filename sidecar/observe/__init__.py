"""Observations: rolling per-target figures learned from Envoy's access logs, read by the
routing core through `ObservationView`. Nothing here is on the response path."""
