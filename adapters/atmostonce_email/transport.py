"""An email transport: send by SMTP, read back and look up by IMAP (stdlib ``smtplib`` and ``imaplib``).

:class:`EmailTransport` implements :class:`atmostonce.transport.Transport` for a mail server pair
(tested against Postfix and Dovecot, docs/platforms.md, "Email: Postfix and Dovecot"):

* **send**: one SMTP session per send (connect, EHLO, MAIL FROM, RCPT TO, DATA, payload, final
  reply, QUIT), never retried. The platform idempotency key (``WireRequest.idempotency_key``) is in
  the ``Message-ID`` (``<KEY@message_id_domain>``) and in a header of its own (``key_header``). The
  result is classified by ``spec/email_outcomes.toml`` (:mod:`atmostonce_email.classify`) from the
  phase the session reached: a 4xx/5xx reply, or a lost connection, before the payload went out is
  "not sent"; a connection lost after the payload and before the final reply is "unknown".
  The remote id of a sent message is its ``Message-ID``.
* **read back**: IMAP ``SEARCH HEADER Message-ID`` in ``imap_mailbox``, exact match on the parsed
  header; the object is ``{"subject": ..., "body": ...}`` (the text/plain body) and only those two are
  compared with the request's ``subject_field`` and ``body_field``, after text normalization. A server
  adds Received, Return-Path, Delivered-To and other headers: none of them is compared.
* **lookup** by key: the same search. **Not fenced**: a message accepted by the SMTP server but still
  in its queue (deferred, or not yet delivered) is not in the mailbox, so "not found" proves nothing,
  and nothing stops a message still in the network from being delivered later.

:class:`EmailTransportError` is raised when an IMAP read gets no usable answer, never a
:class:`NotFound`: a failed lookup can never pass for absence.
"""

from __future__ import annotations

import contextlib
import dataclasses
import email.policy
import email.utils
import imaplib
import re
import smtplib
import socket
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from email.message import EmailMessage
from typing import Any

from atmostonce.errors import AtMostOnceError
from atmostonce.identity import digest_bytes, platform_idempotency_key
from atmostonce.pointer import pointer_get, split_pointer
from atmostonce.projection import Comparison, compare
from atmostonce.transport import (
    Capabilities,
    Found,
    LookupResult,
    NotFound,
    ReadBackResult,
    SendResult,
    Sent,
    WireRequest,
)

from .classify import Classification, EmailOutcomeTable, email_outcome_table, result_type

__all__ = ["EmailPlatformConfig", "EmailTransport", "EmailTransportError", "message_id_for"]

_ATEXT = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
_DOT_ATOM = re.compile(rf"^{_ATEXT}(?:\.{_ATEXT})*$")
_HEADER_NAME = re.compile(r"^[!-9;-~]+$")  # RFC 5322 field name: printable ASCII but ':'
_ADDRESS = re.compile(r"^[^\s<>@\"\\]+@[A-Za-z0-9.-]+$")


class EmailTransportError(AtMostOnceError):
    """A read-back or lookup got no usable answer from the IMAP server (network, login, or protocol failure)."""


def message_id_for(key: str, domain: str) -> str:
    """The ``Message-ID`` a send under platform idempotency key ``key`` carries: ``<key@domain>``.

    Raises ``ValueError`` when ``key`` or ``domain`` is not a dot-atom (RFC 5322 3.2.3).
    """
    if not isinstance(key, str) or not _DOT_ATOM.match(key):
        raise ValueError(f"idempotency key {key!r} cannot be the left part of a Message-ID")
    if not isinstance(domain, str) or not _DOT_ATOM.match(domain):
        raise ValueError(f"message_id_domain {domain!r} is not a domain")
    return f"<{key}@{domain}>"


