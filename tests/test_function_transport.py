"""Any Python call as a transport (docs/platforms.md): smtplib against a real SMTP server on loopback, through the
dispatcher, sweeper and reconciler on SQLite; exceptions classified by spec/exception_outcomes.toml.

Duplicates are counted from the SMTP server's own record of the messages it accepted (``LoopbackSMTP``),
never from our counters."""

from __future__ import annotations

import importlib
import smtplib
import socket
import tomllib
from email.message import EmailMessage

import httpx
import pytest

from atmostonce.errors import Rejected
from atmostonce.runtime import Dispatcher, Reconciler, RuntimeConfig, Sweeper
from atmostonce.table import spec_dir, table
from atmostonce.transport import Found, NotFound, NotSent, Sent, Transport, Unknown, Unsupported, WireRequest
from atmostonce_function import FunctionTransport, FunctionTransportError
from atmostonce_function.classify import (
    ExceptionTableError,
    OutcomeTableCode,
    dotted_name,
    exception_outcomes_path,
    exception_table,
    failure_outcomes,
    load_exception_table,
    parse_exception_table,
)
from tests.smtp_server import LoopbackSMTP

FROM, TO = "outbox@sender.test", "reader@receiver.test"


def message_id(idempotency_key: str) -> str:
    return f"<{idempotency_key}@atmostonce.test>"


class Mail:
    """A user's smtplib code as the three callables: one message per connection, the platform
    idempotency key in the Message-ID, read-back and lookup by Message-ID in the server's mailbox."""

    def __init__(self, server: LoopbackSMTP, port: int | None = None):
        self.server = server
        self.port = server.port if port is None else port
        self.calls: list[str] = []

    def send(self, request: WireRequest) -> str:
        self.calls.append(request.idempotency_key)
        msg = EmailMessage()
        msg["From"], msg["To"], msg["Subject"] = FROM, request.body["to"], request.body["subject"]
        msg["Message-ID"] = message_id(request.idempotency_key)
        msg["X-Atmostonce-Delivery-Key"] = request.delivery_key
        msg.set_content(request.body["text"])
        with smtplib.SMTP("127.0.0.1", self.port, timeout=10) as smtp:
            smtp.send_message(msg)
        return msg["Message-ID"]

    def _object(self, mid: str) -> dict | None:
        found = self.server.messages(mid)
        if not found:
            return None
        m = found[0]  # what the platform holds, with its own additions (message id, headers)
        return {"id": m.message_id, "to": m.rcpt_tos[0], "subject": m.subject, "text": m.text, "headers": m.headers}

    def read_back(self, remote_id: str) -> dict | None:
        return self._object(remote_id)

    def lookup(self, idempotency_key: str) -> dict | None:
        return self._object(message_id(idempotency_key))

    def transport(self, **kw) -> FunctionTransport:
        return FunctionTransport(self.send, self.read_back, self.lookup, name="smtp", **kw)


def email_body(text: str = "Your order has shipped.") -> dict:
    return {"to": TO, "subject": "Order 17", "text": text}


@pytest.fixture
def smtp():
    with LoopbackSMTP() as server:
        yield server


