"""Throwaway local PostgreSQL clusters for tests and benchmarks.

Dependency-free (stdlib + psycopg). The server binaries (``initdb``, ``pg_ctl``, ``postgres``) must be installed
locally; ``.ci/install-postgres.sh`` installs them on a Debian/Ubuntu machine.

PostgreSQL refuses to run as root. When this process runs as root the cluster is created and run as the
unprivileged ``postgres`` OS user (created by the distribution package); otherwise it runs as the current user.

The server listens on a unix socket only (``listen_addresses=''``); nothing is exposed over TCP. Durability is
switched off by default (``fsync``, ``synchronous_commit`` and ``full_page_writes`` are ``off``), which is safe
for data that is discarded after the run.

Python use::

    with LocalCluster() as pg:                      # ~1 s: initdb + start
        url = pg.create_database("t1")             # SQLAlchemy URL of the new database
        ...

    base_url, cleanup = postgres_url_for_tests()    # $DATABASE_URL, Docker, or a LocalCluster

Command line (a long-lived cluster for a Makefile or CI job)::

    python -m atmostonce_sql.pgserver start --dir D [--port P] [--fsync]   # prints the URL
    python -m atmostonce_sql.pgserver url --dir D [--dsn] [--db NAME]
    python -m atmostonce_sql.pgserver stop --dir D                         # stops and removes D
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import grp
import json
import os
import pwd
import re
import shlex
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

__all__ = [
    "ClusterError",
    "LocalCluster",
    "PgBinariesNotFound",
    "find_pg_bin",
    "postgres_url_for_tests",
]

_REQUIRED_BINARIES = ("initdb", "pg_ctl", "postgres")
_STATE_FILE = "atmostonce-pgserver.json"
_SUPERUSER = "postgres"
# sun_path is 108 bytes on Linux (107 usable); the socket file is "<dir>/.s.PGSQL.<port>".
_MAX_SOCKET_DIR_LEN = 107 - len("/.s.PGSQL.65535")


class PgBinariesNotFound(FileNotFoundError):
    """No folder holding ``initdb``, ``pg_ctl`` and ``postgres`` was found."""


class ClusterError(RuntimeError):
    """A cluster could not be created, started, stopped or attached to. The message includes tool output."""


# --------------------------------------------------------------------------------------------------------------
# Locating the binaries


def _has_binaries(folder: Path) -> bool:
    try:
        return all((folder / name).is_file() and os.access(folder / name, os.X_OK) for name in _REQUIRED_BINARIES)
    except OSError:  # e.g. an unreadable PATH entry
        return False


def _version_key(folder: Path) -> tuple[int, ...]:
    # /usr/lib/postgresql/<version>/bin -> numeric sort key; non-numeric versions sort first.
    return tuple(int(p) for p in re.findall(r"\d+", folder.parent.name)) or (-1,)


def find_pg_bin() -> Path:
    """Return the folder holding ``initdb``, ``pg_ctl`` and ``postgres``.

    Search order:

    1. ``$PG_BIN`` if set. It is authoritative: if it lacks the binaries, :class:`PgBinariesNotFound` is raised
       rather than falling through to another installation.
    2. ``pg_config --bindir`` (if ``pg_config`` is on ``PATH``).
    3. ``/usr/lib/postgresql/<version>/bin``, highest version first (Debian/Ubuntu layout).
    4. Each ``PATH`` entry; a ``pg_ctl`` symlink on ``PATH`` is also followed to the folder it points into
       (``/usr/local/bin/pg_ctl -> /usr/lib/postgresql/15/bin/pg_ctl`` yields the latter folder).

    Returns:
        An absolute :class:`~pathlib.Path` to a folder containing all three executables.

    Raises:
        PgBinariesNotFound: nothing found (install with ``.ci/install-postgres.sh``).
    """
    env_bin = os.environ.get("PG_BIN")
    if env_bin:
        folder = Path(env_bin).expanduser().resolve()
        if _has_binaries(folder):
            return folder
        raise PgBinariesNotFound(f"$PG_BIN={env_bin!r} does not contain all of {', '.join(_REQUIRED_BINARIES)}")

    candidates: list[Path] = []
    pg_config = shutil.which("pg_config")
    if pg_config:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, timeout=10, check=True)
            candidates.append(Path(out.stdout.strip()))
    candidates.extend(sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=_version_key, reverse=True))
    for entry in os.environ.get("PATH", "").split(os.pathsep):
        if not entry:
            continue
        candidates.append(Path(entry))
        pg_ctl = Path(entry) / "pg_ctl"
        with contextlib.suppress(OSError):
            if pg_ctl.is_symlink():
                candidates.append(pg_ctl.resolve().parent)

    for folder in candidates:
        if _has_binaries(folder):
            return folder.resolve()
    raise PgBinariesNotFound(
        "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found in $PG_BIN, `pg_config --bindir`, "
        "/usr/lib/postgresql/*/bin or PATH; run .ci/install-postgres.sh (apt-get install postgresql)"
    )


# --------------------------------------------------------------------------------------------------------------
# Helpers


def _free_port() -> int:
    """A port number not bound on 127.0.0.1 right now (used for the socket file name; TCP stays off)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _can_traverse(path: Path, uid: int, gids: set[int]) -> bool:
    """Whether ``uid`` (with groups ``gids``) can search every existing folder from ``/`` down to ``path``."""
    if uid == 0:
        return True
    for folder in [path, *path.parents]:
        try:
            st = folder.stat()
        except FileNotFoundError:
            continue
        if st.st_uid == uid:
            ok = st.st_mode & stat.S_IXUSR
        elif st.st_gid in gids:
            ok = st.st_mode & stat.S_IXGRP
        else:
            ok = st.st_mode & stat.S_IXOTH
        if not ok:
            return False
    return True


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _postgres_url(socket_dir: str, port: int, dbname: str) -> str:
    return f"postgresql+psycopg://{_SUPERUSER}@/{quote(dbname, safe='')}?host={quote(socket_dir, safe='/')}&port={port}"


