"""A throwaway Synapse homeserver for tests and the demo (docs/matrix.md).

Nothing is installed at run time: Synapse must already be importable by the
Python that runs it (the project's ``test`` extras carry ``matrix-synapse``).
:class:`SynapseServer` writes a complete homeserver config into a temporary
folder (no ``--generate-config`` round trip: the signing key comes from
``signedjson``, which Synapse itself depends on), picks a free port on
127.0.0.1, starts ``python -m synapse.app.homeserver -c CONFIG`` and waits
until ``/_matrix/client/versions`` answers. It stops the process by pid
(SIGTERM, then SIGKILL after a grace period) and removes the folder.

The homeserver is as small and quiet as Synapse allows, to start fast
(about 1.5 s here on SQLite, most of it importing Synapse and creating the schema):

* one HTTP listener on 127.0.0.1 with only the client and admin resources:
  no federation listener, ``federation_domain_whitelist: []``,
  ``trusted_key_servers: []``; nothing leaves the loopback interface;
* SQLite in the temporary folder; presence, the user directory, URL previews,
  the media repository and metrics off; logging to ``homeserver.log`` at WARNING;
* ``registration_shared_secret`` set, so users come from the shared-secret
  admin API (:meth:`SynapseServer.register_user`), with ``bcrypt_rounds: 4``;
* every ``rc_*`` rate limit raised far above what a test sends (a test that
  needs a real 429 overrides one user's limit with :meth:`SynapseServer.override_ratelimit`).

If Synapse is not importable, or the process exits or does not answer within
``start_timeout`` seconds, :meth:`SynapseServer.start` raises
:class:`SynapseError` with the tail of the log: tests using it fail, they
never skip.

Use::

    with SynapseServer() as hs:
        user = hs.register_user("alice", "secret")      # MatrixUser(user_id, access_token, device_id, password)
        room = hs.create_room(user.access_token)        # "!abc:atmostonce.test"
        hs.url                                          # "http://127.0.0.1:PORT"
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import hmac
import importlib.util
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

__all__ = ["MatrixUser", "SynapseError", "SynapseServer", "free_port", "homeserver_config"]

SERVER_NAME = "atmostonce.test"

_FAST = {"per_second": 100000, "burst_count": 100000}
RATE_LIMITS: dict[str, Any] = {
    "rc_message": _FAST,
    "rc_registration": _FAST,
    "rc_registration_token_validity": _FAST,
    "rc_login": {"address": _FAST, "account": _FAST, "failed_attempts": _FAST},
    "rc_admin_redaction": _FAST,
    "rc_joins": {"local": _FAST, "remote": _FAST},
    "rc_joins_per_room": _FAST,
    "rc_3pid_validation": _FAST,
    "rc_invites": {"per_room": _FAST, "per_user": _FAST, "per_issuer": _FAST},
    "rc_third_party_invite": _FAST,
    "rc_media_create": _FAST,
    "rc_key_requests": _FAST,
    "rc_presence": {"per_user": _FAST},
    "rc_delayed_event_mgmt": _FAST,
    "rc_room_creation": _FAST,
    "rc_reports": _FAST,
    "rc_user_directory": _FAST,
    "rc_profile": _FAST,
}
"""Every ``rc_*`` limit Synapse 1.163 reads, raised to 100,000 per second (unknown keys are ignored by Synapse)."""


class SynapseError(RuntimeError):
    """Synapse could not be started, did not answer, or refused an admin call."""


@dataclass(frozen=True)
class MatrixUser:
    user_id: str
    access_token: str
    device_id: str
    password: str

    @property
    def localpart(self) -> str:
        return self.user_id[1:].split(":", 1)[0]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (the kernel's choice)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _log_config(path: Path) -> dict[str, Any]:
    return {
        "version": 1,
        "formatters": {"plain": {"format": "%(asctime)s %(name)s %(levelname)s %(message)s"}},
        "handlers": {"file": {"class": "logging.FileHandler", "filename": str(path), "formatter": "plain"}},
        "root": {"level": "WARNING", "handlers": ["file"]},
        "disable_existing_loggers": False,
    }


def homeserver_config(folder: Path, port: int, *, server_name: str = SERVER_NAME, shared_secret: str) -> dict[str, Any]:
    """The homeserver config (as a JSON-compatible mapping; JSON is YAML) for a server rooted in ``folder``."""
    return {
        "server_name": server_name,
        "public_baseurl": f"http://127.0.0.1:{port}/",
        "pid_file": str(folder / "homeserver.pid"),
        "listeners": [
            {
                "port": port,
                "bind_addresses": ["127.0.0.1"],
                "type": "http",
                "tls": False,
                "x_forwarded": False,
                "resources": [{"names": ["client"], "compress": False}],
            }
        ],
        "database": {"name": "sqlite3", "args": {"database": str(folder / "homeserver.db")}},
        "log_config": str(folder / "log.config"),
        "media_store_path": str(folder / "media_store"),
        "signing_key_path": str(folder / "signing.key"),
        "report_stats": False,
        "registration_shared_secret": shared_secret,
        "macaroon_secret_key": secrets.token_hex(32),
        "form_secret": secrets.token_hex(32),
        "enable_registration": False,
        "bcrypt_rounds": 4,
        "trusted_key_servers": [],
        "suppress_key_server_warning": True,
        "federation_domain_whitelist": [],
        "send_federation": False,
        "presence": {"enabled": False},
        "user_directory": {"enabled": False},
        "url_preview_enabled": False,
        "enable_metrics": False,
        "enable_media_repo": False,
        "require_auth_for_profile_requests": False,
        "limit_remote_rooms": {"enabled": False},
        "caches": {"global_factor": 0.5},
        **RATE_LIMITS,
    }


class SynapseServer:
    """One Synapse process on 127.0.0.1 with its own temporary folder. See the module docstring.

    ``folder``: where config, database and log go (default: a new temporary
    folder, removed by :meth:`stop`); ``python``: the interpreter that imports
    Synapse (default: this one); ``start_timeout``: seconds to wait for it.
    """

    def __init__(
        self,
        folder: str | os.PathLike[str] | None = None,
        *,
        python: str = sys.executable,
        server_name: str = SERVER_NAME,
        start_timeout: float = 60.0,
    ):
        self._own_folder = folder is None
        self.folder = Path(folder) if folder is not None else Path(tempfile.mkdtemp(prefix="atmostonce-synapse-"))
        self.python = python
        self.server_name = server_name
        self.start_timeout = start_timeout
        self.shared_secret = secrets.token_hex(16)
        self.port: int | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self.startup_seconds: float | None = None
        self._users = 0

    # ---------------------------------------------------------------- lifecycle
    @property
    def url(self) -> str:
        if self.port is None:
            raise SynapseError("Synapse is not started")
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def log_path(self) -> Path:
        return self.folder / "homeserver.log"

    def log_tail(self, lines: int = 40) -> str:
        parts = []
        for name in ("homeserver.log", "stderr.log"):
            p = self.folder / name
            if p.exists():
                text = p.read_text("utf-8", errors="replace").splitlines()[-lines:]
                parts.append(f"--- {name}\n" + "\n".join(text))
        return "\n".join(parts) or "(no log)"

    def write_config(self) -> Path:
        """Write config, log config and signing key into :attr:`folder`; returns the config path."""
        if self._own_folder or not self.folder.exists():
            self.folder.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        (self.folder / "media_store").mkdir(exist_ok=True)
        (self.folder / "log.config").write_text(json.dumps(_log_config(self.log_path), indent=1), "utf-8")
        try:
            from signedjson.key import generate_signing_key, write_signing_keys
        except ImportError as exc:  # pragma: no cover - synapse depends on signedjson
            raise SynapseError(
                "signedjson is not importable: install the test extras (matrix-synapse) into this environment"
            ) from exc
        with open(self.folder / "signing.key", "w", encoding="utf-8") as f:
            write_signing_keys(f, [generate_signing_key("a_" + secrets.token_hex(2))])
        config = homeserver_config(
            self.folder, self.port, server_name=self.server_name, shared_secret=self.shared_secret
        )
        path = self.folder / "homeserver.yaml"
        path.write_text(json.dumps(config, indent=1), "utf-8")
        return path

    def start(self) -> SynapseServer:
        """Write the config, start Synapse and wait until it answers. Raises :class:`SynapseError`.

        A port taken between choosing it and binding it (another process was quicker) is
        retried with a new port, twice at most; any other failure raises at once.
        """
        if self.process is not None:
            raise SynapseError("Synapse is already started")
        if self.python == sys.executable and importlib.util.find_spec("synapse") is None:
            raise SynapseError(
                f"Synapse is not importable by {sys.executable}: install the project's test extras "
                "(`pip install -e '.[test]'`, which brings matrix-synapse)"
            )
        for tries_left in (2, 1, 0):
            try:
                return self._start_once()
            except SynapseError as exc:
                if not tries_left or "Address already in use" not in str(exc):
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _start_once(self) -> SynapseServer:
        config = self.write_config()
        began = time.monotonic()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SYNAPSE_", "HTTP_PROXY", "HTTPS_PROXY"))}
        env["PYTHONUNBUFFERED"] = "1"
        stderr = open(self.folder / "stderr.log", "wb")
        try:
            self.process = subprocess.Popen(
                [self.python, "-m", "synapse.app.homeserver", "-c", str(config)],
                cwd=self.folder,
                stdin=subprocess.DEVNULL,
                stdout=stderr,
                stderr=stderr,
                env=env,
                start_new_session=True,
            )
        finally:
            stderr.close()
        atexit.register(self._kill_at_exit, self.process)  # never leave a homeserver behind a dying test run
        deadline = began + self.start_timeout
        with httpx.Client(timeout=2.0, trust_env=False) as client:
            while True:
                code = self.process.poll()
                if code is not None:
                    self.process = None
                    raise SynapseError(
                        f"Synapse exited with status {code} while starting (folder {self.folder}):\n{self.log_tail()}"
                    )
                try:
                    if client.get(self.url + "/_matrix/client/versions").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    self.stop(remove=False)
                    raise SynapseError(
                        f"Synapse did not answer within {self.start_timeout} s on {self.url}:\n{self.log_tail()}"
                    )
                time.sleep(0.05)
        self.startup_seconds = time.monotonic() - began
        return self

    @staticmethod
    def _kill_at_exit(proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)

    def stop(self, *, remove: bool | None = None, grace: float = 10.0) -> None:
        """Stop the process by pid (SIGTERM, SIGKILL after ``grace`` seconds); remove an own temporary folder."""
        proc, self.process = self.process, None
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=grace)
        if remove if remove is not None else self._own_folder:
            shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> SynapseServer:
        return self.start() if self.process is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---------------------------------------------------------------- admin calls
    def _call(self, method: str, path: str, *, token: str | None = None, json_body: Any = None) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        with httpx.Client(timeout=30.0, trust_env=False) as client:
            r = client.request(method, self.url + path, json=json_body, headers=headers)
        if r.status_code != 200:
            raise SynapseError(f"{method} {path} answered HTTP {r.status_code}: {r.text[:300]}")
        return r.json()

    def register_user(
        self, localpart: str | None = None, password: str | None = None, *, admin: bool = False
    ) -> MatrixUser:
        """Create a user with the shared-secret admin API; returns its first login (token and device)."""
        if localpart is None:
            self._users += 1
            localpart = f"user{self._users}-{secrets.token_hex(3)}"
        password = password or secrets.token_urlsafe(12)
        nonce = self._call("GET", "/_synapse/admin/v1/register")["nonce"]
        mac = hmac.new(self.shared_secret.encode(), digestmod=hashlib.sha1)
        for part in (nonce, localpart, password, "admin" if admin else "notadmin"):
            if part != nonce:
                mac.update(b"\x00")
            mac.update(part.encode())
        body = {"nonce": nonce, "username": localpart, "password": password, "admin": admin, "mac": mac.hexdigest()}
        r = self._call("POST", "/_synapse/admin/v1/register", json_body=body)
        return MatrixUser(r["user_id"], r["access_token"], r["device_id"], password)

    def create_room(self, access_token: str, *, invite: tuple[str, ...] = (), name: str = "atmostonce") -> str:
        """Create a private room owned by the token's user; returns its room id."""
        body = {"preset": "private_chat", "name": name, "invite": list(invite)}
        return self._call("POST", "/_matrix/client/v3/createRoom", token=access_token, json_body=body)["room_id"]

    def join_room(self, access_token: str, room_id: str) -> None:
        self._call("POST", f"/_matrix/client/v3/join/{room_id}", token=access_token, json_body={})

    def override_ratelimit(self, admin_token: str, user_id: str, *, messages_per_second: int, burst_count: int) -> None:
        """Give ``user_id`` its own message rate limit (admin API, integers); 0 and 0 mean no limit at all."""
        self._call(
            "POST",
            f"/_synapse/admin/v1/users/{user_id}/override_ratelimit",
            token=admin_token,
            json_body={"messages_per_second": messages_per_second, "burst_count": burst_count},
        )

    def room_messages(self, access_token: str, room_id: str, *, event_type: str = "m.room.message") -> list[dict]:
        """Every event of ``event_type`` in the room, oldest first (pages the whole history; for assertions)."""
        events: list[dict] = []
        token: str | None = None
        filt = json.dumps({"types": [event_type]})
        with httpx.Client(timeout=30.0, trust_env=False) as client:
            while True:
                params = {"dir": "f", "limit": "500", "filter": filt}
                if token:
                    params["from"] = token
                r = client.get(
                    f"{self.url}/_matrix/client/v3/rooms/{room_id}/messages",
                    params=params,
                    headers={"Authorization": f"Bearer {access_token}"},
                )
                if r.status_code != 200:
                    raise SynapseError(f"/messages answered HTTP {r.status_code}: {r.text[:300]}")
                doc = r.json()
                chunk = doc.get("chunk", [])
                events.extend(e for e in chunk if e.get("type") == event_type)
                token = doc.get("end")
                if not chunk or not token:
                    return events