@pytest.fixture
def refusing_port():
    """A loopback port bound but not listening: a connect to it is refused (RST) before any byte."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    yield s.getsockname()[1]
    s.close()


def last_reason(store, key: str) -> str:
    return store.history(key)[-1].detail["reason"]


# ---------------------------------------------------------------- end to end on a real SMTP server


def test_smtplib_send_is_published_end_to_end_with_the_delivery_key_in_the_message_id(smtp, sqlite_store):
    mail = Mail(smtp)
    it = sqlite_store.submit("shop", "email", TO, email_body())
    with mail.transport() as t:
        assert isinstance(t, Transport)
        assert Dispatcher(sqlite_store, t).dispatch(it.key) == "read_back.match"
    done = sqlite_store.get(it.key)
    assert done.state == "published"
    assert done.remote_id == message_id(it.key)
    [received] = smtp.messages()  # the server's own record: one message
    assert received.message_id == f"<{it.key}@atmostonce.test>"
    assert received.headers["X-Atmostonce-Delivery-Key"] == it.key
    assert (received.subject, received.text, received.rcpt_tos) == ("Order 17", "Your order has shipped.", (TO,))
    assert mail.calls == [it.key]


def test_a_refused_connection_is_not_sent_and_the_retry_policy_sends_it_once(smtp, sqlite_store, refusing_port):
    mail = Mail(smtp, port=refusing_port)
    it = sqlite_store.submit("shop", "email", TO, email_body())
    with mail.transport() as t:
        assert Dispatcher(sqlite_store, t).dispatch(it.key) == "send.not_sent"
        assert sqlite_store.get(it.key).state == "failed"
        assert last_reason(sqlite_store, it.key).startswith("exception:builtins.ConnectionRefusedError: ")
        assert smtp.connections == 0 and smtp.messages() == []  # no byte reached the server
        mail.port = smtp.port  # the server is reachable now; the transport itself retried nothing
        assert mail.calls == [it.key]
        now = RuntimeConfig(retry_backoff=0)  # retried on the next pass
        assert Sweeper(sqlite_store, now).retry_failed() == {"retried": 1, "exhausted": 0, "waiting": 0, "skipped": 0}
        assert Dispatcher(sqlite_store, t).dispatch(it.key) == "read_back.match"
    done = sqlite_store.get(it.key)
    assert (done.state, done.attempt_count) == ("published", 2)
    assert [m.message_id for m in smtp.messages()] == [message_id(it.key)]  # one message on the server
    assert mail.calls == [it.key, it.key]


def test_a_connection_dropped_after_data_is_unknown_and_never_resent(smtp, sqlite_store):
    mail = Mail(smtp)
    smtp.drop_after_data = 1  # the server keeps the message and hangs up before its reply to the final dot
    it = sqlite_store.submit("shop", "email", TO, email_body())
    with mail.transport() as t:
        assert Dispatcher(sqlite_store, t).dispatch(it.key) == "send.unknown"
        assert sqlite_store.get(it.key).state == "indeterminate"
        assert last_reason(sqlite_store, it.key).startswith("exception:smtplib.SMTPServerDisconnected: ")
        assert Sweeper(sqlite_store).tick()["retried"] == 0  # an unknown send is not retryable
        with pytest.raises(Rejected) as refused:
            Dispatcher(sqlite_store, t).dispatch(it.key)  # nor can a worker begin it again
        assert refused.value.event == "begin"
        assert mail.calls == [it.key]
        assert len(smtp.messages(message_id(it.key))) == 1  # the server's own record: exactly one
        assert Reconciler(sqlite_store, t).run() == {"lookup.found": 1}  # settled by evidence, not a resend
    assert sqlite_store.get(it.key).state == "published"
    assert len(smtp.messages()) == 1
    assert mail.calls == [it.key]


@pytest.mark.parametrize(
    ("reply", "outcome", "row"),
    [
        ("451 4.3.0 try again later", "send.unknown", "exception:smtplib.SMTPDataError"),
        ("554 5.7.1 rejected as spam", "send.not_sent", "exception:smtplib.SMTPDataError[smtp_code=500-599]"),
    ],
)
def test_a_refusal_of_the_final_dot_is_unknown_for_4xx_and_not_sent_for_5xx(smtp, reply, outcome, row):
    mail = Mail(smtp)
    smtp.data_replies.append(reply)
    result = mail.transport().send(WireRequest(body=email_body(), delivery_key="dk-data"))
    assert result.outcome == outcome
    assert result.reason.startswith(row + ": SMTPDataError: ")
    assert mail.calls == ["dk-data"]


def test_recipients_refused_before_data_is_not_sent():
    def send(request):
        raise smtplib.SMTPRecipientsRefused({TO: (550, b"no such user")})

    result = FunctionTransport(send).send(WireRequest(body={"text": "x"}, delivery_key="dk"))
    assert isinstance(result, NotSent)
    assert result.reason.startswith("exception:smtplib.SMTPRecipientsRefused: ")


def test_a_timeout_after_the_request_was_written_to_a_real_socket_is_unknown():
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)  # the kernel completes the connect; nobody ever reads or answers
    calls: list[str] = []

    def send(request):
        calls.append(request.idempotency_key)
        with socket.create_connection(listener.getsockname(), timeout=0.2) as conn:
            conn.sendall(b"CREATE " + request.idempotency_key.encode() + b"\r\n")  # the bytes have left
            return conn.recv(100).decode()  # no answer in time: socket.timeout, i.e. TimeoutError

    try:
        result = FunctionTransport(send).send(WireRequest(body={"text": "x"}, delivery_key="dk-slow"))
    finally:
        listener.close()
    assert isinstance(result, Unknown)
    assert result.reason.startswith("exception:builtins.TimeoutError: ")
    assert calls == ["dk-slow"]


def test_an_httpx_sdk_refused_on_a_real_socket_is_not_sent(refusing_port):
    def send(request):
        with httpx.Client(transport=httpx.HTTPTransport(retries=0)) as client:
            response = client.post(f"http://127.0.0.1:{refusing_port}/posts", json=dict(request.body))
            response.raise_for_status()
            return response.json()

    result = FunctionTransport(send).send(WireRequest(body={"text": "x"}, delivery_key="dk-http"))
    assert isinstance(result, NotSent)
    assert result.reason.startswith("exception:httpx.ConnectError: ")


# ---------------------------------------------------------------- classification


class PaymentsSDKError(Exception):
    """An SDK's own error class that no shipped row knows."""