def _positive(name: str, value: Any, *, zero: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (value >= 0 if zero else value > 0):
        raise ValueError(f"{name} must be a {'non-negative' if zero else 'positive'} number of seconds, got {value!r}")


@dataclass(frozen=True)
class EmailPlatformConfig:
    """One SMTP server and the IMAP mailbox its messages land in. Immutable plain data; seconds for durations.

    * ``smtp_host`` / ``smtp_port``, ``imap_host`` / ``imap_port``, ``imap_user`` / ``imap_password``,
      ``imap_mailbox``: where to send and where to read (plain TCP; put TLS in front with a local relay).
    * ``sender`` / ``recipient``: the envelope and header addresses.
    * ``message_id_domain``: right part of every ``Message-ID``; ``key_header``: header carrying the key.
    * ``subject_field`` / ``body_field``: RFC 6901 pointers into the request body; the read-back's
      subject and text body are compared with them (nothing else is).
    * ``smtp_timeout``: bound on connecting and on each SMTP read or write; ``imap_timeout`` likewise.
    * ``read_wait_seconds``: how long a read-back or lookup keeps searching before it answers "not
      found" (delivery from the queue into the mailbox takes a moment); 0: one search.

    Raises ``ValueError`` for an invalid field.
    """

    smtp_port: int
    imap_port: int
    imap_user: str
    imap_password: str
    recipient: str
    sender: str = "atmostonce@localhost"
    smtp_host: str = "127.0.0.1"
    imap_host: str = "127.0.0.1"
    imap_mailbox: str = "INBOX"
    message_id_domain: str = "atmostonce.invalid"
    key_header: str = "X-Atmostonce-Key"
    subject_field: str = "/subject"
    body_field: str = "/body"
    smtp_timeout: float = 10.0
    imap_timeout: float = 10.0
    read_wait_seconds: float = 5.0

    def __post_init__(self) -> None:
        for name in ("smtp_port", "imap_port"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not 0 < v < 65536:
                raise ValueError(f"{name} must be a TCP port, got {v!r}")
        for name in ("sender", "recipient"):
            if not isinstance(getattr(self, name), str) or not _ADDRESS.match(getattr(self, name)):
                raise ValueError(f"{name} must be a plain address like user@example.org, got {getattr(self, name)!r}")
        message_id_for("k", self.message_id_domain)
        if not isinstance(self.key_header, str) or not _HEADER_NAME.match(self.key_header):
            raise ValueError(f"key_header must be a header field name, got {self.key_header!r}")
        for name in ("subject_field", "body_field"):
            if not split_pointer(getattr(self, name)):
                raise ValueError(f"{name} must point inside the request body, e.g. '/subject'")
        for name in ("smtp_timeout", "imap_timeout"):
            _positive(name, getattr(self, name))
        _positive("read_wait_seconds", self.read_wait_seconds, zero=True)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> EmailPlatformConfig:
        """Build from plain data; ``ValueError`` for unknown keys or invalid values."""
        unknown = set(data) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"unknown email platform config keys: {sorted(unknown)}")
        return cls(**dict(data))

    @property
    def projection(self) -> tuple[tuple[str, str], ...]:
        return ((self.subject_field, "/subject"), (self.body_field, "/body"))

    @property
    def capabilities(self) -> Capabilities:
        # lookup_by_key but never fenced: a queued message is not in the mailbox yet (module docstring)
        return Capabilities(read_back=True, lookup_by_key=True, fenced_lookup=False)


class _Failed(Exception):
    """Internal: the session ended in a classified way (a failure kind or a reply)."""

    def __init__(self, c: Classification, detail: str):
        super().__init__(detail)
        self.classification, self.detail = c, detail


class EmailTransport:
    """The :class:`atmostonce.transport.Transport` for SMTP plus IMAP. A context manager; holds no connection."""

    name = "email"
    protocol_version = 1

    def __init__(self, config: EmailPlatformConfig | Mapping[str, Any], *, table: EmailOutcomeTable | None = None):
        self.config = config if isinstance(config, EmailPlatformConfig) else EmailPlatformConfig.from_mapping(config)
        self.capabilities: Capabilities = self.config.capabilities
        self._table = table if table is not None else email_outcome_table()
        self._closed = False

    # ---------------------------------------------------------------- send
    def message(self, request: WireRequest) -> EmailMessage:
        """The message sent for ``request``. Raises ``ValueError`` when it cannot be built."""
        cfg = self.config
        if request.action != "create":
            raise ValueError("an email cannot be deleted or corrected once sent")
        subject, body = pointer_get(request.body, cfg.subject_field), pointer_get(request.body, cfg.body_field)
        if not isinstance(subject, str) or not isinstance(body, str):
            raise ValueError(f"the request needs text at {cfg.subject_field} and {cfg.body_field}")
        msg = EmailMessage(policy=email.policy.SMTP)
        msg["From"] = cfg.sender
        msg["To"] = cfg.recipient
        msg["Subject"] = subject  # the policy refuses CR/LF in a header value (ValueError)
        msg["Date"] = email.utils.formatdate(localtime=False)
        msg["Message-ID"] = message_id_for(request.idempotency_key, cfg.message_id_domain)
        msg[cfg.key_header] = request.idempotency_key
        msg.set_content(body)
        return msg

    def _result(
        self, c: Classification, detail: str, remote_id: str | None = None, digest: str | None = None
    ) -> SendResult:
        cls = result_type(c.outcome)
        if cls is Sent:
            return Sent(str(remote_id), digest, outcome=c.outcome)
        return cls(f"{c.row}: {detail}", outcome=c.outcome)

    def _fail(self, kind: str, exc: BaseException) -> _Failed:
        return _Failed(self._table.for_error(kind), f"{type(exc).__name__}: {exc}")

    def _reply(self, phase: str, code: int, text: bytes | str, command: str) -> _Failed:
        shown = text.decode("utf-8", "replace") if isinstance(text, bytes) else str(text)
        return _Failed(self._table.for_reply(phase, code), f"{command} answered {code} {shown}")

    def send(self, request: WireRequest) -> SendResult:
        """One SMTP session for ``request``, classified; never raises for a network or SMTP failure.

        Returns :class:`Sent` (remote id = the ``Message-ID``, digest of the final reply), or
        :class:`NotSent` / :class:`Unknown` whose ``reason`` starts with the deciding row
        (``reply:envelope:400-599``, ``error:lost_after_payload``).
        """
        if self._closed:
            return self._result(self._table.for_error("invalid_request"), "the transport is closed")
        try:
            msg = self.message(request)
            payload = msg.as_bytes()
        except (ValueError, TypeError, UnicodeError) as exc:
            return self._result(self._table.for_error("invalid_request"), f"{type(exc).__name__}: {exc}")
        try:
            code, text = self._session(payload)
        except _Failed as failed:
            return self._result(failed.classification, failed.detail)
        c = self._table.for_reply("final", code)
        shown = text.decode("utf-8", "replace")
        return self._result(
            c, f"end of DATA answered {code} {shown}", msg["Message-ID"], digest_bytes(b"%d " % code + text)
        )

    def _session(self, payload: bytes) -> tuple[int, bytes]:
        """Run one session up to the final reply; raises :class:`_Failed` for anything but a final reply."""
        cfg = self.config
        smtp = smtplib.SMTP(timeout=cfg.smtp_timeout)  # no host: nothing is opened yet
        try:
            try:
                code, text = smtp.connect(cfg.smtp_host, cfg.smtp_port)
            except smtplib.SMTPServerDisconnected as exc:  # connected, then the greeting never came
                raise self._fail("lost_before_data", exc) from exc
            except socket.gaierror as exc:
                raise self._fail("dns_failure", exc) from exc
            except ConnectionRefusedError as exc:
                raise self._fail("connect_refused", exc) from exc
            except TimeoutError as exc:
                raise self._fail("connect_timeout", exc) from exc
            except OSError as exc:
                raise self._fail("connect_error", exc) from exc
            except Exception as exc:
                raise self._fail("other", exc) from exc
            if code != 220:
                raise self._reply("greeting", code, text, "the greeting")
            try:
                self._envelope(smtp)
            except _Failed:
                raise
            except OSError as exc:  # smtplib's SMTPServerDisconnected is an OSError too
                raise self._fail("lost_before_data", exc) from exc
            except Exception as exc:
                raise self._fail("other", exc) from exc
            try:
                smtp.send(_dot_stuffed(payload) + b"\r\n.\r\n")
            except OSError as exc:
                raise self._fail("lost_during_payload", exc) from exc
            except Exception as exc:
                raise self._fail("other", exc) from exc
            try:
                code, text = smtp.getreply()
            except OSError as exc:
                raise self._fail("lost_after_payload", exc) from exc
            except Exception as exc:
                raise self._fail("other", exc) from exc
            with contextlib.suppress(Exception):  # the message's fate is decided: QUIT is a courtesy
                smtp.quit()
            return code, text
        finally:
            with contextlib.suppress(Exception):
                smtp.close()

    def _envelope(self, smtp: smtplib.SMTP) -> None:
        cfg = self.config
        code, text = smtp.ehlo()
        if code != 250:
            code, text = smtp.helo()
            if code != 250:
                raise self._reply("envelope", code, text, "EHLO/HELO")
        code, text = smtp.mail(cfg.sender)
        if code != 250:
            raise self._reply("envelope", code, text, "MAIL FROM")
        code, text = smtp.rcpt(cfg.recipient)
        if code not in (250, 251):
            raise self._reply("envelope", code, text, "RCPT TO")
        code, text = smtp.docmd("DATA")
        if code != 354:
            raise self._reply("envelope", code, text, "DATA")

    # ---------------------------------------------------------------- read back / lookup
    def _imap(self) -> imaplib.IMAP4:
        cfg = self.config
        m = imaplib.IMAP4(cfg.imap_host, cfg.imap_port, timeout=cfg.imap_timeout)
        try:
            m.login(cfg.imap_user, cfg.imap_password)
            typ, data = m.select(cfg.imap_mailbox, readonly=True)
            if typ != "OK":
                raise EmailTransportError(f"IMAP SELECT {cfg.imap_mailbox} answered {typ} {data!r}")
        except BaseException:
            with contextlib.suppress(Exception):
                m.shutdown()
            raise
        return m

    def messages(self, message_id: str) -> list[dict[str, str]]:
        """Every message in the mailbox whose ``Message-ID`` is exactly ``message_id``, as
        ``{"message_id", "subject", "body", "key"}``. Raises :class:`EmailTransportError`."""
        if not message_id.startswith("<") or '"' in message_id or "\\" in message_id:
            raise EmailTransportError(f"not a Message-ID: {message_id!r}")
        try:
            m = self._imap()
            try:
                typ, data = m.search(None, "HEADER", "Message-ID", f'"{message_id}"')
                if typ != "OK":
                    raise EmailTransportError(f"IMAP SEARCH answered {typ} {data!r}")
                out = []
                for num in (data[0] or b"").split():
                    typ, parts = m.fetch(num, "(BODY.PEEK[])")  # type: ignore[arg-type]  # imaplib takes the bytes SEARCH gave
                    raw = next((p[1] for p in parts if isinstance(p, tuple)), None)
                    if typ != "OK" or raw is None:
                        raise EmailTransportError(f"IMAP FETCH {num!r} answered {typ}")
                    found = _parsed(raw, self.config.key_header)
                    if found["message_id"] == message_id:  # SEARCH HEADER matches substrings
                        out.append(found)
                return out
            finally:
                with contextlib.suppress(Exception):
                    m.logout()
        except EmailTransportError:
            raise
        except (OSError, imaplib.IMAP4.error) as exc:
            raise EmailTransportError(f"IMAP read failed: {type(exc).__name__}: {exc}") from exc

    def _search(self, message_id: str) -> dict[str, str] | None:
        deadline = time.monotonic() + self.config.read_wait_seconds
        while True:
            found = self.messages(message_id)
            if found:
                return found[0]
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.1)

    def read_back(self, remote_id: str) -> ReadBackResult:
        """Find the message by its ``Message-ID`` (waiting up to ``read_wait_seconds``): :class:`Found`
        with ``{"subject", "body"}``, or :class:`NotFound`. Raises :class:`EmailTransportError`."""
        found = self._search(remote_id)
        if found is None:
            return NotFound("no message with this Message-ID in the mailbox")
        return Found(remote_id, {"subject": found["subject"], "body": found["body"]})

    def lookup(self, delivery_key: str, resend_epoch: int = 0, fence_epoch: int = 0) -> LookupResult:
        """The same search by the ``Message-ID`` the key composes. Not fenced: :class:`NotFound` proves
        nothing (the message may be queued, or still on its way). Raises :class:`EmailTransportError`."""
        key = platform_idempotency_key(delivery_key, resend_epoch, fence_epoch)
        try:
            message_id = message_id_for(key, self.config.message_id_domain)
        except ValueError as exc:
            raise EmailTransportError(str(exc)) from exc
        found = self._search(message_id)
        if found is None:
            return NotFound("no message with this Message-ID in the mailbox")
        return Found(message_id, {"subject": found["subject"], "body": found["body"]})

    def census(self) -> Counter[str]:
        """How many messages the mailbox holds per ``Message-ID``: the platform's own record of what
        arrived (duplicates are counts above 1). Raises :class:`EmailTransportError`."""
        try:
            m = self._imap()
            try:
                typ, nums = m.search(None, "ALL")
                if typ != "OK":
                    raise EmailTransportError(f"IMAP SEARCH answered {typ}")
                if not (nums[0] or b"").split():
                    return Counter()
                typ, data = m.fetch("1:*", "(BODY.PEEK[HEADER.FIELDS (MESSAGE-ID)])")
                if typ != "OK":
                    raise EmailTransportError(f"IMAP FETCH answered {typ}")
                ids: Counter[str] = Counter()
                for part in data:
                    if isinstance(part, tuple):
                        header = email.message_from_bytes(part[1], policy=email.policy.default)
                        ids[str(header.get("Message-ID", "")).strip()] += 1
                return ids
            finally:
                with contextlib.suppress(Exception):
                    m.logout()
        except EmailTransportError:
            raise
        except (OSError, imaplib.IMAP4.error) as exc:
            raise EmailTransportError(f"IMAP read failed: {type(exc).__name__}: {exc}") from exc

    def compare(self, request: WireRequest, found: Found) -> Comparison:
        """Compare the read-back's subject and text body with the request's (normalized); nothing else."""
        return compare(request.body, found.body, self.config.projection)

    def matches(self, request: WireRequest, found: Found) -> bool:
        return self.compare(request, found).match

    def close(self) -> None:
        """Idempotent; no connection is held between calls."""
        self._closed = True

    def __enter__(self) -> EmailTransport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _dot_stuffed(payload: bytes) -> bytes:
    """RFC 5321 4.5.2: a line starting with '.' gets another; CRLF line ends throughout."""
    data = re.sub(rb"(?:\r\n|\n|\r(?!\n))", b"\r\n", payload)
    if data.endswith(b"\r\n"):
        data = data[:-2]
    return re.sub(rb"(?m)^\.", b"..", data)


def _parsed(raw: bytes, key_header: str) -> dict[str, str]:
    msg = email.message_from_bytes(raw, policy=email.policy.default)
    part = msg.get_body(preferencelist=("plain",))
    body = part.get_content() if part is not None else ""
    return {
        "message_id": str(msg.get("Message-ID", "")).strip(),
        "subject": str(msg.get("Subject", "")),
        "body": body.replace("\r\n", "\n") if isinstance(body, str) else "",
        "key": str(msg.get(key_header, "")).strip(),
    }
