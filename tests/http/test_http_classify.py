"""The classification table: where it lives, what it says, and what the loader refuses."""

from __future__ import annotations

import socket
import ssl
import tomllib

import httpx
import pytest

from atmostonce.table import spec_dir
from atmostonce_http.classify import (
    ERROR_KINDS,
    OUTCOMES,
    OutcomeTableError,
    error_kind,
    load_outcome_table,
    outcome_table,
    outcomes_path,
    parse_outcome_table,
)


def raw_table() -> dict:
    return tomllib.loads(outcomes_path().read_text("utf-8"))


def test_table_is_found_beside_table_toml():
    assert outcomes_path() == spec_dir() / "http_outcomes.toml"
    assert outcomes_path().is_file()


def test_load_from_explicit_path_matches_shipped(tmp_path):
    copy = tmp_path / "http_outcomes.toml"
    copy.write_text(outcomes_path().read_text("utf-8"), "utf-8")
    assert load_outcome_table(copy) == outcome_table()


def test_every_error_kind_has_exactly_one_row():
    table = outcome_table()
    assert set(table.errors) == set(ERROR_KINDS)
    assert all(row.outcome in OUTCOMES and row.rule for row in table.errors.values())


@pytest.mark.parametrize(
    ("kind", "outcome"),
    [
        ("invalid_request", "not_sent"),
        ("dns_failure", "not_sent"),
        ("connect_refused", "not_sent"),
        ("connect_timeout", "not_sent"),
        ("tls_handshake", "not_sent"),
        ("connect_error", "not_sent"),
        ("pool_timeout", "not_sent"),
        ("write_timeout", "unknown"),
        ("write_error", "unknown"),
        ("read_timeout", "unknown"),
        ("read_error", "unknown"),
        ("remote_protocol", "unknown"),
        ("other", "unknown"),
    ],
)
def test_error_rows(kind, outcome):
    assert outcome_table().for_error(kind).outcome == outcome


@pytest.mark.parametrize(
    ("status", "has_id", "may_exist", "outcome"),
    [
        (200, True, (409,), "success"),
        (201, True, (409,), "success"),
        (204, False, (409,), "unknown"),
        (201, False, (409,), "unknown"),
        (301, True, (409,), "unknown"),
        (400, False, (409,), "not_sent"),
        (404, False, (409,), "not_sent"),
        (409, False, (409,), "unknown"),
        (409, False, (), "not_sent"),
        (422, False, (409, 422), "unknown"),
        (429, False, (409,), "not_sent"),
        (429, False, (429,), "unknown"),  # the platform's own word wins: may-exist is checked first
        (500, True, (409,), "unknown"),
        (599, False, (409,), "unknown"),
        (100, False, (409,), "unknown"),
        (600, True, (409,), "unknown"),
    ],
)
def test_status_rows(status, has_id, may_exist, outcome):
    assert outcome_table().for_status(status, has_id=has_id, may_exist_statuses=may_exist).outcome == outcome


def _chained(outer: BaseException, cause: BaseException) -> BaseException:
    outer.__cause__ = cause
    return outer


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (httpx.ConnectTimeout("t"), "connect_timeout"),
        (httpx.PoolTimeout("t"), "pool_timeout"),
        (httpx.WriteTimeout("t"), "write_timeout"),
        (httpx.ReadTimeout("t"), "read_timeout"),
        (httpx.WriteError("e"), "write_error"),
        (httpx.ReadError("e"), "read_error"),
        (httpx.RemoteProtocolError("e"), "remote_protocol"),
        (httpx.UnsupportedProtocol("e"), "invalid_request"),
        (httpx.ConnectError("e"), "connect_error"),
        (_chained(httpx.ConnectError("e"), socket.gaierror(-2, "nope")), "dns_failure"),
        (_chained(httpx.ConnectError("e"), ssl.SSLError(1, "bad")), "tls_handshake"),
        (_chained(httpx.ConnectError("e"), ConnectionRefusedError(111, "refused")), "connect_refused"),
        (httpx.DecodingError("e"), "other"),
        (RuntimeError("surprise"), "other"),
    ],
)
def test_error_kind_mapping(exc, kind):
    assert error_kind(exc) == kind


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda t: t["errors"].pop("read_timeout"), "missing"),
        (lambda t: t["errors"].__setitem__("made_up", {"outcome": "unknown"}), "extra"),
        (lambda t: t["errors"]["read_timeout"].__setitem__("outcome", "maybe"), "not one of"),
        (lambda t: t["errors"]["dns_failure"].__setitem__("outcome", "success"), "never be success"),
        (lambda t: t.__setitem__("default", "not_sent"), "default must be 'unknown'"),
        (lambda t: t.__setitem__("format", 2), "format"),
        (lambda t: t["statuses"][3].pop("without_id"), "without_id"),
        (lambda t: t["statuses"][3].__setitem__("without_id", "success"), "never be success"),
        (lambda t: t["statuses"][2].__setitem__("range", [499, 400]), "range"),
        (lambda t: t["statuses"][1].__setitem__("range", [400, 499]), "exactly one"),
        (lambda t: t["statuses"][1].__setitem__("codes", []), "codes"),
        (lambda t: t["statuses"][0].__setitem__("typo", 1), "unknown fields"),
        (lambda t: t.pop("statuses"), "statuses"),
    ],
)
def test_loader_refuses_bad_tables(mutate, message):
    raw = raw_table()
    mutate(raw)
    with pytest.raises(OutcomeTableError, match=message):
        parse_outcome_table(raw)


def test_loader_refuses_missing_and_malformed_files(tmp_path):
    with pytest.raises(OutcomeTableError, match="not found"):
        load_outcome_table(tmp_path / "absent.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("this is = = not toml", "utf-8")
    with pytest.raises(OutcomeTableError, match="not valid TOML"):
        load_outcome_table(bad)