class RefusedBySDK(ConnectionRefusedError):
    pass


def _raising(exc: BaseException):
    calls: list[WireRequest] = []

    def send(request):
        calls.append(request)
        raise exc

    return send, calls


def test_an_exception_the_table_does_not_know_is_unknown():
    send, calls = _raising(PaymentsSDKError("card network said something"))
    result = FunctionTransport(send).send(WireRequest(body={"amount": 5}, delivery_key="dk-pay"))
    assert isinstance(result, Unknown)
    assert result.outcome == "send.unknown"
    assert result.reason == "default: PaymentsSDKError: card network said something"
    assert len(calls) == 1  # the transport never retries on its own


def test_a_subclass_inherits_its_base_row_through_the_mro():
    c = exception_table().classify(RefusedBySDK())
    assert (c.outcome, c.row) == ("send.not_sent", "exception:builtins.ConnectionRefusedError")
    c = exception_table().classify(smtplib.SMTPSenderRefused(553, b"no", FROM))  # its own row before its bases'
    assert (c.outcome, c.row) == ("send.not_sent", "exception:smtplib.SMTPSenderRefused")


def test_a_wrapped_connect_error_is_not_read_through_its_cause():
    try:
        try:
            raise ConnectionRefusedError("last attempt refused")
        except ConnectionRefusedError as inner:
            raise PaymentsSDKError("gave up after retries") from inner
    except PaymentsSDKError as exc:
        wrapped = exc
    assert exception_table().classify(wrapped).outcome == "send.unknown"


