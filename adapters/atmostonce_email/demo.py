"""The main job against a real mail server pair: N messages sent to Postfix through the SMTP fault relay,
read back from Dovecot.

The same job as :mod:`atmostonce_cli.demo` (the Outbox service: workers that crash at step boundaries,
the sweeper, the reconciler) on SQLite, with the platform replaced by a throwaway Postfix and Dovecot on
loopback (:class:`atmostonce_email.servers.MailServers`), described by the shipped profile
``spec/platforms/email.toml`` with this deployment's ports and addresses as overrides, and the
:class:`atmostonce_email.SmtpFaultRelay` between the transport and Postfix (refusals before DATA,
payloads whose end never reaches Postfix, final replies lost or withheld). SMTP has no idempotency: every
payload Postfix accepts is a new message. Duplicates are counted by ``Message-ID`` in the Maildir Dovecot
serves, read from the files at the end (:meth:`MailServers.mailbox_census`) and grouped by delivery key
(whatever its epochs), never from atmostonce's counters.

The lookup is not fenced (docs/platforms.md, "Why the lookup is not fenced"), so an unknown send whose
message never arrived ends ``parked`` for a person, never resent.
"""

from __future__ import annotations

import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from atmostonce.identity import split_platform_idempotency_key
from atmostonce.service import Outbox
from atmostonce_cli.demo import (
    DemoResult,
    _Crasher,
    _progress,
    check_arguments,
    format_platform_result,
    open_empty_store,
    platform_result,
    run_outbox,
)
from atmostonce_http.profile import load_profile

from .relay import SmtpFaultRelay
from .servers import DOMAIN, MailServers, MailServersUnavailable, unavailable_reason

__all__ = ["EMAIL_FAULT_MIX", "EmailDemoResult", "format_email_result", "run_email_demo"]

EMAIL_FAULT_MIX = {
    "refuse_mail": 0.12,  # 451 to MAIL FROM, from the relay: not sent, retried, lands once
    "drop_payload": 0.05,  # the payload's end never reached Postfix: unknown, not found, parked
    "drop_after_data": 0.10,  # Postfix queued it (250), the answer was lost: unknown, found, published
    "hold_after_data": 0.04,  # the same, silent until the client's timeout
}
"""Per SMTP connection probabilities of each relay fault; the rest pass."""


@dataclass
class EmailDemoResult(DemoResult):
    """:class:`atmostonce_cli.demo.DemoResult` plus what the mailbox holds: ``messages_in_mailbox`` every
    message in the Maildir; ``creates`` those whose Message-ID carries a delivery key of this run;
    ``create_requests`` the payloads the relay forwarded to Postfix."""

    messages_in_mailbox: int = 0
    smtp_sessions: int = 0
    platform: str = ""


def run_email_demo(
    n: int = 50,
    workers: int = 4,
    database_url: str | None = None,
    seed: int = 1,
    fault_mix: dict[str, float] | None = None,
    crash_rate: float = 0.03,
    timeout: float = 180.0,
    progress: TextIO | None = sys.stderr,
    progress_every: float = 1.0,
    smtp_timeout: float = 2.0,
    servers: MailServers | None = None,
) -> EmailDemoResult:
    """Run the job against Postfix and Dovecot; returns an :class:`EmailDemoResult`. Times are seconds.

    ``database_url``: an empty store (default: a fresh SQLite file in a temporary folder, kept for
    inspection). ``servers``: started :class:`MailServers` to use (default: start a pair and stop it at
    the end). ``smtp_timeout`` replaces the profile's (a withheld final reply costs that long).

    Raises ``ValueError`` for a bad argument or a non-empty database, :class:`MailServersUnavailable` when
    Postfix or Dovecot is not installed or this is not root, ``RuntimeError`` when they do not start.
    """
    check_arguments(n, workers, crash_rate)
    if servers is None:
        reason = unavailable_reason()
        if reason is not None:
            raise MailServersUnavailable(reason)
    tmp = Path(tempfile.mkdtemp(prefix="atmostonce-email-demo-"))
    own_db = database_url is None
    if database_url is None:
        database_url = f"sqlite:///{tmp / 'demo.sqlite3'}"
    store = open_empty_store(database_url)
    started_servers: MailServers | None = None
    try:
        started = time.monotonic()
        if servers is None:
            servers = started_servers = MailServers().start()
        mix = fault_mix if fault_mix is not None else EMAIL_FAULT_MIX
        result = _run(
            store, servers, n, workers, seed, mix, crash_rate, timeout, progress, progress_every, smtp_timeout,
            started,
        )  # fmt: skip
        result.database = database_url if own_db else database_url.split("@")[-1]
        return result
    finally:
        store.close()
        if started_servers is not None:
            started_servers.stop()


