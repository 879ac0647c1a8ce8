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
    OutcomeTableCode,
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


Code = OutcomeTableCode


@pytest.mark.parametrize(
    ("mutate", "code", "where"),
    [
        (lambda t: t["errors"].pop("read_timeout"), Code.MISSING, "errors.read_timeout"),
        (lambda t: t["errors"].__setitem__("made_up", {"outcome": "unknown"}), Code.UNKNOWN_FIELD, "errors.made_up"),
        (lambda t: t.pop("errors"), Code.MISSING, "errors"),
        (lambda t: t["errors"].__setitem__("other", "unknown"), Code.WRONG_TYPE, "errors.other"),
        (
            lambda t: t["errors"]["read_timeout"].__setitem__("outcome", "maybe"),
            Code.UNKNOWN_OUTCOME,
            "errors.read_timeout.outcome",
        ),
        (
            lambda t: t["errors"]["dns_failure"].__setitem__("outcome", "success"),
            Code.SUCCESS_UNPROVEN,
            "errors.dns_failure.outcome",
        ),
        (lambda t: t.__setitem__("default", "not_sent"), Code.DEFAULT_NOT_UNKNOWN, "default"),
        (lambda t: t.__setitem__("default", "maybe"), Code.UNKNOWN_OUTCOME, "default"),
        (lambda t: t.__setitem__("format", 2), Code.FORMAT, "format"),
        (lambda t: t["statuses"][3].pop("without_id"), Code.MISSING, "statuses[3].without_id"),
        (
            lambda t: t["statuses"][3].__setitem__("without_id", "success"),
            Code.SUCCESS_UNPROVEN,
            "statuses[3].without_id",
        ),
        (lambda t: t["statuses"][3].__setitem__("without_id", "gone"), Code.UNKNOWN_OUTCOME, "statuses[3].without_id"),
        (lambda t: t["statuses"][2].__setitem__("outcome", "gone"), Code.UNKNOWN_OUTCOME, "statuses[2].outcome"),
        (lambda t: t["statuses"][2].__setitem__("range", [499, 400]), Code.INVALID_VALUE, "statuses[2].range"),
        (lambda t: t["statuses"][1].__setitem__("range", [400, 499]), Code.SELECTOR, "statuses[1]"),
        (lambda t: t["statuses"][1].__setitem__("codes", []), Code.INVALID_VALUE, "statuses[1].codes"),
        (lambda t: t["statuses"][0].__setitem__("may_exist", False), Code.INVALID_VALUE, "statuses[0].may_exist"),
        (lambda t: t["statuses"][0].__setitem__("typo", 1), Code.UNKNOWN_FIELD, "statuses[0].typo"),
        (lambda t: t.pop("statuses"), Code.MISSING, "statuses"),
    ],
)
def test_loader_refuses_bad_tables(mutate, code, where):
    raw = raw_table()
    mutate(raw)
    with pytest.raises(OutcomeTableError) as e:
        parse_outcome_table(raw)
    assert e.value.as_dict() == {"code": code, "where": where, "path": None}


def test_a_bad_row_in_a_file_names_the_file_and_the_field(tmp_path):
    bad = tmp_path / "http_outcomes.toml"
    bad.write_text(outcomes_path().read_text("utf-8").replace('outcome = "not_sent"', 'outcome = "maybe"', 1))
    with pytest.raises(OutcomeTableError) as e:
        load_outcome_table(bad)
    assert e.value.as_dict() == {
        "code": Code.UNKNOWN_OUTCOME,
        "where": "errors.invalid_request.outcome",
        "path": str(bad),
    }


def test_loader_refuses_missing_and_malformed_files(tmp_path):
    with pytest.raises(OutcomeTableError) as e:
        load_outcome_table(tmp_path / "absent.toml")
    assert e.value.as_dict() == {"code": Code.NOT_FOUND, "where": None, "path": str(tmp_path / "absent.toml")}
    bad = tmp_path / "bad.toml"
    bad.write_text("this is = = not toml", "utf-8")
    with pytest.raises(OutcomeTableError) as e:
        load_outcome_table(bad)
    assert e.value.as_dict() == {"code": Code.NOT_TOML, "where": None, "path": str(bad)}
