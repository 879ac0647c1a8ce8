"""A throwaway Postfix (SMTP) and Dovecot (IMAP) on loopback, for the email platform tests and
``atmostonce demo --platform email`` (``tests/email/servers.py`` imports it from here).

Both are the Debian packages (``postfix``, ``dovecot-imapd``; ``.ci/install-tools.sh`` installs them
without configuring a system instance). Nothing here touches /etc/postfix or /etc/dovecot: each server
gets its own configuration in a throwaway folder and is started and stopped by :class:`MailServers`.

* Postfix: its own ``config_directory`` (``postfix -c DIR``) with ``queue_directory`` and
  ``data_directory`` inside the folder, ``inet_interfaces = loopback-only``, one ``smtpd`` on an unused
  high port of 127.0.0.1, no relaying anywhere, and one virtual mailbox (``inbox@atmostonce.test``)
  delivered by the ``virtual`` agent into a Maildir owned by the unprivileged user ``nobody``.
* Dovecot: its own config file (``dovecot -c FILE``), IMAP without TLS on an unused high port of
  127.0.0.1, one static user and password, ``mail_location`` the same Maildir, mail processes run as
  ``nobody`` (Dovecot refuses to run them as root).

Postfix's master must start as root (as on CI); so must Dovecot's. :func:`unavailable_reason` says
why they cannot start here (not root, a binary or a system user missing) without touching anything;
:class:`MailServers` raises :class:`MailServersUnavailable` (a ``RuntimeError``) with that reason, and a
``RuntimeError`` naming the log files when a server does not answer in time.
"""

from __future__ import annotations

import contextlib
import imaplib
import json
import os
import pwd
import shutil
import signal
import smtplib
import socket
import subprocess
import tempfile
import time
from collections import Counter
from email.parser import BytesHeaderParser
from pathlib import Path

__all__ = [
    "DOMAIN",
    "HOLD_TAG",
    "IMAP_PASSWORD",
    "IMAP_USER",
    "MAILBOX",
    "MailServers",
    "MailServersUnavailable",
    "free_port",
    "unavailable_reason",
]

DOMAIN = "atmostonce.test"
MAILBOX = f"inbox@{DOMAIN}"
IMAP_USER = "inbox"
IMAP_PASSWORD = "throwaway"
HOLD_TAG = "HOLD-IN-QUEUE"
"""A subject containing this is held in Postfix's queue (``header_checks`` HOLD) until released."""
MAIL_USER = "nobody"
"""The unprivileged owner of the Maildir: Postfix's ``virtual`` agent writes as it, Dovecot reads as it."""

_MASTER_CF = """\
# service  type  private unpriv chroot wakeup maxproc command
{smtp_listen} inet n - n - - smtpd
pickup    unix  n       -       n       60      1       pickup
cleanup   unix  n       -       n       -       0       cleanup
qmgr      unix  n       -       n       300     1       qmgr
rewrite   unix  -       -       n       -       -       trivial-rewrite
bounce    unix  -       -       n       -       0       bounce
defer     unix  -       -       n       -       0       bounce
trace     unix  -       -       n       -       0       bounce
verify    unix  -       -       n       -       1       verify
flush     unix  n       -       n       1000?   0       flush
proxymap  unix  -       -       n       -       -       proxymap
showq     unix  n       -       n       -       -       showq
error     unix  -       -       n       -       -       error
retry     unix  -       -       n       -       -       error
discard   unix  -       -       n       -       -       discard
virtual   unix  -       n       n       -       -       virtual
anvil     unix  -       -       n       -       1       anvil
scache    unix  -       -       n       -       1       scache
postlog   unix-dgram n  -       n       -       1       postlogd
"""

