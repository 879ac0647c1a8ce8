"""A throwaway PostgreSQL high-availability cluster on loopback: one etcd and two Patroni-managed PostgreSQL nodes.

For tests and the ``make ha`` run (docs/deployment.md). Uses Debian's ``etcd-server`` and ``patroni`` packages and
the PostgreSQL server binaries :func:`atmostonce_sql.pgserver.find_pg_bin` finds. Every process runs as an
unprivileged OS user: ``postgres`` when this process is root (PostgreSQL refuses root), else the current user;
every port is on 127.0.0.1; every folder lives under one private temporary folder that :meth:`HaCluster.stop`
removes.

Replication between the nodes goes through a small TCP relay per node (:class:`Relay`): each node's
``connect_address``, which Patroni hands to the standby as its ``primary_conninfo``, is the relay in front of it,
while clients connect to the nodes' own ports. A test can *hold* the relays (:meth:`HaCluster.hold_replication`):
the standby then receives nothing more, so a failover afterwards is deliberately lossy for every commit that did not
wait for the standby. With synchronous replication those commits are never acknowledged; without it they are, and
they are gone after the promotion (docs/design.md, "Failover and synchronous replication").

Python use::

    with HaCluster(synchronous=True) as ha:     # ~15 s: etcd, the primary's bootstrap, the standby's base backup
        url = ha.url("postgres")                 # postgresql://postgres@/postgres?host=127.0.0.1:p1,127.0.0.1:p2&...
        old = ha.kill_primary()                  # SIGKILL Patroni and the postmaster of the primary's node
        ha.wait_primary(exclude=old)             # Patroni promotes the standby
        ha.restart(old)                          # the old primary rejoins as a standby (pg_rewind)
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from .pgserver import ClusterError, _RunAs, find_pg_bin

__all__ = ["HaCluster", "HaUnavailable", "Relay", "unavailable_reason"]

_SUPERUSER = "postgres"


class HaUnavailable(ClusterError):
    """etcd or Patroni is not installed (``bash .ci/install-tools.sh`` installs ``etcd-server`` and ``patroni``)."""


def unavailable_reason() -> str | None:
    """Why an :class:`HaCluster` cannot start here, or ``None`` when etcd, Patroni and PostgreSQL are present."""
    for name in ("etcd", "patroni"):
        if shutil.which(name) is None:
            return f"{name} is not installed (apt-get install etcd-server patroni; .ci/install-tools.sh)"
    try:
        find_pg_bin()
    except FileNotFoundError as exc:
        return str(exc)
    return None


def _free_ports(n: int) -> list[int]:
    socks, ports = [], []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


class Relay:
    """A TCP relay on 127.0.0.1 to one backend port. :meth:`hold` stops forwarding in both directions (bytes wait in
    the relay, never delivered); :meth:`cut` closes every relayed connection (what is held is dropped);
    :meth:`release` forwards again. New connections are accepted and relayed when not held."""

    def __init__(self, listen_port: int, backend_port: int) -> None:
        self.listen_port, self.backend_port = listen_port, backend_port
        self._held = threading.Event()
        self._stop = threading.Event()
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._server.bind(("127.0.0.1", listen_port))
        self._server.listen(64)
        self._thread = threading.Thread(target=self._accept, name=f"relay-{listen_port}", daemon=True)
        self._thread.start()

    def hold(self) -> None:
        self._held.set()

    def release(self) -> None:
        self._held.clear()

    def cut(self) -> None:
        with self._lock:
            conns, self._conns = list(self._conns), set()
        for s in conns:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()

    def close(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self._server.close()
        self.cut()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            try:
                backend = socket.create_connection(("127.0.0.1", self.backend_port), timeout=5)
            except OSError:
                client.close()
                continue
            backend.settimeout(None)
            with self._lock:
                self._conns.update((client, backend))
            threading.Thread(target=self._pump, args=(client, backend), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        peers = {a: b, b: a}
        try:
            while not self._stop.is_set():
                if self._held.is_set():
                    time.sleep(0.05)
                    continue
                readable, _, _ = select.select([a, b], [], [], 0.2)
                for s in readable:
                    if self._held.is_set():
                        break
                    data = s.recv(65536)
                    if not data:
                        return
                    peers[s].sendall(data)
        except (OSError, ValueError):
            return
        finally:
            for s in (a, b):
                with contextlib.suppress(OSError):
                    s.close()
            with self._lock:
                self._conns.difference_update((a, b))


class _Node:
    def __init__(self, name: str, root: Path, pg_port: int, relay_port: int, api_port: int) -> None:
        self.name, self.pg_port, self.relay_port, self.api_port = name, pg_port, relay_port, api_port
        self.dir = root / name
        self.data_dir = self.dir / "data"
        self.config = self.dir / "patroni.yml"
        self.log = self.dir / "patroni.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.relay: Relay | None = None


class HaCluster:
    """etcd plus two Patroni nodes (``node1``, ``node2``) on loopback, in a private temporary folder.

    Args:
        synchronous: Patroni's ``synchronous_mode`` (the primary names the standby in ``synchronous_standby_names``
            and only a synchronous standby is promoted). ``False``: asynchronous replication.
        synchronous_commit: the cluster-wide ``synchronous_commit`` (``on`` by default; ``local`` acknowledges a
            commit before any standby has it even when a synchronous standby is named).
        ttl, loop_wait, retry_timeout: Patroni's leader lease and loop timings (seconds), short for tests.
        maximum_lag_on_failover: bytes a standby may lag and still be promoted (large: a lossy failover is allowed).
    """

    def __init__(
        self,
        *,
        synchronous: bool = True,
        synchronous_commit: str = "on",
        ttl: int = 10,
        loop_wait: int = 1,
        retry_timeout: int = 4,
        maximum_lag_on_failover: int = 1 << 30,
        settings: dict[str, Any] | None = None,
    ) -> None:
        reason = unavailable_reason()
        if reason:
            raise HaUnavailable(reason)
        self.pg_bin = find_pg_bin()
        self.synchronous = synchronous
        self.synchronous_commit = synchronous_commit
        self.ttl, self.loop_wait, self.retry_timeout = ttl, loop_wait, retry_timeout
        self.maximum_lag_on_failover = maximum_lag_on_failover
        self.settings = dict(settings or {})
        self._runas = _RunAs(_SUPERUSER if os.geteuid() == 0 else None)
        self.root: Path | None = None
        self.nodes: dict[str, _Node] = {}
        self._etcd: subprocess.Popen[bytes] | None = None
        self.etcd_port = 0

    # -- lifecycle ---------------------------------------------------------------------------------------------

    def __enter__(self) -> HaCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout: float = 120.0) -> HaCluster:
        """Start etcd, then node1 (it bootstraps and becomes the primary), then node2 (base backup, standby);
        return once node2 streams from node1 (synchronously when ``synchronous``)."""
        self.root = Path(tempfile.mkdtemp(prefix="atmostonce-ha-", dir="/tmp"))
        atexit.register(self.stop)
        self.root.chmod(0o755)
        self._runas.chown(self.root)
        ports = _free_ports(8)
        self.etcd_port, peer_port = ports[0], ports[1]
        for i, name in enumerate(("node1", "node2")):
            node = _Node(name, self.root, ports[2 + 3 * i], ports[3 + 3 * i], ports[4 + 3 * i])
            node.dir.mkdir(mode=0o700)
            self._runas.chown(node.dir)
            node.relay = Relay(node.relay_port, node.pg_port)
            self.nodes[name] = node
        try:
            self._start_etcd(peer_port)
            self._spawn(self.nodes["node1"])
            self.wait_primary(timeout=timeout)
            self._spawn(self.nodes["node2"])
            self.wait_replicating(timeout=timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every process (SIGKILL to each process group) and delete the folder. Idempotent."""
        for node in self.nodes.values():
            self._kill_node(node)
            if node.relay is not None:
                node.relay.close()
                node.relay = None
        if self._etcd is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._etcd.pid, signal.SIGKILL)
            self._etcd.wait()
            self._etcd = None
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None

    # -- connection strings ------------------------------------------------------------------------------------

    def hosts(self) -> str:
        return ",".join(f"127.0.0.1:{n.pg_port}" for n in self.nodes.values())

    def url(self, dbname: str = "postgres", **params: str) -> str:
        """A libpq multi-host URL over both nodes with ``target_session_attrs=read-write`` (the primary, wherever it
        is), plus ``params`` as further query parameters (e.g. ``atmostonce_ha="sync"``)."""
        query = {"host": self.hosts(), "target_session_attrs": "read-write", "connect_timeout": "3", **params}
        return f"postgresql://{_SUPERUSER}@/{dbname}?" + "&".join(f"{k}={v}" for k, v in query.items())

    def node_dsn(self, name: str, dbname: str = "postgres") -> str:
        return f"host=127.0.0.1 port={self.nodes[name].pg_port} user={_SUPERUSER} dbname={dbname} connect_timeout=3"

    # -- state -------------------------------------------------------------------------------------------------

    def role(self, name: str) -> str | None:
        """Patroni's role for the node (``primary``/``master``, ``replica``), or ``None`` when its API is down."""
        status = self._api(self.nodes[name], "patroni")
        return None if status is None else status.get("role")

    def primary(self) -> str | None:
        for name, node in self.nodes.items():
            if node.proc is not None and self._api_ok(node, "primary"):
                return name
        return None

    def wait_primary(self, *, exclude: str | None = None, timeout: float = 90.0) -> str:
        """The name of the node that answers Patroni's ``GET /primary`` with 200 and accepts writes."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            name = self.primary()
            if name is not None and name != exclude and self._writable(name):
                return name
            self._check_alive()
            time.sleep(0.2)
        raise ClusterError(f"no primary within {timeout} s\n{self.logs()}")

    def wait_replicating(self, *, timeout: float = 90.0) -> str:
        """Wait until the primary streams to the other node (as its synchronous standby when ``synchronous``);
        return the standby's name."""
        import psycopg

        deadline = time.monotonic() + timeout
        want = ("sync", "quorum") if self.synchronous else ("async", "sync", "quorum", "potential")
        while time.monotonic() < deadline:
            primary = self.primary()
            if primary is not None:
                with contextlib.suppress(psycopg.Error):
                    with psycopg.connect(self.node_dsn(primary), autocommit=True) as conn:
                        rows = conn.execute(
                            "SELECT application_name, sync_state FROM pg_stat_replication WHERE state = 'streaming'"
                        ).fetchall()
                    for app, state in rows:
                        if state in want and app in self.nodes and app != primary:
                            # synchronous: also wait until Patroni has recorded it as the synchronous standby in
                            # etcd (its /sync answers 200): only then does Patroni drop it from
                            # synchronous_standby_names when it disappears, and only then may it be promoted
                            if not self.synchronous or self._api_ok(self.nodes[app], "sync"):
                                return app
            self._check_alive()
            time.sleep(0.3)
        raise ClusterError(f"no standby streaming within {timeout} s\n{self.logs()}")

    # -- faults ------------------------------------------------------------------------------------------------

    def kill_primary(self) -> str:
        """SIGKILL the primary's node (Patroni and every PostgreSQL process of it): the host died. Returns its
        name. Replication to the standby through the relays is cut at the same time, so nothing held is
        delivered afterwards."""
        name = self.primary()
        if name is None:
            raise ClusterError("no primary to kill")
        self._kill_node(self.nodes[name])
        for node in self.nodes.values():
            assert node.relay is not None
            node.relay.cut()
            node.relay.release()
        return name

    def restart(self, name: str) -> None:
        """Start the node's Patroni again (after :meth:`kill_primary`): it rejoins as a standby."""
        self._spawn(self.nodes[name])

    def hold_replication(self) -> None:
        """Stop forwarding replication traffic: the standby receives no more WAL and the primary no more
        acknowledgements (see the module docstring)."""
        for node in self.nodes.values():
            assert node.relay is not None
            node.relay.hold()

    def release_replication(self) -> None:
        for node in self.nodes.values():
            assert node.relay is not None
            node.relay.release()

    def logs(self, lines: int = 25) -> str:
        out = []
        for node in self.nodes.values():
            with contextlib.suppress(OSError):
                tail = node.log.read_text(errors="replace").splitlines()[-lines:]
                out.append(f"--- {node.name} ---\n" + "\n".join(tail))
        return "\n".join(out)

    # -- internals ---------------------------------------------------------------------------------------------

    def _popen(self, argv: list[str], *, cwd: Path, log: Path) -> subprocess.Popen[bytes]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PG", "PATRONI", "ETCD"))}
        env.update(LC_ALL="C.UTF-8", LANG="C.UTF-8", HOME=str(cwd))
        kwargs: dict[str, Any] = {}
        if self._runas.switch:
            env.update(USER=self._runas.name, LOGNAME=self._runas.name)
            kwargs.update(user=self._runas.uid, group=self._runas.gid, extra_groups=sorted(self._runas.gids))
        fh = open(log, "ab")  # noqa: SIM115 - handed to the child
        self._runas.chown(log)
        try:
            return subprocess.Popen(
                argv,
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=fh,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                **kwargs,
            )
        finally:
            fh.close()

    def _start_etcd(self, peer_port: int) -> None:
        assert self.root is not None
        data = self.root / "etcd"
        data.mkdir(mode=0o700)
        self._runas.chown(data)
        client = f"http://127.0.0.1:{self.etcd_port}"
        peer = f"http://127.0.0.1:{peer_port}"
        self._etcd = self._popen(
            [
                shutil.which("etcd") or "etcd",
                "--name=etcd0",
                f"--data-dir={data}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=etcd0={peer}",
                "--initial-cluster-state=new",
                "--unsafe-no-fsync",
            ],
            cwd=data,
            log=self.root / "etcd.log",
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError):
                with urllib.request.urlopen(f"{client}/health", timeout=1) as r:
                    if json.loads(r.read()).get("health") == "true":
                        return
            if self._etcd.poll() is not None:
                break
            time.sleep(0.2)
        raise ClusterError("etcd did not start:\n" + (self.root / "etcd.log").read_text(errors="replace")[-3000:])

    def _config(self, node: _Node) -> dict[str, Any]:
        params: dict[str, Any] = {
            "unix_socket_directories": str(node.dir),
            "max_connections": 200,
            "shared_buffers": "64MB",
            "wal_level": "replica",
            "hot_standby": "on",
            "max_wal_senders": 10,
            "max_replication_slots": 10,
            "wal_log_hints": "on",
            "fsync": "on",
            "synchronous_commit": self.synchronous_commit,
            "full_page_writes": "on",
            "wal_sender_timeout": "5s",
            "wal_receiver_timeout": "5s",
            **self.settings,
        }
        return {
            "scope": f"aom-{self.etcd_port}",
            "name": node.name,
            "log": {"level": "INFO"},
            "restapi": {"listen": f"127.0.0.1:{node.api_port}", "connect_address": f"127.0.0.1:{node.api_port}"},
            "etcd3": {"hosts": [f"127.0.0.1:{self.etcd_port}"]},
            "bootstrap": {
                "dcs": {
                    "ttl": self.ttl,
                    "loop_wait": self.loop_wait,
                    "retry_timeout": self.retry_timeout,
                    "maximum_lag_on_failover": self.maximum_lag_on_failover,
                    "synchronous_mode": self.synchronous,
                    "postgresql": {"use_pg_rewind": True, "use_slots": True, "parameters": params},
                },
                "initdb": [{"encoding": "UTF8"}, {"locale": "C"}, {"auth": "trust"}],
            },
            "postgresql": {
                "listen": f"127.0.0.1:{node.pg_port}",
                "connect_address": f"127.0.0.1:{node.relay_port}",  # what the standby streams from: the relay
                "data_dir": str(node.data_dir),
                "bin_dir": str(self.pg_bin),
                "pgpass": str(node.dir / "pgpass"),
                "authentication": {
                    "superuser": {"username": _SUPERUSER},
                    "replication": {"username": _SUPERUSER},
                    "rewind": {"username": _SUPERUSER},
                },
                "pg_hba": [
                    "local all all trust",
                    "host all all 127.0.0.1/32 trust",
                    "host replication all 127.0.0.1/32 trust",
                ],
                "parameters": {"unix_socket_directories": str(node.dir)},
            },
            "tags": {"nofailover": False, "noloadbalance": False, "clonefrom": False, "nosync": False},
        }

    def _spawn(self, node: _Node) -> None:
        node.config.write_text(json.dumps(self._config(node), indent=2) + "\n")  # JSON is YAML
        self._runas.chown(node.config)
        node.proc = self._popen([shutil.which("patroni") or "patroni", str(node.config)], cwd=node.dir, log=node.log)

    def _kill_node(self, node: _Node) -> None:
        proc, node.proc = node.proc, None
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        # the postmaster runs in Patroni's session; a stray one (e.g. after a failed start) is killed by its pid file
        with contextlib.suppress(OSError, ValueError, ProcessLookupError):
            pid = int((node.data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
            if _is_postgres(pid):
                os.killpg(os.getpgid(pid), signal.SIGKILL)

    def _check_alive(self) -> None:
        for node in self.nodes.values():
            if node.proc is not None and node.proc.poll() is not None:
                raise ClusterError(f"patroni {node.name} exited ({node.proc.returncode})\n{self.logs()}")

    def _api(self, node: _Node, path: str) -> dict[str, Any] | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{node.api_port}/{path}", timeout=1) as r:
                return json.loads(r.read() or b"{}")
        except urllib.error.HTTPError as exc:
            with contextlib.suppress(ValueError):
                return json.loads(exc.read() or b"{}")
            return {}
        except (OSError, ValueError):
            return None

    def _api_ok(self, node: _Node, path: str) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{node.api_port}/{path}", timeout=1) as r:
                return r.status == 200
        except (OSError, ValueError):
            return False

    def _writable(self, name: str) -> bool:
        import psycopg

        try:
            with psycopg.connect(self.node_dsn(name), autocommit=True) as conn:
                row = conn.execute("SELECT NOT pg_is_in_recovery()").fetchone()
                return bool(row and row[0])
        except psycopg.Error:
            return False


def _is_postgres(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() in ("postgres", "postmaster")
    except OSError:
        return False
