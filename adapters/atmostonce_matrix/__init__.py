"""Matrix transport for atmostonce, plus a throwaway Synapse and a TCP fault proxy to test it against (docs/matrix.md).

* :class:`MatrixTransport` (``atmostonce.transport.Transport`` on httpx, retries off) and :class:`MatrixConfig`.
* :class:`MatrixTransportError`: a login, read-back or lookup got no usable answer.
* :class:`ResendStatus`: whether a txnId may still be resent under the declared window.
* :mod:`atmostonce_matrix.synapse`: :class:`SynapseServer`, a local homeserver for tests and the demo.
* :mod:`atmostonce_matrix.proxy`: :class:`FaultProxy`, per-connection fault plans.
* :mod:`atmostonce_matrix.demo`: :func:`run_matrix_demo`.

Send outcomes are classified by ``spec/matrix_outcomes.toml`` (:mod:`atmostonce_matrix.classify`).
Design notes: ``docs/matrix.md``.
"""

from __future__ import annotations

from .transport import (
    DEFAULT_RESEND_WINDOW,
    KEY_FIELD,
    MatrixConfig,
    MatrixTransport,
    MatrixTransportError,
    ResendStatus,
)

__all__ = [
    "DEFAULT_RESEND_WINDOW",
    "KEY_FIELD",
    "MatrixConfig",
    "MatrixTransport",
    "MatrixTransportError",
    "ResendStatus",
]
