"""Thin Envoy ext_proc adapter: Envoy messages in, gateway outcomes out as mutations."""
