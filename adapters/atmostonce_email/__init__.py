"""Email transport for atmostonce: send by SMTP, read back and look up by IMAP (stdlib only).

* :class:`EmailTransport` (``atmostonce.transport.Transport``; tested against Postfix and Dovecot).
* :class:`EmailPlatformConfig`: the SMTP server, the IMAP mailbox, the projection (subject, body).
* :class:`EmailTransportError`: an IMAP read-back or lookup got no usable answer.
* :class:`SmtpFaultRelay`: an SMTP-aware TCP relay that injects faults at chosen phases (tests, demos).

Send outcomes are classified by ``spec/email_outcomes.toml`` (:mod:`atmostonce_email.classify`).
The lookup is not fenced: a message still in the server's queue is not yet in the mailbox.
"""

from __future__ import annotations

from .relay import SmtpFaultRelay
from .transport import EmailPlatformConfig, EmailTransport, EmailTransportError, message_id_for

__all__ = ["EmailPlatformConfig", "EmailTransport", "EmailTransportError", "SmtpFaultRelay", "message_id_for"]
