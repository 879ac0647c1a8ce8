"""The throwaway Postfix and Dovecot live in the package now (:mod:`atmostonce_email.servers`, used by
``atmostonce demo --platform email`` too); the email tests import them from here, unchanged."""

from __future__ import annotations

from atmostonce_email.servers import (
    DOMAIN,
    HOLD_TAG,
    IMAP_PASSWORD,
    IMAP_USER,
    MAILBOX,
    MailServers,
    MailServersUnavailable,
    free_port,
    unavailable_reason,
)

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
