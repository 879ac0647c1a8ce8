"""A real SMTP server on loopback for tests (aiosmtpd, on its own event loop in a thread).

:class:`LoopbackSMTP` listens on a socket bound before the loop starts (``127.0.0.1``, a port the
kernel picks, no race), keeps every message it accepted in :attr:`LoopbackSMTP.mailbox` (its own
record, the one duplicates are counted from), and can be told to drop the connection after it has
received a whole message instead of answering the final dot (:attr:`LoopbackSMTP.drop_after_data`):
the message is kept, as a server that queued it and lost the link before its reply would. Scripted
replies to the final dot (:attr:`LoopbackSMTP.data_replies`) refuse a message without keeping it.
"""

from __future__ import annotations

import asyncio
import email
import email.policy
import socket
import threading
from dataclasses import dataclass

from aiosmtpd.smtp import SMTP


@dataclass(frozen=True)
class Received:
    """One message the server accepted: its ``Message-ID``, subject, text body and envelope."""

    message_id: str
    subject: str
    text: str
    mail_from: str
    rcpt_tos: tuple[str, ...]
    headers: dict[str, str]


class _Handler:
    def __init__(self, owner: LoopbackSMTP):
        self.owner = owner

    async def handle_DATA(self, server, session, envelope):  # noqa: N802 (aiosmtpd's hook name)
        raw = (envelope.original_content or envelope.content).replace(b"\r\n", b"\n")
        with self.owner.lock:
            reply = self.owner.data_replies.pop(0) if self.owner.data_replies else None
        if reply is not None:  # a scripted refusal of the final dot: the message is not kept
            return reply
        msg = email.message_from_bytes(raw, policy=email.policy.default)
        body = msg.get_body(("plain",))
        received = Received(
            message_id=str(msg["Message-ID"]).strip(),
            subject=str(msg["Subject"]),
            text=body.get_content().rstrip("\n") if body is not None else "",
            mail_from=envelope.mail_from,
            rcpt_tos=tuple(envelope.rcpt_tos),
            headers={k: str(v).strip() for k, v in msg.items()},
        )
        with self.owner.lock:
            self.owner.mailbox.append(received)
            drop = self.owner.drop_after_data > 0
            if drop:
                self.owner.drop_after_data -= 1
        if drop:  # the message is kept; the link goes down before the reply to the final dot
            server.transport.abort()
            return "250 OK (never delivered: the connection is gone)"
        return "250 OK queued"


class LoopbackSMTP:
    """``with LoopbackSMTP() as smtp:``; ``smtp.port``; ``smtp.messages(message_id)``."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.mailbox: list[Received] = []
        self.drop_after_data = 0
        """How many of the next messages to receive and then drop the connection before answering."""
        self.data_replies: list[str] = []
        """Replies (e.g. ``"451 try later"``) the next messages' final dots get instead of 250; not kept."""
        self.connections = 0
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(16)
        self.port: int = self._sock.getsockname()[1]
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.base_events.Server | None = None

    def _protocol(self) -> SMTP:
        with self.lock:
            self.connections += 1
        return SMTP(_Handler(self), hostname="loopback.test", loop=self._loop)

    def start(self) -> LoopbackSMTP:
        self._thread.start()
        make = self._loop.create_server(self._protocol, sock=self._sock)
        self._server = asyncio.run_coroutine_threadsafe(make, self._loop).result(timeout=10)
        return self

    def stop(self) -> None:
        if self._server is not None:
            # Closed on the loop's own thread: Server.close() from another thread races the loop's
            # bookkeeping of the last connection going away (asyncio is not thread-safe).
            server = self._server

            async def close() -> None:
                server.close()
                await server.wait_closed()

            asyncio.run_coroutine_threadsafe(close(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    def messages(self, message_id: str | None = None) -> list[Received]:
        """The accepted messages (with ``message_id``: only those carrying it), oldest first."""
        with self.lock:
            return [m for m in self.mailbox if message_id is None or m.message_id == message_id]

    def __enter__(self) -> LoopbackSMTP:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