@pytest.mark.parametrize(
    ("exc", "outcome", "row"),
    [
        (ConnectionRefusedError(), "send.not_sent", "exception:builtins.ConnectionRefusedError"),
        (socket.gaierror(-2, "Name or service not known"), "send.not_sent", "exception:socket.gaierror"),
        (TimeoutError("timed out"), "send.unknown", "exception:builtins.TimeoutError"),
        (ConnectionResetError(), "send.unknown", "exception:builtins.ConnectionResetError"),
        (BrokenPipeError(), "send.unknown", "exception:builtins.BrokenPipeError"),
        (smtplib.SMTPServerDisconnected("gone"), "send.unknown", "exception:smtplib.SMTPServerDisconnected"),
        (smtplib.SMTPDataError(421, b"closing"), "send.unknown", "exception:smtplib.SMTPDataError"),
        (
            smtplib.SMTPResponseException(500, "Line too long."),
            "send.unknown",
            "exception:smtplib.SMTPResponseException",
        ),
        (smtplib.SMTPHeloError(501, b"no"), "send.not_sent", "exception:smtplib.SMTPHeloError"),
        (httpx.ConnectError("refused"), "send.not_sent", "exception:httpx.ConnectError"),
        (httpx.ConnectTimeout("slow"), "send.not_sent", "exception:httpx.ConnectTimeout"),
        (httpx.ReadTimeout("slow"), "send.unknown", "exception:httpx.ReadTimeout"),
        (httpx.RemoteProtocolError("closed"), "send.unknown", "exception:httpx.RemoteProtocolError"),
        (httpx.ProxyError("proxy"), "send.unknown", "exception:httpx.HTTPError"),
        (ValueError("bad input"), "send.unknown", "default"),
    ],
)
def test_shipped_rows_classify_stdlib_smtplib_and_httpx_errors(exc, outcome, row):
    c = exception_table().classify(exc)
    assert (c.outcome, c.row) == (outcome, row)
    assert c.rule


@pytest.mark.parametrize(
    ("status", "outcome", "row"),
    [
        (409, "send.unknown", "exception:httpx.HTTPStatusError[response.status_code=409]"),
        (422, "send.not_sent", "exception:httpx.HTTPStatusError[response.status_code=400-499]"),
        (503, "send.unknown", "exception:httpx.HTTPStatusError"),
    ],
)
def test_raise_for_status_is_classified_by_the_status_it_carries(status, outcome, row):
    request = httpx.Request("POST", "https://platform.test/posts")
    exc = httpx.HTTPStatusError("status", request=request, response=httpx.Response(status, request=request))
    c = exception_table().classify(exc)
    assert (c.outcome, c.row) == (outcome, row)


def test_extra_rows_classify_an_sdks_own_errors_before_the_shipped_rows():
    rows = [
        {"exception": PaymentsSDKError, "outcome": "not_sent", "rule": "the SDK raises it only for a local validation"},
        {"exception": "builtins.TimeoutError", "outcome": "not_sent", "rule": "this SDK times out only in connect"},
    ]
    send, _ = _raising(PaymentsSDKError("amount must be positive"))
    t = FunctionTransport(send, extra_rows=rows)
    result = t.send(WireRequest(body={"amount": -1}, delivery_key="dk"))
    assert isinstance(result, NotSent)
    assert result.reason.startswith(f"exception:{dotted_name(PaymentsSDKError)}: ")
    assert t.table.classify(TimeoutError()).outcome == "send.not_sent"
    assert exception_table().classify(TimeoutError()).outcome == "send.unknown"  # the shipped table is unchanged


Code = OutcomeTableCode


def test_extra_rows_are_checked_like_the_file():
    with pytest.raises(ExceptionTableError) as e:
        FunctionTransport(
            lambda r: "id", extra_rows=[{"exception": "a.B", "outcome": "probably_not_sent", "rule": "x"}]
        )
    assert e.value.as_dict() == {"code": Code.UNKNOWN_OUTCOME, "where": "extra_rows[0].outcome", "path": None}
    with pytest.raises(ExceptionTableError) as e:
        FunctionTransport(lambda r: "id", extra_rows=[{"exception": Exception, "outcome": "not_sent", "rule": "x"}])
    assert e.value.as_dict() == {"code": Code.NOT_SENT_UNPROVEN, "where": "extra_rows[0]", "path": None}


# ---------------------------------------------------------------- the table file


def raw_table() -> dict:
    return tomllib.loads(exception_outcomes_path().read_text("utf-8"))


def test_the_table_file_sits_beside_table_toml_and_loads():
    assert exception_outcomes_path() == spec_dir() / "exception_outcomes.toml"
    assert load_exception_table() == exception_table()
    assert exception_table().default == "send.unknown"


