"""Fixtures for the email platform: a throwaway Postfix and Dovecot on loopback (atmostonce_email.servers,
imported through tests/email/servers.py), the SMTP fault relay in front of Postfix, and transports talking
to them. Nothing in smtplib or imaplib is mocked."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from atmostonce_email import EmailPlatformConfig, EmailTransport, SmtpFaultRelay
from tests.email.servers import DOMAIN, MailServers


@pytest.fixture(scope="session")
def mail_servers() -> Iterator[MailServers]:
    """One Postfix and one Dovecot for the session (each test reads only its own Message-IDs)."""
    with MailServers() as servers:
        yield servers


def email_config(servers: MailServers, smtp_port: int | None = None, **fields) -> EmailPlatformConfig:
    base = {
        "smtp_port": servers.smtp_port if smtp_port is None else smtp_port,
        "imap_port": servers.imap_port,
        "imap_user": servers.imap_user,
        "imap_password": servers.imap_password,
        "recipient": servers.mailbox,
        "sender": "publisher@example.org",
        "message_id_domain": f"outbox.{DOMAIN}",
        "smtp_timeout": 5.0,
        "read_wait_seconds": 5.0,
    }
    return EmailPlatformConfig(**(base | fields))


@pytest.fixture
def relay(mail_servers) -> Iterator[SmtpFaultRelay]:
    """The SMTP fault relay in front of Postfix, fresh per test."""
    with SmtpFaultRelay("127.0.0.1", mail_servers.smtp_port, io_timeout=20.0) as r:
        yield r


@pytest.fixture
def direct(mail_servers) -> Iterator[EmailTransport]:
    """A transport straight to Postfix (no relay)."""
    with EmailTransport(email_config(mail_servers)) as t:
        yield t


@pytest.fixture
def relayed(mail_servers, relay) -> Iterator[EmailTransport]:
    """A transport whose SMTP goes through the fault relay (IMAP straight to Dovecot)."""
    with EmailTransport(email_config(mail_servers, smtp_port=relay.port)) as t:
        yield t
