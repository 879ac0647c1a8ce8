"""``atmostonce console``: a web console for the states a person owns (docs/console.md).

``create_app(store, credentials=..., action_log=...)`` builds the Starlette application; ``serve(...)`` runs
it with uvicorn; ``atmostonce_console.settle`` is the bulk settle the console and ``atmostonce settle``
share. Needs the ``[console]`` extra (starlette, jinja2, itsdangerous, python-multipart, uvicorn).
"""

from __future__ import annotations

import ipaddress
import os
from typing import Any

__all__ = ["TOKEN_ENV", "create_app", "credentials_from", "is_loopback", "serve"]

TOKEN_ENV = "ATMOSTONCE_CONSOLE_TOKEN"
SECRET_ENV = "ATMOSTONCE_CONSOLE_SECRET"


def create_app(*args: Any, **kw: Any):
    from .app import create_app as make

    return make(*args, **kw)


def credentials_from(token_file: str | None):
    """The sign-in tokens: ``token_file`` (lines ``NAME:TOKEN`` or a bare shared ``TOKEN``), else the
    ``$ATMOSTONCE_CONSOLE_TOKEN`` environment variable (one shared token). ``ValueError`` without either."""
    from .app import Credentials

    if token_file:
        return Credentials.from_file(token_file)
    token = os.environ.get(TOKEN_ENV, "").strip()
    if not token:
        raise ValueError(f"the console needs a sign-in token: --token-file FILE or ${TOKEN_ENV}")
    return Credentials([token])


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve(app, *, host: str = "127.0.0.1", port: int = 8080, log_level: str = "warning") -> None:
    import uvicorn

    uvicorn.run(app, host=host, port=port, log_level=log_level, access_log=False)