def test_the_row_vocabulary_is_the_send_outcomes_of_the_loaded_table():
    vocabulary = failure_outcomes()
    assert dict(vocabulary) == {"not_sent": "send.not_sent", "unknown": "send.unknown"}
    assert all(full in table().outcomes for full in vocabulary.values())
    http = tomllib.loads((spec_dir() / "http_outcomes.toml").read_text("utf-8"))
    assert {row["outcome"] for row in http["errors"].values()} == set(vocabulary)  # the HTTP rows' names


def test_every_shipped_row_names_a_class_that_exists_under_that_dotted_name():
    for name, rows in exception_table().rows.items():
        module, _, qualname = name.rpartition(".")
        cls = getattr(importlib.import_module(module), qualname)
        assert isinstance(cls, type) and issubclass(cls, BaseException), name
        assert dotted_name(cls) == name  # the MRO walk can find it
        assert all(row.rule for row in rows)


def test_a_row_with_an_unknown_outcome_name_fails_at_load(tmp_path):
    text = exception_outcomes_path().read_text("utf-8")
    bad = tmp_path / "exception_outcomes.toml"
    bad.write_text(text.replace('outcome = "not_sent"', 'outcome = "not_sen"', 1), "utf-8")
    with pytest.raises(ExceptionTableError) as e:
        load_exception_table(bad)
    assert e.value.as_dict() == {"code": Code.UNKNOWN_OUTCOME, "where": "rows[0].outcome", "path": str(bad)}


def test_a_missing_or_malformed_table_file_is_refused_naming_it(tmp_path):
    with pytest.raises(ExceptionTableError) as e:
        load_exception_table(tmp_path / "absent.toml")
    assert e.value.as_dict() == {"code": Code.NOT_FOUND, "where": None, "path": str(tmp_path / "absent.toml")}
    bad = tmp_path / "bad.toml"
    bad.write_text("[[rows]", "utf-8")
    with pytest.raises(ExceptionTableError) as e:
        load_exception_table(bad)
    assert e.value.as_dict() == {"code": Code.NOT_TOML, "where": None, "path": str(bad)}


@pytest.mark.parametrize(
    ("change", "code", "where"),
    [
        ({"default": "not_sent"}, Code.DEFAULT_NOT_UNKNOWN, "default"),
        ({"default": "success"}, Code.UNKNOWN_OUTCOME, "default"),
        ({"format": 2}, Code.FORMAT, "format"),
        ({"rows": []}, Code.MISSING, "rows"),
        ({"extra": 1}, Code.UNKNOWN_FIELD, "extra"),
    ],
)
def test_the_loader_refuses_a_default_other_than_unknown_and_a_bad_header(change, code, where):
    with pytest.raises(ExceptionTableError) as e:
        parse_exception_table(raw_table() | change)
    assert (e.value.code, e.value.where) == (code, where)