class _RunAs:
    """The OS identity the server runs as: the current user, or ``postgres`` when we are root."""

    def __init__(self, name: str | None) -> None:
        if name is None:
            self.switch = False
            self.uid, self.gid = os.geteuid(), os.getegid()
            self.name = pwd.getpwuid(self.uid).pw_name if self._known(self.uid) else str(self.uid)
            self.gids = {self.gid, *os.getgroups()}
            return
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            raise ClusterError(
                f"running as root, but OS user {name!r} does not exist; PostgreSQL refuses to run as root. "
                "Install the postgresql package (it creates the user) or run .ci/install-postgres.sh"
            ) from None
        if entry.pw_uid == 0:
            raise ClusterError(f"OS user {name!r} is root; PostgreSQL refuses to run as root")
        self.switch = entry.pw_uid != os.geteuid()
        self.name, self.uid, self.gid = entry.pw_name, entry.pw_uid, entry.pw_gid
        self.gids = {self.gid, *(g.gr_gid for g in grp.getgrall() if name in g.gr_mem)}

    @staticmethod
    def _known(uid: int) -> bool:
        try:
            pwd.getpwuid(uid)
            return True
        except KeyError:
            return False

    def run(self, argv: list[str], *, cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env["LC_ALL"] = "C"
        kwargs: dict[str, Any] = {}
        if self.switch:
            env.update(HOME=str(cwd), USER=self.name, LOGNAME=self.name)
            kwargs.update(user=self.uid, group=self.gid, extra_groups=sorted(self.gids))
        return subprocess.run(
            argv,
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # the postmaster outlives Ctrl-C sent to our process group
            **kwargs,
        )

    def chown(self, path: Path) -> None:
        if self.switch:
            os.chown(path, self.uid, self.gid)


# --------------------------------------------------------------------------------------------------------------
# The cluster


class LocalCluster:
    """A throwaway PostgreSQL cluster in a private folder, reachable over a unix socket only.

    Layout of the folder (``directory``): ``data/`` (PGDATA), ``sock/`` (unix socket, unless that path is too
    long for a socket, then a private folder under ``/tmp``), ``server.log`` and ``atmostonce-pgserver.json``
    (the state read by :meth:`attach` and the CLI).

    Args:
        directory: Folder to hold the cluster. ``None`` (default): a fresh ``atmostonce-pg-*`` folder under the
            temp dir (``/tmp`` if the temp dir is not reachable by the server's OS user). If given it must be
            absent or empty, unless it already holds a cluster made by this class, which is then started again.
            Every ancestor must be searchable by the server's OS user, or :class:`ClusterError` is raised.
        port: Port number, used for the socket file name ``.s.PGSQL.<port>``. ``None``: a free port.
        fsync: ``False`` (default) sets ``fsync=off`` and ``synchronous_commit=off``; ``True`` keeps both on
            (for benchmarks that should pay for durability). ``full_page_writes`` is off either way.
        settings: Extra ``postgresql.conf`` parameters (name -> value), applied last; override the defaults.
        os_user: OS user to run the server as. ``None``: ``postgres`` when running as root, else the current user.
        pg_bin: Folder with the binaries; ``None``: :func:`find_pg_bin`.
        stop_at_exit: Register an :mod:`atexit` hook that calls :meth:`stop` if the caller never does.
        remove_on_stop: :meth:`stop` deletes ``directory`` (default ``True``).

    Attributes (after :meth:`start`): ``directory``, ``data_dir``, ``socket_dir`` (Paths), ``port`` (int),
    ``os_user`` (str).

    Raises:
        PgBinariesNotFound: from the constructor, when no binaries are found.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str] | None = None,
        *,
        port: int | None = None,
        fsync: bool = False,
        settings: dict[str, str | int | bool] | None = None,
        os_user: str | None = None,
        pg_bin: str | os.PathLike[str] | None = None,
        stop_at_exit: bool = True,
        remove_on_stop: bool = True,
    ) -> None:
        self.pg_bin = Path(pg_bin) if pg_bin is not None else find_pg_bin()
        self._requested_dir = Path(directory).absolute() if directory is not None else None
        self.port: int = port or 0
        self.fsync = fsync
        self.settings = dict(settings or {})
        self.stop_at_exit = stop_at_exit
        self.remove_on_stop = remove_on_stop
        if os_user is None and os.geteuid() == 0:
            os_user = _SUPERUSER
        self._run_as_name = os_user
        self._runas: _RunAs | None = None
        self.directory: Path | None = None
        self.data_dir: Path | None = None
        self.socket_dir: Path | None = None
        self._own_socket_dir = False
        self._atexit_registered = False
        self.os_user: str | None = None
        self.startup_seconds: float | None = None

    # -- lifecycle ---------------------------------------------------------------------------------------------

    def start(self) -> LocalCluster:
        """Create the cluster (``initdb``) if needed and start it (``pg_ctl -w start``); return ``self``.

        Takes about 1-2 s (``initdb --no-sync`` dominates); :attr:`startup_seconds` records the wall time.

        Raises:
            ClusterError: ``initdb`` or ``pg_ctl`` failed (message carries their output and the server log
                tail), the folder is unusable, the server is already running, or root has no ``postgres`` user.
        """
        t0 = time.monotonic()
        runas = self._runas = _RunAs(self._run_as_name)
        self.os_user = runas.name
        root = self._prepare_directory(runas)
        self.directory = root
        self.data_dir = root / "data"
        state = self._read_state(root)
        if state:  # re-start a cluster this class created earlier (e.g. after a reboot or a crash)
            self.port = self.port or state["port"]
            if self.is_running():
                raise ClusterError(f"a server is already running in {self.data_dir}")
        if not self.port:
            self.port = _free_port()
        self._prepare_socket_dir(runas, root, state)
        if not (self.data_dir / "PG_VERSION").exists():
            self._initdb(runas)
        self._write_state()
        self._pg_ctl_start(runas)
        if self.stop_at_exit and not self._atexit_registered:
            atexit.register(self.stop)
            self._atexit_registered = True
        self.startup_seconds = time.monotonic() - t0
        return self

    def stop(self) -> None:
        """Stop the server (``pg_ctl stop -m immediate``) and, if ``remove_on_stop``, delete its folder. A kept
        folder is the one a later :meth:`start` of this object starts again: the same cluster, databases, port and
        URL (a restart).

        Idempotent: stopping a stopped or never-started cluster does nothing.

        Raises:
            ClusterError: ``pg_ctl stop`` failed while the server was still running.
        """
        if self._atexit_registered:
            atexit.unregister(self.stop)
            self._atexit_registered = False
        if self.directory is None or self._runas is None or self.data_dir is None:
            return
        if self.is_running():
            res = self._runas.run(
                [str(self.pg_bin / "pg_ctl"), "stop", "-D", str(self.data_dir), "-m", "immediate", "-w", "-t", "60"],
                cwd=self.directory,
                timeout=90,
            )
            if res.returncode != 0 and self.is_running():
                raise ClusterError(f"pg_ctl stop failed:\n{res.stdout}{res.stderr}")
        if self.remove_on_stop:
            shutil.rmtree(self.directory, ignore_errors=True)
            if self._own_socket_dir and self.socket_dir is not None:
                shutil.rmtree(self.socket_dir, ignore_errors=True)
        elif self._requested_dir is None:
            # a folder of its own, kept: the next start() starts this same cluster again (same port and URL)
            self._requested_dir = self.directory
        self.directory = None

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @classmethod
    def attach(cls, directory: str | os.PathLike[str], *, remove_on_stop: bool = True) -> LocalCluster:
        """Return a handle on a cluster created earlier in ``directory`` (e.g. by the CLI), without starting it.

        The handle exposes :attr:`url`, :attr:`dsn`, :meth:`is_running`, :meth:`stop` and the database methods.
        No :mod:`atexit` hook is registered.

        Raises:
            ClusterError: ``directory`` holds no cluster made by this class.
        """
        root = Path(directory).absolute()
        state = cls._read_state(root)
        if not state:
            raise ClusterError(f"no cluster state file {root / _STATE_FILE}")
        self = cls(
            root,
            port=state["port"],
            fsync=state.get("fsync", False),
            os_user=state["os_user"],
            pg_bin=state["pg_bin"],
            stop_at_exit=False,
            remove_on_stop=remove_on_stop,
        )
        self._runas = _RunAs(None if state["os_user"] == _RunAs(None).name else state["os_user"])
        self.os_user = state["os_user"]
        self.directory, self.data_dir = root, root / "data"
        self.socket_dir = Path(state["socket_dir"])
        self._own_socket_dir = state.get("own_socket_dir", False)
        return self

    def is_running(self) -> bool:
        """Whether a postmaster for this cluster's data dir is alive (checks ``postmaster.pid``)."""
        return self.postmaster_pid() is not None

    def postmaster_pid(self) -> int | None:
        """The postmaster's process id, or ``None`` when the server is not running."""
        if self.data_dir is None:
            return None
        try:
            pid = int((self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass  # alive, owned by another user
        return pid

    # -- connection strings ------------------------------------------------------------------------------------

    def _require_started(self) -> Path:
        if self.socket_dir is None or not self.port:
            raise ClusterError("cluster not started")
        return self.socket_dir

    def url_for(self, dbname: str) -> str:
        """SQLAlchemy URL of database ``dbname``:
        ``postgresql+psycopg://postgres@/<dbname>?host=<socket dir>&port=<port>`` (no password; trust auth)."""
        return _postgres_url(str(self._require_started()), self.port, dbname)

    def dsn_for(self, dbname: str) -> str:
        """libpq conninfo string for database ``dbname``, e.g. for :func:`psycopg.connect`."""
        from psycopg.conninfo import make_conninfo

        return make_conninfo(host=str(self._require_started()), port=self.port, user=_SUPERUSER, dbname=dbname)

    @property
    def url(self) -> str:
        """SQLAlchemy URL of the ``postgres`` database (see :meth:`url_for`)."""
        return self.url_for("postgres")

    @property
    def dsn(self) -> str:
        """libpq conninfo of the ``postgres`` database: ``host=<socket dir> port=<port> user=postgres dbname=postgres``."""
        return self.dsn_for("postgres")

    # -- databases ---------------------------------------------------------------------------------------------

    def create_database(self, name: str, template: str | None = None) -> str:
        """``CREATE DATABASE name [TEMPLATE template]``; return the new database's SQLAlchemy URL.

        A template database must have no other open connections while it is copied.

        Raises:
            psycopg.errors.DuplicateDatabase: ``name`` exists.
            psycopg.errors.ObjectInUse: ``template`` has open connections.
            psycopg.Error: other server errors.
        """
        import psycopg
        from psycopg import sql

        stmt = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
        if template is not None:
            stmt = sql.SQL("{} TEMPLATE {}").format(stmt, sql.Identifier(template))
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(stmt)
        return self.url_for(name)

    def drop_database(self, name: str) -> None:
        """``DROP DATABASE IF EXISTS name WITH (FORCE)``: terminates its connections; a missing name is no error.

        Raises:
            psycopg.Error: server errors (e.g. dropping ``postgres`` while connected to it).
        """
        import psycopg
        from psycopg import sql

        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))

    # -- internals ---------------------------------------------------------------------------------------------

    def _prepare_directory(self, runas: _RunAs) -> Path:
        if self._requested_dir is None:
            base = Path(tempfile.gettempdir())
            if not _can_traverse(base, runas.uid, runas.gids):
                base = Path("/tmp")
            root = Path(tempfile.mkdtemp(prefix="atmostonce-pg-", dir=base))
        else:
            root = self._requested_dir
            if not _can_traverse(root.parent, runas.uid, runas.gids):
                raise ClusterError(
                    f"OS user {runas.name!r} cannot reach {root} (an ancestor folder is not searchable); "
                    "choose a folder under /tmp"
                )
            if root.exists():
                if not root.is_dir():
                    raise ClusterError(f"{root} is not a directory")
                if any(root.iterdir()) and not (root / _STATE_FILE).exists():
                    raise ClusterError(f"{root} is not empty and holds no cluster made by {__name__}")
            else:
                root.mkdir(parents=True)
        root.chmod(0o755)
        runas.chown(root)
        return root

    def _prepare_socket_dir(self, runas: _RunAs, root: Path, state: dict[str, Any] | None) -> None:
        if state and state.get("own_socket_dir"):
            sock = Path(state["socket_dir"])
            self._own_socket_dir = True
            if not sock.exists():  # /tmp may have been cleaned
                sock.mkdir(mode=0o755)
        elif len(str(root / "sock")) <= _MAX_SOCKET_DIR_LEN:
            sock = root / "sock"
            sock.mkdir(mode=0o755, exist_ok=True)
        else:
            sock = Path(tempfile.mkdtemp(prefix="atmostonce-pgsock-", dir="/tmp"))
            self._own_socket_dir = True
        sock.chmod(0o755)
        runas.chown(sock)
        self.socket_dir = sock

    def _conf_lines(self) -> list[str]:
        params: dict[str, Any] = {
            "listen_addresses": "",
            "unix_socket_directories": str(self.socket_dir),
            "port": self.port,
            "max_connections": 200,
            "shared_buffers": "128MB",
            "fsync": "on" if self.fsync else "off",
            "synchronous_commit": "on" if self.fsync else "off",
            "full_page_writes": "off",
            "log_min_messages": "warning",
        }
        params.update(self.settings)
        out = []
        for key, value in params.items():
            if isinstance(value, bool):
                value = "on" if value else "off"
            if isinstance(value, str):
                value = "'" + value.replace("'", "''") + "'"
            out.append(f"{key} = {value}")
        return out

    def _initdb(self, runas: _RunAs) -> None:
        assert self.directory is not None and self.data_dir is not None
        res = runas.run(
            [
                str(self.pg_bin / "initdb"),
                "-D",
                str(self.data_dir),
                "-A",
                "trust",
                "-U",
                _SUPERUSER,
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ],
            cwd=self.directory,
            timeout=120,
        )
        if res.returncode != 0:
            raise ClusterError(f"initdb failed (exit {res.returncode}):\n{res.stdout}{res.stderr}")

    def _write_conf(self) -> None:
        assert self.data_dir is not None
        conf = self.data_dir / "postgresql.conf"
        marker = "# --- atmostonce_sql.pgserver ---"
        text = conf.read_text()
        text = text.split("\n" + marker, 1)[0].rstrip("\n")
        conf.write_text(text + "\n" + marker + "\n" + "\n".join(self._conf_lines()) + "\n")

    def _write_state(self) -> None:
        assert self.directory is not None and self.os_user is not None
        self._write_conf()
        state = {
            "port": self.port,
            "socket_dir": str(self.socket_dir),
            "own_socket_dir": self._own_socket_dir,
            "os_user": self.os_user,
            "pg_bin": str(self.pg_bin),
            "fsync": self.fsync,
        }
        (self.directory / _STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")

    @staticmethod
    def _read_state(root: Path) -> dict[str, Any] | None:
        try:
            return json.loads((root / _STATE_FILE).read_text())
        except (OSError, ValueError):
            return None

    def _pg_ctl_start(self, runas: _RunAs) -> None:
        assert self.directory is not None and self.data_dir is not None
        log = self.directory / "server.log"
        opts = f"-p {self.port} -k {shlex.quote(str(self.socket_dir))}"
        res = runas.run(
            [str(self.pg_bin / "pg_ctl"), "start", "-w", "-t", "60", "-D", str(self.data_dir), "-l", str(log)]
            + ["-o", opts],
            cwd=self.directory,
            timeout=90,
        )
        if res.returncode != 0:
            raise ClusterError(
                f"pg_ctl start failed (exit {res.returncode}):\n{res.stdout}{res.stderr}\n--- {log} ---\n{_tail(log)}"
            )


# --------------------------------------------------------------------------------------------------------------
# Test entry point


def _docker_available(timeout: float = 5.0) -> bool:
    docker = shutil.which("docker")
    if not docker:
        return False
    try:
        return (
            subprocess.run([docker, "info"], capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL).returncode
            == 0
        )
    except (OSError, subprocess.SubprocessError):
        return False


def postgres_url_for_tests() -> tuple[str, Callable[[], None]]:
    """Provide a PostgreSQL server for a test session.

    Returns:
        ``(base_url, cleanup)``: ``base_url`` is a SQLAlchemy URL of a database the caller may connect to as a
        superuser (to create per-test databases, for instance); ``cleanup()`` releases the server and is safe to
        call more than once.

    The first that applies wins:

    1. ``$DATABASE_URL`` is set: it is returned unchanged; ``cleanup`` does nothing.
    2. A Docker engine answers (``docker info`` exits 0 within 5 s): a ``postgres:15`` container from
       ``testcontainers`` (``postgresql+psycopg://postgres:postgres@<host>:<port>/postgres``); ``cleanup`` stops it.
    3. Otherwise a :class:`LocalCluster` (unix socket, fsync off), in ``/dev/shm`` when that has 4 GiB free (else
       the temporary folder); ``cleanup`` stops it and deletes its folder.

    Raises:
        PgBinariesNotFound: case 3 and no local PostgreSQL binaries.
        ClusterError: case 3 and the cluster failed to start.
        ImportError: case 2 and ``testcontainers`` is not installed.
    """
    env_url = os.environ.get("DATABASE_URL")
    if env_url:
        return env_url, lambda: None

    if _docker_available():
        try:
            from testcontainers.community.postgres import PostgresContainer  # type: ignore[import-not-found,unused-ignore]
        except ImportError:
            from testcontainers.postgres import PostgresContainer  # type: ignore[import-not-found,no-redef,unused-ignore]

        container = PostgresContainer("postgres:15", username="postgres", password="postgres", dbname="postgres")
        container.start()
        stopped = False

        def stop_container() -> None:
            nonlocal stopped
            if not stopped:
                stopped = True
                container.stop()

        return container.get_connection_url(driver="psycopg"), stop_container

    parent = memory_folder()
    if parent is None:
        cluster = LocalCluster().start()
    else:  # the folder is removed on stop
        folder = Path(tempfile.mkdtemp(prefix="atmostonce-pg-", dir=parent))
        cluster = LocalCluster(folder, settings={"max_wal_size": "256MB", "min_wal_size": "32MB"}).start()
    return cluster.url, cluster.stop


_MEMORY_FOLDER = Path("/dev/shm")
_MEMORY_FOLDER_MIN_FREE = 4 << 30


def memory_folder() -> Path | None:
    """A memory-backed folder for throwaway test databases (``/dev/shm`` with at least 4 GiB free), or ``None``.

    Used by :func:`postgres_url_for_tests` for its cluster and by ``atmostonce_sql.testing.SqliteDatabases``.
    Each PostgreSQL test makes a database from the migrated template (``CREATE DATABASE ... TEMPLATE``: some
    9 MB of files written): on this project's 2-core machine 0.3 to 0.5 s on the disk and 0.05 s in memory, for
    some 1,600 tests; a SQLite test's synced commits cost 0.35 ms each on the disk. Nothing a test relies on
    needs the disk: the test cluster runs with fsync off, and a killed process's writes survive in memory as
    they would in the page cache. Benchmarks make their own clusters on the disk.
    """
    try:
        st = os.statvfs(_MEMORY_FOLDER)
    except OSError:
        return None
    if st.f_bavail * st.f_frsize < _MEMORY_FOLDER_MIN_FREE or not os.access(_MEMORY_FOLDER, os.W_OK | os.X_OK):
        return None
    return _MEMORY_FOLDER


# --------------------------------------------------------------------------------------------------------------
# CLI


def main(argv: list[str] | None = None) -> int:
    """CLI: ``start``/``stop``/``url`` ``--dir D``. Returns the process exit status (errors go to stderr, 1)."""
    parser = argparse.ArgumentParser(prog="python -m atmostonce_sql.pgserver", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_start = sub.add_parser("start", help="create (if needed) and start a cluster in --dir; print its URL")
    p_start.add_argument("--port", type=int, default=None, help="socket port number (default: a free one)")
    p_start.add_argument("--fsync", action="store_true", help="keep fsync and synchronous_commit on")
    p_start.add_argument(
        "--set", action="append", default=[], metavar="NAME=VALUE", help="extra postgresql.conf parameter"
    )
    p_stop = sub.add_parser("stop", help="stop the cluster in --dir and delete --dir")
    p_stop.add_argument("--keep", action="store_true", help="stop but keep --dir")
    p_url = sub.add_parser("url", help="print the URL of the cluster in --dir")
    p_url.add_argument("--dsn", action="store_true", help="print a libpq conninfo string instead")
    p_url.add_argument("--db", default="postgres", help="database name (default: postgres)")
    for p in (p_start, p_stop, p_url):
        p.add_argument("--dir", required=True, help="cluster folder")
    args = parser.parse_args(argv)

    try:
        if args.cmd == "start":
            existing = LocalCluster._read_state(Path(args.dir).absolute())
            if existing:
                cluster = LocalCluster.attach(args.dir)
                if cluster.is_running():
                    print(cluster.url)
                    return 0
            settings = dict(s.split("=", 1) for s in args.set)
            cluster = LocalCluster(
                args.dir, port=args.port, fsync=args.fsync, settings=settings, stop_at_exit=False
            ).start()
            print(cluster.url)
        elif args.cmd == "stop":
            if LocalCluster._read_state(Path(args.dir).absolute()) is None:
                return 0  # nothing to stop
            LocalCluster.attach(args.dir, remove_on_stop=not args.keep).stop()
        else:
            cluster = LocalCluster.attach(args.dir)
            if not cluster.is_running():
                raise ClusterError(f"the cluster in {args.dir} is not running")
            print(cluster.dsn_for(args.db) if args.dsn else cluster.url_for(args.db))
    except (ClusterError, PgBinariesNotFound, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