def _run(
    store, servers, n, workers, seed, mix, crash_rate, timeout, progress, progress_every, smtp_timeout, started,
) -> EmailDemoResult:  # fmt: skip
    run = uuid.uuid4().hex[:8]
    crasher = _Crasher(crash_rate, seed)
    with SmtpFaultRelay("127.0.0.1", servers.smtp_port, io_timeout=max(10.0, 4 * smtp_timeout)) as relay:
        # the shipped profile spec/platforms/email.toml, with this deployment and the demo's short timeouts
        profile = load_profile(
            "email",
            smtp_port=relay.port,
            imap_port=servers.imap_port,
            imap_user=servers.imap_user,
            imap_password=servers.imap_password,
            recipient=servers.mailbox,
            sender="publisher@example.org",
            message_id_domain=f"outbox-{run}.{DOMAIN}",
            smtp_timeout=smtp_timeout,
            imap_timeout=5.0,
            read_wait_seconds=1.0,
        )
        domain = profile.config.message_id_domain
        config = profile.runtime_config(lease_seconds=2.0, send_lease_seconds=4 * smtp_timeout, retries_per_tick=25)
        with profile.email_transport() as transport:
            relay.set_fault_mix(mix, seed=seed)
            # a refusal is drawn per connection: 6 attempts keep a key refused a few times in a row in play
            keys = [
                store.submit(
                    f"demo-account-{i % 3}",
                    "email",
                    servers.mailbox,
                    {"subject": f"demo message {i} of run {run}", "body": f"Hello,\n\nthis is message {i}.\n"},
                    max_attempts=6,
                ).key
                for i in range(n)
            ]
            outbox = Outbox(
                store, transport, workers=workers, config=config, crash=crasher, seed=seed,
                sweep_every=0.1, reconcile_every=0.2, poll_every=0.02,
            )  # fmt: skip
            settled = run_outbox(
                outbox, store, started=started, timeout=max(0.0, timeout - (time.monotonic() - started)),
                progress=progress, progress_every=progress_every,
            )  # fmt: skip
            relay.clear()
        records = list(relay.records)
    servers.wait_for_empty_queue(timeout=30.0)  # a message Postfix queued is delivered before we count
    if progress is not None:
        _progress(progress, store.count_by_state(), time.monotonic() - started, final=True)
    census = servers.mailbox_census()  # the Maildir's own files, not through any transport of ours
    suffix = f"@{domain}>"
    by_key: Counter[str] = Counter()
    for message_id, count in census.items():
        if message_id.startswith("<") and message_id.endswith(suffix):
            by_key[split_platform_idempotency_key(message_id[1 : -len(suffix)])[0]] += count
    faults = Counter(r.mode for r in records if r.mode != "pass")
    return platform_result(
        EmailDemoResult,
        store,
        keys,
        by_key,
        crasher=crasher,
        settled=settled,
        started=started,
        create_requests=sum(1 for r in records if r.payload_forwarded),
        faults=dict(sorted(faults.items())),
        messages_in_mailbox=sum(census.values()),
        smtp_sessions=len(records),
        platform=(
            f"Postfix on 127.0.0.1:{servers.smtp_port} (through the SMTP fault relay), Dovecot on "
            f"127.0.0.1:{servers.imap_port}, profile {profile.source}"
        ),
    )


def format_email_result(r: EmailDemoResult) -> str:
    """The CLI summary: :func:`atmostonce_cli.demo.format_result` plus the mailbox's own count (the email
    lookup is not fenced)."""
    return format_platform_result(
        r,
        [
            ("messages in the Dovecot mailbox (by Message-ID)", r.messages_in_mailbox),
            ("SMTP sessions through the relay", r.smtp_sessions),
            ("platform", r.platform),
        ],
    )
