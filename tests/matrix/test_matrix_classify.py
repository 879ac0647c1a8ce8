"""The Matrix outcome table (spec/matrix_outcomes.toml), the config, and the declared capabilities.

No homeserver needed here except for the last test, which checks that a Synapse that cannot start
fails loudly instead of being skipped.
"""

from __future__ import annotations

import copy
import tomllib

import pytest

from atmostonce.transport import Capabilities
from atmostonce_http.classify import ERROR_KINDS, OutcomeTableCode, OutcomeTableError, outcome_table
from atmostonce_matrix import DEFAULT_RESEND_WINDOW, MatrixConfig
from atmostonce_matrix.classify import (
    LOCAL_KINDS,
    load_matrix_outcomes,
    matrix_outcome_table,
    matrix_outcomes_path,
    parse_matrix_outcomes,
)
from atmostonce_matrix.synapse import SynapseError, SynapseServer

RAW = tomllib.loads(matrix_outcomes_path().read_text("utf-8"))


@pytest.mark.parametrize(
    "status, errcode, has_id, outcome, row",
    [
        (200, None, True, "success", "status:200-299"),
        (200, None, False, "unknown", "status:200-299:without_id"),
        (429, "M_LIMIT_EXCEEDED", False, "not_sent", "errcode:M_LIMIT_EXCEEDED"),
        (429, None, False, "not_sent", "status:429"),
        (403, "M_FORBIDDEN", False, "not_sent", "errcode:M_FORBIDDEN"),
        (401, "M_UNKNOWN_TOKEN", False, "not_sent", "errcode:M_UNKNOWN_TOKEN"),
        (404, "M_NOT_FOUND", False, "not_sent", "errcode:M_NOT_FOUND"),
        (413, "M_TOO_LARGE", False, "not_sent", "errcode:M_TOO_LARGE"),
        (400, "M_SOMETHING_NEW", False, "not_sent", "status:400-499"),
        (500, "M_UNKNOWN", False, "unknown", "status:500-599"),
        (500, "M_FORBIDDEN", False, "unknown", "status:500-599"),  # an errcode never makes a 5xx proof
        (502, None, False, "unknown", "status:500-599"),
        (504, None, False, "unknown", "status:500-599"),
        (302, None, False, "unknown", "status:300-399"),
        (600, None, False, "unknown", "default"),
    ],
)
def test_response_rows(status, errcode, has_id, outcome, row):
    c = matrix_outcome_table().for_response(status, errcode, has_id=has_id)
    assert (c.outcome, c.row) == (outcome, row)


def test_failure_kinds_are_classified_exactly_as_the_http_transport_does():
    matrix, http = matrix_outcome_table(), outcome_table()
    for kind in ERROR_KINDS:
        assert matrix.for_error(kind).outcome == http.for_error(kind).outcome, kind


def test_local_refusals_are_not_sent():
    for kind in LOCAL_KINDS:
        c = matrix_outcome_table().for_local(kind)
        assert (c.outcome, c.row) == ("not_sent", f"local:{kind}")


def _broken(mutate) -> dict:
    raw = copy.deepcopy(RAW)
    mutate(raw)
    return raw


Code = OutcomeTableCode


