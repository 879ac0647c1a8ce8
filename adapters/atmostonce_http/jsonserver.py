"""json-server (the npm package, 0.17.4) as a REST platform nobody here wrote: ``POST /posts`` stores the
posted JSON and answers it with an ``id`` added; ``GET /posts/{id}`` reads it back; ``GET /posts?key=K``
answers the array of posts whose ``key`` field is ``K`` (empty when there is none).

The package is installed with npm into ``build/npm/json-server-<version>`` of the source tree once (npm's own
cache serves later installs; outside a source tree into ``~/.cache/atmostonce/npm``, or ``$ATMOSTONCE_NPM_PREFIX``)
and run with the machine's node on 127.0.0.1, on a throwaway data file per server. Used by the tests
(tests/http/test_rest_platform.py) and by ``atmostonce demo --platform json-server``.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx

from .profile import load_profile

VERSION = "0.17.4"
PAGED_VERSION = "1.0.0-beta.3"
"""json-server's 1.0 line, whose paginated reads (``GET /posts?key=K&_page=1&_per_page=1``) wrap the filtered array as
``{"first": ..., "items": N, "data": [...]}``: the wrapped lookup answer of many REST APIs, from a server nobody
here wrote (``JsonServer(folder, version=PAGED_VERSION)``)."""
__all__ = [
    "INSTALL_HINT",
    "PAGED_VERSION",
    "VERSION",
    "JsonServer",
    "installed",
    "json_server_profile",
    "posts_by_key",
    "prefix",
]

INSTALL_HINT = (
    f"json-server {VERSION} runs on node: install node and npm (Debian: apt-get install nodejs npm), then "
    f"`npm install --prefix build/npm/json-server-{VERSION} json-server@{VERSION}` (or let the demo do it)"
)


def prefix(version: str = VERSION) -> Path:
    """Where json-server ``version`` is installed: under ``$ATMOSTONCE_NPM_PREFIX``, else ``build/npm/`` of the
    source tree."""
    if os.environ.get("ATMOSTONCE_NPM_PREFIX"):
        return Path(os.environ["ATMOSTONCE_NPM_PREFIX"]) / f"json-server-{version}"
    root = Path(__file__).resolve().parents[2]
    base = (
        root / "build" / "npm" if (root / "pyproject.toml").is_file() else Path.home() / ".cache" / "atmostonce" / "npm"
    )
    return base / f"json-server-{version}"


def installed(version: str = VERSION) -> Path:
    """The json-server executable of ``version``, installing it first when missing. Raises ``RuntimeError``
    without node/npm."""
    where = prefix(version)
    exe = where / "node_modules" / ".bin" / "json-server"
    if exe.exists() and shutil.which("node") is not None:
        return exe
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        raise RuntimeError(f"json-server needs node and npm on PATH. {INSTALL_HINT}")
    where.mkdir(parents=True, exist_ok=True)
    with open(where / ".lock", "w") as lock:  # test workers in parallel install it once
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not exe.exists():
            subprocess.run(
                [
                    npm,
                    "install",
                    "--no-audit",
                    "--no-fund",
                    "--silent",
                    "--prefix",
                    str(where),
                    f"json-server@{version}",
                ],
                check=True,
                timeout=300,
            )
    return exe


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class JsonServer:
    """One json-server process on loopback with an empty ``posts`` collection; a context manager. ``version``:
    the npm package's version (:data:`VERSION`, or :data:`PAGED_VERSION` for wrapped paginated reads)."""

    def __init__(self, folder: Path, version: str = VERSION):
        self.folder = folder
        self.version = version
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> JsonServer:
        exe = installed(self.version)
        db = self.folder / "db.json"
        db.write_text('{"posts": []}', encoding="utf-8")
        quiet = ["--quiet"] if self.version.startswith("0.") else []  # the 1.0 line has no such option
        self.proc = subprocess.Popen(
            [str(exe), "--host", "127.0.0.1", "--port", str(self.port), *quiet, str(db)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=self.folder,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/posts", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        self.__exit__()
        raise RuntimeError("json-server did not start")

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def posts(self) -> list[dict[str, Any]]:
        """Every post the server holds, read straight from it (not through any transport of ours)."""
        return json.loads(httpx.get(self.url + "/posts", timeout=5).content)

    def edit(self, post_id: str, **fields: Any) -> None:
        """Change a stored post on the platform (as a moderator or another client would)."""
        httpx.patch(f"{self.url}/posts/{post_id}", json=fields, timeout=5).raise_for_status()


def json_server_profile(url: str, **overrides: Any) -> dict[str, Any]:
    """The shipped profile ``spec/platforms/json_server.toml`` with the server's ``url`` filled in, as the plain
    mapping ``HttpPlatformConfig.from_mapping`` takes (``overrides`` replace its fields, checked alike)."""
    config = load_profile("json-server", base_url=url, **overrides).config
    assert config is not None
    return config.as_mapping()


def posts_by_key(server: JsonServer, field: str = "key") -> dict[str, int]:
    """How many posts the server holds per value of ``field`` (the profile's ``key_field``), read from the
    server's own collection: a count above 1 is a duplicate."""
    out: dict[str, int] = {}
    for post in server.posts():
        value = post.get(field)
        if isinstance(value, str):
            out[value] = out.get(value, 0) + 1
    return out