_MAIN_CF = """\
compatibility_level = 3.6
queue_directory = {queue}
data_directory = {data}
meta_directory = /etc/postfix
mail_owner = postfix
setgid_group = postdrop
maillog_file = {log}
maillog_file_prefixes = {log}
myhostname = mx.{domain}
mydomain = {domain}
myorigin = {domain}
inet_interfaces = loopback-only
inet_protocols = ipv4
mynetworks = 127.0.0.0/8
mydestination =
local_transport = error:local delivery is off in this instance
alias_maps =
alias_database =
relayhost =
default_transport = error:this instance relays nowhere
relay_transport = error:this instance relays nowhere
smtpd_relay_restrictions = permit_mynetworks, reject_unauth_destination
smtpd_recipient_restrictions = reject_unlisted_recipient
smtputf8_enable = no
biff = no
append_dot_mydomain = no
readme_directory = no
smtpd_banner = $myhostname ESMTP
virtual_mailbox_domains = {domain}
virtual_mailbox_base = {mail}
virtual_mailbox_maps = texthash:{config}/vmailbox
virtual_uid_maps = static:{uid}
virtual_gid_maps = static:{gid}
virtual_minimum_uid = 1
# a message whose subject carries HOLD_TAG is accepted (250) and parked in Postfix's hold queue:
# queued, not in the mailbox, until MailServers.release_held()
header_checks = regexp:{config}/header_checks
"""

_DOVECOT_CONF = """\
instance_name = atmostonce-{port}
base_dir = {run}
state_dir = {state}
log_path = {log}
info_log_path = {log}
protocols = imap
listen = 127.0.0.1
ssl = no
disable_plaintext_auth = no
auth_mechanisms = plain
first_valid_uid = 1
mail_location = maildir:{maildir}
mail_uid = {uid}
mail_gid = {gid}
passdb {{
  driver = static
  args = password={password}
}}
userdb {{
  driver = static
  args = uid={uid} gid={gid} home={maildir}
}}
service imap-login {{
  inet_listener imap {{
    address = 127.0.0.1
    port = {port}
  }}
  inet_listener imaps {{
    port = 0
  }}
}}
service pop3-login {{
  inet_listener pop3 {{
    port = 0
  }}
  inet_listener pop3s {{
    port = 0
  }}
}}
service submission-login {{
  inet_listener submission {{
    port = 0
  }}
}}
"""