@pytest.mark.parametrize(
    ("row", "code", "where"),
    [
        ({"exception": "a.B", "outcome": "success", "rule": "r"}, Code.UNKNOWN_OUTCOME, "rows[0].outcome"),
        ({"exception": "NoModule", "outcome": "unknown", "rule": "r"}, Code.INVALID_VALUE, "rows[0].exception"),
        ({"exception": "a.B", "outcome": "unknown"}, Code.MISSING, "rows[0].rule"),
        ({"exception": "a.B", "outcome": "unknown", "rule": " "}, Code.MISSING, "rows[0].rule"),
        ({"exception": "a.B", "outcome": "unknown", "rule": "r", "codes": [1]}, Code.SELECTOR, "rows[0]"),
        ({"exception": "a.B", "outcome": "unknown", "rule": "r", "attribute": "code"}, Code.SELECTOR, "rows[0]"),
        (
            {"exception": "a.B", "outcome": "unknown", "rule": "r", "attribute": "c", "codes": [1], "range": [1, 2]},
            Code.SELECTOR,
            "rows[0]",
        ),
        (
            {"exception": "a.B", "outcome": "unknown", "rule": "r", "attribute": "c.", "codes": [1]},
            Code.INVALID_VALUE,
            "rows[0].attribute",
        ),
        (
            {"exception": "a.B", "outcome": "unknown", "rule": "r", "attribute": "c", "codes": [True]},
            Code.INVALID_VALUE,
            "rows[0].codes",
        ),
        (
            {"exception": "a.B", "outcome": "unknown", "rule": "r", "attribute": "c", "range": [1]},
            Code.INVALID_VALUE,
            "rows[0].range",
        ),
        (
            {"exception": "a.B", "outcome": "unknown", "rule": "r", "attribute": "c", "range": [5, 1]},
            Code.INVALID_VALUE,
            "rows[0].range",
        ),
        (
            {"exception": "builtins.BaseException", "outcome": "not_sent", "rule": "r"},
            Code.NOT_SENT_UNPROVEN,
            "rows[0]",
        ),
        ({"exception": "builtins.Exception", "outcome": "not_sent", "rule": "r"}, Code.NOT_SENT_UNPROVEN, "rows[0]"),
        ({"exception": "a.B", "outcome": "unknown", "rule": "r", "when": "always"}, Code.UNKNOWN_FIELD, "rows[0].when"),
        ("a.B", Code.WRONG_TYPE, "rows[0]"),
    ],
)
def test_the_loader_refuses_a_malformed_row(row, code, where):
    with pytest.raises(ExceptionTableError) as e:
        parse_exception_table(raw_table() | {"rows": [row]})
    assert (e.value.code, e.value.where) == (code, where)


def test_a_row_after_a_catch_all_row_of_its_class_is_refused_as_unreachable():
    rows = [
        {"exception": "a.B", "outcome": "unknown", "rule": "r"},
        {"exception": "a.B", "outcome": "not_sent", "rule": "r", "attribute": "code", "codes": [1]},
    ]
    with pytest.raises(ExceptionTableError) as e:
        parse_exception_table(raw_table() | {"rows": rows})
    assert (e.value.code, e.value.where) == (Code.UNREACHABLE, "rows[1]")


# ---------------------------------------------------------------- the callables' answers


def test_send_answers_are_read_as_an_id_an_object_or_a_result():
    wire = WireRequest(body={"text": "x"}, delivery_key="dk")
    assert FunctionTransport(lambda r: 42).send(wire) == Sent("42")
    sent = FunctionTransport(lambda r: {"id": "m-1", "status": "queued"}).send(wire)
    assert isinstance(sent, Sent) and sent.remote_id == "m-1" and sent.response_digest
    assert FunctionTransport(lambda r: {"ok": True}, remote_id=lambda o: "m-2").send(wire).remote_id == "m-2"
    # no id, or one the store could not keep (over 4,096 characters, a lone surrogate): unknown, never lost later
    for nameless in (None, {}, True, "", object(), "x" * 4097, "a\ud800b"):
        result = FunctionTransport(lambda r, a=nameless: a).send(wire)
        assert isinstance(result, Unknown) and result.reason.startswith("send returned no usable remote id")
    assert FunctionTransport(lambda r: NotSent("validated locally")).send(wire) == NotSent("validated locally")


def test_read_back_and_lookup_never_turn_a_failure_into_not_found():
    def broken(_):
        raise ConnectionResetError("read-back link down")

    t = FunctionTransport(lambda r: "id", broken, broken)
    with pytest.raises(FunctionTransportError, match="read-back failed: ConnectionResetError"):
        t.read_back("id")
    with pytest.raises(FunctionTransportError, match="lookup failed"):
        t.lookup("dk")
    t = FunctionTransport(lambda r: "id", lambda rid: None, lambda key: None)
    assert isinstance(t.read_back("id"), NotFound) and isinstance(t.lookup("dk"), NotFound)
    assert FunctionTransport(lambda r: "id").lookup("dk") == Unsupported("no lookup callable")
    with pytest.raises(FunctionTransportError, match="without a usable id"):
        FunctionTransport(lambda r: "id", lookup=lambda key: {"no": "id"}).lookup("dk")


