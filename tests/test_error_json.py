"""The JSON form of a typed refusal (``as_dict``, what ``--json`` prints and a script reads) carries every
attribute the error documents, under the attribute's own name, and nothing else."""

from __future__ import annotations

import pytest

from atmostonce.errors import (
    IntakeCode,
    IntakeError,
    NoSynchronousStandby,
    NotVerified,
    RetractionUnsupported,
    SchemaNewer,
    SequenceBehind,
)

CASES = {
    "intake_error": (
        lambda: IntakeError(
            "target is longer than 1024 characters", field="target", code=IntakeCode.TOO_LONG, limit=1024
        ),
        {"field": "target", "code": "too_long", "limit": 1024},
    ),
    "intake_error_without_a_bound": (
        lambda: IntakeError("give exactly one of expires_in and signed"),
        {"field": None, "code": None, "limit": None},
    ),
    "no_synchronous_standby": (
        lambda: NoSynchronousStandby("authorize_dispatch", "k" * 64, "", 0),
        {"event": "authorize_dispatch", "key": "k" * 64, "standby_names": "", "sync_standbys": 0},
    ),
    "not_verified": (
        lambda: NotVerified("k" * 64, "r-9", "read_back.differs", {"field": "/text"}),
        {"key": "k" * 64, "remote_id": "r-9", "outcome": "read_back.differs", "evidence": {"field": "/text"}},
    ),
    "retraction_unsupported": (
        lambda: RetractionUnsupported("k" * 64, "delete", "http", "retract.unsupported"),
        {"key": "k" * 64, "action": "delete", "transport": "http", "outcome": "retract.unsupported"},
    ),
    "schema_newer": (
        lambda: SchemaNewer("0042", "0017"),
        {"found": "0042", "known": "0017", "repair": SchemaNewer.REPAIR},
    ),
    "sequence_behind": (
        lambda: SequenceBehind((("aom_history.seq", 3, 40), ("generation", 0, 7))),
        {
            "sequence": "aom_history.seq",
            "value": 3,
            "stored_max": 40,
            "repair": SequenceBehind.REPAIR,
            "behind": [["aom_history.seq", 3, 40], ["generation", 0, 7]],
        },
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_json_form_of_a_refusal_names_every_documented_field(name):
    make, want = CASES[name]
    err = make()  # built inside the test, so a mutation tool sees which test runs the constructor
    assert err.as_dict() == want
    for field, value in want.items():
        if field != "behind":
            assert getattr(err, field) == value, field
