"""HTTP transport for atmostonce, plus a local platform sink to test it against.

* :class:`HttpTransport` (``atmostonce.transport.Transport`` on httpx, retries off) and
  :class:`AsyncHttpTransport` (``atmostonce.transport.AsyncTransport`` on ``httpx.AsyncClient``, the same classification).
* :class:`HttpPlatformConfig`: a JSON REST platform described as data; :func:`sink_config` for the sink.
* :class:`HttpTransportError`: a read-back or lookup got no usable answer.
* :class:`PlatformSink`: a local posting API with fault injection (imported lazily).

Send outcomes are classified by ``spec/http_outcomes.toml`` (:mod:`atmostonce_http.classify`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .transport import AsyncHttpTransport, HttpPlatformConfig, HttpTransport, HttpTransportError, sink_config

if TYPE_CHECKING:
    from .sink import PlatformSink

__all__ = [
    "AsyncHttpTransport",
    "HttpPlatformConfig",
    "HttpTransport",
    "HttpTransportError",
    "PlatformSink",
    "sink_config",
]


def __getattr__(name: str) -> Any:
    # Lazy, so that ``python -m atmostonce_http.sink`` does not import the module twice.
    if name == "PlatformSink":
        from .sink import PlatformSink

        return PlatformSink
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