def test_lookup_gets_the_key_the_send_went_out_under():
    seen: list[str] = []
    t = FunctionTransport(lambda r: "id", lookup=lambda key: seen.append(key) or {"id": "m-9", "text": "x"})
    assert t.lookup("dk", resend_epoch=1, fence_epoch=2) == Found("m-9", {"id": "m-9", "text": "x"})
    assert seen == [WireRequest(body={}, delivery_key="dk", resend_epoch=1, fence_epoch=2).idempotency_key]


def test_capabilities_follow_the_callables_given():
    bare = FunctionTransport(lambda r: "id")
    assert (bare.capabilities.read_back, bare.capabilities.lookup_by_key, bare.capabilities.fenced_lookup) == (
        False,
        False,
        False,
    )
    full = FunctionTransport(lambda r: "id", lambda i: None, lambda k: None, lookup_fenced=True)
    assert (full.capabilities.read_back, full.capabilities.lookup_by_key, full.capabilities.fenced_lookup) == (
        True,
        True,
        True,
    )
    with pytest.raises(ValueError, match="lookup_fenced needs a lookup"):
        FunctionTransport(lambda r: "id", lookup_fenced=True)


def test_read_back_compares_only_the_projected_fields():
    t = FunctionTransport(
        lambda r: "id", lambda i: {"title": "Hi", "html": "<p>Hi</p>"}, projection={"/subject": "/title"}
    )
    wire = WireRequest(body={"subject": "Hi"}, delivery_key="dk")
    assert t.matches(wire, t.read_back("id"))
    differs = t.compare(WireRequest(body={"subject": "Bye"}, delivery_key="dk"), t.read_back("id"))
    assert differs.evidence() == {"field": "/subject", "sent": {"/subject": "Bye"}, "found": {"/subject": "Hi"}}


def test_the_readme_example_sends_one_message_through_smtplib(smtp):
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text("utf-8")
    code = re.search(r"here `smtplib`.*?```py\n(.*?)```", readme, re.S).group(1)
    assert len(code.splitlines()) <= 10
    namespace = {
        "smtplib": smtplib,
        "EmailMessage": EmailMessage,
        "FunctionTransport": FunctionTransport,
        "find_by_message_id": lambda remote_id: None,
    }
    exec(code.replace('"mail.example.com", 587', f'"127.0.0.1", {smtp.port}'), namespace)
    result = namespace["transport"].send(WireRequest(body=email_body(), delivery_key="dk-readme"))
    assert result == Sent("<dk-readme@example.com>")
    assert [(m.message_id, m.rcpt_tos) for m in smtp.messages()] == [("<dk-readme@example.com>", (TO,))]


def test_the_function_transport_is_registered_as_a_transport_entry_point():
    from importlib.metadata import entry_points

    eps = {ep.name: ep for ep in entry_points(group="atmostonce.transports")}
    assert eps["function"].load() is FunctionTransport


def test_an_optional_field_absent_from_request_and_object_still_confirms():
    """A projection names every field the platform may echo; a request that leaves an optional one out is
    confirmed by an object that has none either, and refused by one that has it (or lacks a field sent)."""
    t = FunctionTransport(lambda r: "id", lambda i: {"sku": "A"}, projection={"/sku": "/sku", "/qty": "/qty"})
    assert t.matches(WireRequest(body={"sku": "A"}, delivery_key="dk"), t.read_back("id"))
    sent_qty = t.compare(WireRequest(body={"sku": "A", "qty": 2}, delivery_key="dk"), t.read_back("id"))
    assert sent_qty.evidence() == {"field": "/qty", "sent": {"/sku": "A", "/qty": 2}, "found": {"/sku": "A"}}
    extra = FunctionTransport(lambda r: "id", lambda i: {"sku": "A", "qty": 5}, projection={"/qty": "/qty"})
    assert extra.compare(WireRequest(body={"sku": "A"}, delivery_key="dk"), extra.read_back("id")).field == "/qty"
