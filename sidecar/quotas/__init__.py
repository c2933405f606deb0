"""Caller quotas and admission (docs/quotas.md): in-process counters consulted on the
request path, fed by the access log, optionally reconciled with Redis in the background."""