def free_port() -> int:
    """An unused TCP port on 127.0.0.1 (the kernel's choice, from its high ephemeral range)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MailServersUnavailable(RuntimeError):
    """Postfix and Dovecot cannot be started here: not root, or a binary or system user is missing."""


_INSTALL = "Debian: postfix, dovecot-imapd; bash .ci/install-tools.sh installs them"


def _binary(name: str) -> str:
    for folder in ("/usr/sbin", "/usr/bin", "/sbin"):
        if os.access(f"{folder}/{name}", os.X_OK):
            return f"{folder}/{name}"
    found = shutil.which(name)
    if found is None:
        raise MailServersUnavailable(f"{name} is not installed ({_INSTALL})")
    return found


def unavailable_reason() -> str | None:
    """Why :class:`MailServers` cannot start on this machine, or ``None``. Starts and writes nothing."""
    if os.geteuid() != 0:
        return "Postfix's master and Dovecot start as root (CI runs as root); run this as root"
    try:
        for name in ("postfix", "postqueue", "postsuper", "dovecot"):
            _binary(name)
    except MailServersUnavailable as exc:
        return str(exc)
    for user in (MAIL_USER, "postfix"):
        try:
            pwd.getpwnam(user)
        except KeyError:
            return f"the system user {user!r} does not exist ({_INSTALL})"
    return None


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text("utf-8", "replace").splitlines()[-lines:])
    except OSError:
        return f"({path} not written)"


class MailServers:
    """Postfix and Dovecot in a throwaway folder; a context manager (``start`` / ``stop``).

    ``smtp_port`` and ``imap_port`` are on 127.0.0.1; :data:`MAILBOX` receives, IMAP user
    ``imap_user`` / ``imap_password`` reads the same Maildir. ``stop`` is idempotent and removes the folder.
    """

    imap_user = IMAP_USER
    imap_password = IMAP_PASSWORD
    mailbox = MAILBOX

    def __init__(self, *, start_timeout: float = 60.0):
        self.start_timeout = start_timeout
        self.smtp_port = free_port()
        self.imap_port = free_port()
        self.root: Path | None = None
        self._postfix_started = False
        self._dovecot_started = False

    # ---------------------------------------------------------------- layout
    def _layout(self) -> None:
        reason = unavailable_reason()
        if reason is not None:
            raise MailServersUnavailable(reason)
        user = pwd.getpwnam(MAIL_USER)
        self.uid, self.gid = user.pw_uid, user.pw_gid
        # not under pytest's tmp_path (mode 0700): the unprivileged mail user must traverse to the Maildir
        self.root = Path(tempfile.mkdtemp(prefix="aoo-mail-"))
        self.root.chmod(0o755)
        self.config = self.root / "postfix"
        self.queue = self.root / "queue"
        self.data = self.root / "data"
        self.mail = self.root / "mail"
        self.maildir = self.mail / IMAP_USER
        self.postfix_log = self.root / "postfix.log"
        self.dovecot_conf = self.root / "dovecot.conf"
        self.dovecot_log = self.root / "dovecot.log"
        self.dovecot_run = self.root / "dr"  # a short path: Dovecot's unix sockets live here
        for d in (self.config, self.queue, self.mail, self.root / "dstate"):
            d.mkdir(mode=0o755)
        self.data.mkdir(mode=0o700)
        postfix = pwd.getpwnam("postfix")
        os.chown(self.data, postfix.pw_uid, postfix.pw_gid)
        for sub in ("", "cur", "new", "tmp"):
            (self.maildir / sub).mkdir(mode=0o700, exist_ok=True)
            os.chown(self.maildir / sub, self.uid, self.gid)
        os.chown(self.mail, self.uid, self.gid)
        (self.config / "main.cf").write_text(
            _MAIN_CF.format(
                queue=self.queue,
                data=self.data,
                log=self.postfix_log,
                domain=DOMAIN,
                mail=self.mail,
                config=self.config,
                uid=self.uid,
                gid=self.gid,
            ),
            encoding="utf-8",
        )
        (self.config / "master.cf").write_text(
            _MASTER_CF.format(smtp_listen=f"127.0.0.1:{self.smtp_port}"), encoding="utf-8"
        )
        (self.config / "vmailbox").write_text(f"{MAILBOX} {IMAP_USER}/\n", encoding="utf-8")
        (self.config / "header_checks").write_text(
            f"/^Subject:.*{HOLD_TAG}/ HOLD held by the test fixture\n", encoding="utf-8"
        )
        self.dovecot_conf.write_text(
            _DOVECOT_CONF.format(
                port=self.imap_port,
                run=self.dovecot_run,
                state=self.root / "dstate",
                log=self.dovecot_log,
                maildir=self.maildir,
                uid=self.uid,
                gid=self.gid,
                password=IMAP_PASSWORD,
            ),
            encoding="utf-8",
        )

    # ---------------------------------------------------------------- lifecycle
    def start(self) -> MailServers:
        self._layout()
        try:
            self._postfix_started = True  # set first: a start that fails half-way is still stopped
            self._run([_binary("postfix"), "-c", str(self.config), "start"], "postfix start", self.postfix_log)
            self._dovecot_started = True
            self._run([_binary("dovecot"), "-c", str(self.dovecot_conf)], "dovecot", self.dovecot_log)
            self._wait_until_answering()
        except BaseException:
            self.stop()
            raise
        return self

    def _run(self, argv: list[str], what: str, log: Path) -> None:
        # output to a file, not a pipe: a daemon's children inherit it and would hold a pipe open
        assert self.root is not None
        out = self.root / "commands.out"
        with open(out, "ab") as sink:
            proc = subprocess.run(argv, stdout=sink, stderr=sink, timeout=60, stdin=subprocess.DEVNULL)
        if proc.returncode != 0:
            raise RuntimeError(f"{what} failed ({proc.returncode}):\n{_tail(out)}\n{_tail(log)}")

    def _wait_until_answering(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        smtp_ok = imap_ok = False
        last: BaseException | None = None
        while time.monotonic() < deadline and not (smtp_ok and imap_ok):
            try:
                if not smtp_ok:
                    with smtplib.SMTP("127.0.0.1", self.smtp_port, timeout=5) as s:
                        smtp_ok = s.noop()[0] == 250
                if not imap_ok:
                    with contextlib.closing(imaplib.IMAP4("127.0.0.1", self.imap_port, timeout=5)) as m:
                        m.login(IMAP_USER, IMAP_PASSWORD)
                        imap_ok = m.select("INBOX")[0] == "OK"
                        m.logout()
            except (OSError, smtplib.SMTPException, imaplib.IMAP4.error) as exc:
                last = exc
                time.sleep(0.2)
        if not (smtp_ok and imap_ok):
            raise RuntimeError(
                f"mail servers did not answer in {self.start_timeout}s (smtp={smtp_ok}, imap={imap_ok}, last: {last!r})\n"
                f"postfix log:\n{_tail(self.postfix_log)}\ndovecot log:\n{_tail(self.dovecot_log)}"
            )

    def stop(self) -> None:
        """Stop both servers (waiting for their masters to exit) and remove the folder. Idempotent."""
        if self._dovecot_started:
            self._dovecot_started = False
            self._stop_master(
                self.dovecot_run / "master.pid", [_binary("dovecot"), "-c", str(self.dovecot_conf), "stop"]
            )
        if self._postfix_started:
            self._postfix_started = False
            self._stop_master(self.queue / "pid" / "master.pid", [_binary("postfix"), "-c", str(self.config), "stop"])
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None

    @staticmethod
    def _stop_master(pid_file: Path, argv: list[str]) -> None:
        try:
            pid = int(pid_file.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            pid = None
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60, stdin=subprocess.DEVNULL)
        if pid is None:
            return
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)  # the master we started and no other: its pid file is ours

    def __enter__(self) -> MailServers:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---------------------------------------------------------------- the platform's own records
    def _queue(self) -> list[dict]:
        out = subprocess.run(
            [_binary("postqueue"), "-c", str(self.config), "-j"], capture_output=True, text=True, timeout=30
        )
        if out.returncode != 0:
            raise RuntimeError(f"postqueue -j failed: {out.stderr.strip()}")
        return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]

    def queue_is_empty(self) -> bool:
        """Whether Postfix's queue holds no message on its way (held ones aside): all delivered or bounced."""
        return all(m.get("queue_name") == "hold" for m in self._queue())

    def held(self) -> int:
        """How many messages sit in Postfix's hold queue."""
        return sum(m.get("queue_name") == "hold" for m in self._queue())

    def release_held(self) -> None:
        """Release every held message for delivery now (``postsuper -H ALL``, then ``postqueue -f``)."""
        subprocess.run(
            [_binary("postsuper"), "-c", str(self.config), "-H", "ALL"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=30,
            check=True,
        )
        # a released message goes to the deferred queue, scanned only every queue_run_delay: flush it now
        subprocess.run(
            [_binary("postqueue"), "-c", str(self.config), "-f"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=30,
            check=True,
        )

    def mailbox_census(self) -> Counter[str]:
        """How many messages the Maildir Dovecot serves holds per ``Message-ID``, read from the files
        themselves (``new/`` and ``cur/``), not through any transport of ours: the platform's own record."""
        assert self.root is not None, "not started"
        ids: Counter[str] = Counter()
        parser = BytesHeaderParser()
        for sub in ("new", "cur"):
            for path in sorted((self.maildir / sub).iterdir()):
                if path.is_file():
                    with open(path, "rb") as f:
                        ids[str(parser.parse(f).get("Message-ID", "")).strip()] += 1
        return ids

    def wait_for_empty_queue(self, timeout: float = 60.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.queue_is_empty():
                return True
            time.sleep(0.1)
        return False


if __name__ == "__main__":  # manual check: start both, send one message, read it back
    with MailServers() as servers:
        print("smtp", servers.smtp_port, "imap", servers.imap_port, servers.root)
        with smtplib.SMTP("127.0.0.1", servers.smtp_port) as s:
            s.sendmail("sender@example.org", [MAILBOX], b"Subject: hi\r\nMessage-ID: <x@y>\r\n\r\nhello\r\n")
        print("queue empty:", servers.wait_for_empty_queue(20))
        with contextlib.closing(imaplib.IMAP4("127.0.0.1", servers.imap_port)) as m:
            m.login(IMAP_USER, IMAP_PASSWORD)
            m.select("INBOX")
            print(m.search(None, "HEADER", "Message-ID", "<x@y>"))
