"""The gateway: what to do with one HTTP exchange, independent of how Envoy delivers it.

`Gateway` authenticates the caller, reads the body, asks the routing core for a decision
and returns either a `Reply` (answer the caller now) or a `Forward` (send upstream, with
these rewrites). The ext_proc adapter only translates those two outcomes into Envoy messages.
"""

from sidecar.gateway.handler import Gateway
from sidecar.gateway.outcome import Forward, Reply
from sidecar.gateway.pending import Pending
from sidecar.gateway.runtime import Runtime, StartupError

__all__ = ["Forward", "Gateway", "Pending", "Reply", "Runtime", "StartupError"]
