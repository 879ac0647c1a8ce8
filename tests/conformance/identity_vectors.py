"""Writes and checks spec/conformance/identity_vectors.json from the reference identity functions.

The inputs below are the vectors; the expected values are computed by ``atmostonce.identity``
(``delivery_key``, ``request_digest``, ``text_digest``, ``source_version``) and written beside them,
so an implementation in any language checks its identity functions against data, not our code.
``python -m tests.conformance.identity_vectors`` rewrites the file; ``test_planted_bugs.py`` fails
when the file and the functions disagree.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from atmostonce import identity
from atmostonce.conformance import cases_dir

PATH = cases_dir() / "identity_vectors.json"

DELIVERY: list[dict[str, Any]] = [
    {"id": "plain", "description": "a plain text request", "request": {"text": "hello"}},
    {
        "id": "key-order-a",
        "description": "two fields, text first",
        "request": {"text": "hello", "link": "https://example.org/a"},
    },
    {
        "id": "key-order-b",
        "description": "the same two fields, link first: the same key and digest as key-order-a",
        "request": {"link": "https://example.org/a", "text": "hello"},
    },
    {
        "id": "unicode-nfc",
        "description": "text in Unicode NFC (U+00E9)",
        "request": {"text": "caf\u00e9 au lait"},
    },
    {
        "id": "unicode-nfd",
        "description": "the same text in NFD: the key and text key of unicode-nfc, another digest",
        "request": {"text": "cafe\u0301 au lait"},
    },
    {
        "id": "whitespace-folded",
        "description": "inner runs of spaces, tabs, no-break spaces and outer spaces fold away",
        "request": {"text": "  two \t  words\u00a0here  "},
    },
    {
        "id": "whitespace-plain",
        "description": "the folded form of whitespace-folded",
        "request": {"text": "two words here"},
    },
    {"id": "line-endings-lf", "description": "two lines joined by LF", "request": {"text": "line one\nline two"}},
    {
        "id": "line-endings-crlf",
        "description": "the same two lines joined by CRLF, with trailing spaces and a final newline",
        "request": {"text": "line one  \r\nline two\r\n"},
    },
    {
        "id": "line-endings-cr",
        "description": "the same two lines joined by a lone CR",
        "request": {"text": "line one\rline two"},
    },
    {
        "id": "blank-lines-folded",
        "description": "three or more newlines fold to one blank line",
        "request": {"text": "para one\n\n\n\npara two"},
    },
    {
        "id": "invisible-characters",
        "description": "zero-width space, soft hyphen and BOM are dropped before hashing",
        "request": {"text": "\ufeffzero\u200bwidth soft\u00adhyphen"},
    },
    {
        "id": "nested-numbers-a",
        "description": "nested objects and arrays with 1.0, 1e2, 0.5 and -0.0",
        "request": {"text": "numbers", "meta": {"n": 1.0, "m": [1e2, 0.5, -0.0], "deep": {"b": True, "a": None}}},
    },
    {
        "id": "nested-numbers-b",
        "description": "the same values as 1, 100, 0.5 and 0 with every object in another key order",
        "request": {"meta": {"deep": {"a": None, "b": True}, "m": [100, 0.5, 0], "n": 1}, "text": "numbers"},
    },
    {
        "id": "large-and-small-numbers",
        "description": "numbers RFC 8785 writes with an exponent or many digits",
        "request": {"text": "range", "values": [1e21, 1e-7, 123456789012345, 0.1, -1.5e300]},
    },
    {
        "id": "key-order-by-utf16",
        "description": "object keys sorted by UTF-16 code units: an astral key sorts before U+FFFD",
        "request": {"text": "keys", "\ufffd": 1, "\U0001f600": 2, "\u00e9": 3, "z": 4, "a": 5},
    },
    {
        "id": "no-text-field",
        "description": "a reaction without a text field has no text key",
        "action_kind": "react",
        "request": {"emoji": "+1", "message_id": "m-1"},
    },
    {
        "id": "other-target",
        "description": "the plain request on another target is another delivery",
        "target": "room-2",
        "request": {"text": "hello"},
    },
]

SOURCE: list[dict[str, Any]] = [
    {"id": "source-plain", "description": "a two-line source body", "body": "first line\nsecond line"},
    {
        "id": "source-whitespace-churn",
        "description": "the same body with CRLF, trailing spaces and doubled spaces: the same version",
        "body": "first line   \r\nsecond  line\r\n",
    },
    {"id": "source-unicode-nfc", "description": "a body in NFC", "body": "caf\u00e9 \u2014 open"},
    {
        "id": "source-unicode-nfd",
        "description": "the same body in NFD with a no-break space: the version of source-unicode-nfc",
        "body": "cafe\u0301\u00a0\u2014 open\n",
    },
    {
        "id": "source-other-id",
        "description": "the plain body under another source id is another version",
        "source_id": "https://example.org/other",
        "body": "first line\nsecond line",
    },
]

DEFAULTS = {"account": "acct", "action_kind": "post", "target": "room-1"}
SOURCE_ID = "https://example.org/story"


def delivery_values(v: dict[str, Any]) -> dict[str, Any]:
    a = {k: v.get(k, d) for k, d in DEFAULTS.items()}
    stored = identity.load_canonical(identity.canonical_json(v["request"]))
    text = stored.get("text")
    return {
        "delivery_key": identity.delivery_key(a["account"], a["action_kind"], a["target"], v["request"]),
        "request_digest": identity.request_digest(stored),
        "text_key": identity.text_digest(text) if isinstance(text, str) else None,
    }


def source_values(v: dict[str, Any]) -> dict[str, Any]:
    return {"source_version": identity.source_version(v.get("source_id", SOURCE_ID), v["body"])}


def document() -> dict[str, Any]:
    head = lambda v: {"id": v["id"], "description": v["description"]}  # noqa: E731
    delivery = [{**head(v), **DEFAULTS, **v, **delivery_values(v)} for v in DELIVERY]
    source = [{**head(v), "source_id": SOURCE_ID, **v, **source_values(v)} for v in SOURCE]
    return {
        "format": 1,
        "normalizer_version": identity.NORMALIZER_VERSION,
        "title": "Identity test vectors: delivery keys, request digests, text keys and source versions",
        "about": (
            "Inputs and the values the reference identity functions give for them (SHA-256 over RFC 8785 "
            "canonical JSON of a domain-tagged tuple, text normalized by normalizer v1; docs/conformance.md, "
            "'Identity test vectors'). Each delivery vector is submitted as it stands (account, action_kind, "
            "target, request) and the intent must carry key = delivery_key, request_digest and text_hash = "
            "text_key; each source vector is captured (source_id, body) and must give version = source_version. "
            "Generated by tests/conformance/identity_vectors.py; never edit the values by hand."
        ),
        "delivery": delivery,
        "source": source,
    }


def render() -> str:
    return json.dumps(document(), indent=1, ensure_ascii=False) + "\n"


def main() -> None:
    Path(PATH).write_text(render(), encoding="utf-8")


if __name__ == "__main__":
    main()