@pytest.mark.parametrize(
    "mutate, code, where",
    [
        (lambda r: r["errcodes"][0].update(statuses=[429, 503]), Code.NOT_SENT_UNPROVEN, "errcodes[0]"),
        (lambda r: r["errcodes"][0].update(outcome="success"), Code.SUCCESS_UNPROVEN, "errcodes[0].outcome"),
        (lambda r: r["errcodes"][0].update(outcome="maybe"), Code.UNKNOWN_OUTCOME, "errcodes[0].outcome"),
        (lambda r: r["errcodes"][0].update(statuses=[200]), Code.INVALID_VALUE, "errcodes[0].statuses"),
        (lambda r: r["errcodes"][0].update(statuses=[]), Code.INVALID_VALUE, "errcodes[0].statuses"),
        (lambda r: r["errcodes"][0].update(errcode="LIMIT"), Code.INVALID_VALUE, "errcodes[0].errcode"),
        (lambda r: r["errcodes"][1].update(retry=True), Code.UNKNOWN_FIELD, "errcodes[1].retry"),
        (lambda r: r["errcodes"].__setitem__(1, "M_FORBIDDEN"), Code.WRONG_TYPE, "errcodes[1]"),
        (lambda r: r.update(errcodes={}), Code.WRONG_TYPE, "errcodes"),
        (lambda r: r.pop("local"), Code.MISSING, "local"),
        (lambda r: r["local"].pop("outside_resend_window"), Code.MISSING, "local.outside_resend_window"),
        (lambda r: r["local"].update(rate_limited={"outcome": "not_sent"}), Code.UNKNOWN_FIELD, "local.rate_limited"),
        (
            lambda r: r["local"]["outside_resend_window"].update(outcome="unknown"),
            Code.NOT_SENT_REQUIRED,
            "local.outside_resend_window.outcome",
        ),
        (lambda r: r["local"].update(not_logged_in="not_sent"), Code.WRONG_TYPE, "local.not_logged_in"),
        (
            lambda r: r["statuses"].insert(1, {"may_exist": True, "outcome": "unknown"}),
            Code.UNKNOWN_FIELD,
            "statuses[1].may_exist",
        ),
        (lambda r: r.update(extra=1), Code.UNKNOWN_FIELD, "extra"),
        (lambda r: r["errors"].pop("read_timeout"), Code.MISSING, "errors.read_timeout"),
        (lambda r: r.update(default="not_sent"), Code.DEFAULT_NOT_UNKNOWN, "default"),
    ],
)
def test_inconsistent_tables_are_refused(mutate, code, where):
    with pytest.raises(OutcomeTableError) as e:
        parse_matrix_outcomes(_broken(mutate))
    assert (e.value.code, e.value.where) == (code, where)


def test_a_bad_matrix_table_file_is_named_in_its_error(tmp_path):
    bad = tmp_path / "matrix_outcomes.toml"
    bad.write_text(matrix_outcomes_path().read_text("utf-8").replace('errcode = "M_', 'errcode = "X_', 1), "utf-8")
    with pytest.raises(OutcomeTableError) as e:
        load_matrix_outcomes(bad)
    assert e.value.as_dict() == {"code": Code.INVALID_VALUE, "where": "errcodes[0].errcode", "path": str(bad)}


def test_capabilities_are_declared_honestly():
    cfg = MatrixConfig(
        homeserver_url="http://127.0.0.1:1", room_id="!r:x", user="u", password="s3cret-pw", state_path="s"
    )
    assert cfg.capabilities == Capabilities(
        read_back=True,
        lookup_by_key=True,
        fenced_lookup=False,  # a history lookup that finds nothing proves nothing
    )
    assert DEFAULT_RESEND_WINDOW < 24 * 3600
    assert "s3cret-pw" not in repr(cfg)


@pytest.mark.parametrize(
    "field, value",
    [
        ("resend_window_seconds", 24 * 3600),  # Synapse forgets txnIds after 24 h: no longer window
        ("resend_window_seconds", 0),
        ("room_id", "#alias:server"),
        ("homeserver_url", "ftp://x"),
        ("lookup_max_events", 0),
        ("read_timeout", float("nan")),
    ],
)
def test_bad_config_is_refused(field, value):
    base = {"homeserver_url": "http://127.0.0.1:1", "room_id": "!r:x", "user": "u", "password": "p", "state_path": "s"}
    with pytest.raises(ValueError):
        MatrixConfig(**{**base, field: value})
    with pytest.raises(ValueError, match="unknown"):
        MatrixConfig.from_mapping({**base, "nonsense": 1})


def test_a_synapse_that_cannot_start_fails_loudly(tmp_path):
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'no synapse here' >&2\nexit 3\n")
    fake.chmod(0o755)
    with pytest.raises(SynapseError, match=r"(?s)exited with status 3.*no synapse here"):
        SynapseServer(tmp_path / "hs", python=str(fake), start_timeout=10).start()
