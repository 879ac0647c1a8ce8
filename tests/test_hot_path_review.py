"""Adversarial review of the hot-path changes since 3b5a8e9: the intake's C-encoder canonical JSON
(``atmostonce.canonical.canonical_bytes``, first written as a fast path of ``canonical_json``), the
statement binder and encoder fast paths, the per-connection cached ``Transformer`` of ``Executor._query``,
``SqlStore._intent`` filling the frozen record directly, and the stores as context managers.

Each test names the behaviour it protects; the review found the defects the odd-value, depth and session-setting
tests hold fixed (subclasses and deep values now take the checked path; a date or time is loaded under the
session's settings)."""

from __future__ import annotations

import copy
import dataclasses
import enum
import json
import math
import pickle
import sys
from unittest import mock

import psycopg
import pytest
import rfc8785
import sqlalchemy as sa

from atmostonce import identity
from atmostonce.canonical import canonical_bytes
from atmostonce.errors import IdentityCode
from atmostonce.identity import IdentityError, delivery_key
from atmostonce.records import Intent
from atmostonce.runtime import Dispatcher
from tests.test_fused_dispatch import CONFIG, Platform, _dsn
from tests.test_prepared_statements_adversarial import _open

# -- canonical_json: the bytes (or the IdentityError) of the rfc8785 path it replaced ------------------------------


def _rfc8785_path(value):
    """``canonical_json`` as it was before the fast path (3b5a8e9): checked by ``_canonical_value``, written by
    ``rfc8785.dumps``."""
    try:
        checked = identity._canonical_value(value, "$")
    except RecursionError as exc:
        raise IdentityError("value is nested too deeply", code=IdentityCode.TOO_DEEP) from exc
    try:
        return rfc8785.dumps(checked)
    except (rfc8785.CanonicalizationError, ValueError, TypeError, RecursionError) as exc:
        raise IdentityError(f"no canonical JSON form: {exc}", code=IdentityCode.NOT_CANONICAL) from exc


def _outcome(fn, value):
    """The bytes, or the error as structured fields (an IdentityError's code and field; else its type)."""
    try:
        return ("bytes", fn(value))
    except IdentityError as exc:
        return ("IdentityError", exc.code, exc.field)
    except Exception as exc:  # noqa: BLE001 - compared between the two paths
        return ("raised", type(exc).__name__)


class CaseInsensitive(str):
    """A str subclass that orders (and compares) case-insensitively, as header- or tag-name types do."""

    def __eq__(self, other):
        return isinstance(other, str) and self.lower() == other.lower()

    def __hash__(self):
        return hash(self.lower())

    def __lt__(self, other):
        return self.lower() < other.lower()

    def __gt__(self, other):
        return self.lower() > other.lower()


class OtherHash(str):
    """Equal to the plain str of the same text, but hashed apart from it: a dict holds both as keys."""

    __eq__ = str.__eq__

    def __hash__(self):
        return 12345


class RepeatingItems(dict):
    """A dict subclass whose ``items()`` names one key twice (the later value is the one a dict keeps)."""

    def items(self):
        return [("a", 1), ("a", 2)]


class ListItems(dict):
    """A dict subclass whose ``items()`` gives pairs as lists, not tuples."""

    def items(self):
        return [["a", 1]]


class IntWithInt(int):
    """An int subclass whose ``int()`` is another number (rfc8785 writes ``int(value)``)."""

    def __int__(self):
        return 7


class StrProxy:
    """A proxy that claims to be a ``str`` (``__class__``), as lazy-string and object proxies do."""

    __class__ = property(lambda self: str)  # type: ignore[assignment]

    def __contains__(self, item):
        return False

    def encode(self, *args):
        return b"x"


def _mock_dict():
    m = mock.MagicMock(spec=dict)  # isinstance(m, dict) is True
    m.items.return_value = [("a", 1)]
    return m


ODD_VALUES = {
    "str-subclass-keys-ordered-by-their-own-lt": {CaseInsensitive("B"): 1, CaseInsensitive("a"): 2},
    "equal-keys-hashed-apart-with-unorderable-values": {"a": 1, OtherHash("a"): [2]},
    "equal-keys-hashed-apart-with-ordered-values": {"a": 2, OtherHash("a"): 1},
    "dict-subclass-items-repeat-a-key": RepeatingItems(a=1),
    "dict-subclass-items-as-lists": ListItems(a=1),
    "int-subclass-with-own-int": [IntWithInt(3)],
    "mock-spec-dict": "mock",
    "str-proxy": "proxy",
}


@pytest.mark.parametrize("case", list(ODD_VALUES))
def test_canonical_bytes_of_an_odd_value_is_what_the_rfc8785_path_gave(case):
    """Values the fast path's ``_plain`` calls plain but the C encoder reads differently from rfc8785: key order
    by the key type's own ``<`` (rfc8785: UTF-16 code units), the items list sorted as (key, value) tuples
    (values compared when keys are equal), ``items()`` written as given instead of through a dict, ``__class__``
    proxies that ``isinstance`` accepts and the C encoder refuses with a raw TypeError. Each must give the old
    path's bytes, or its IdentityError code and field.

    BUG, as found: case-insensitive keys ``{"B":1,"a":2}`` come out ``{"a":2,"B":1}``; equal keys hashed apart
    raise ``TypeError`` or are ordered by value; repeated items are written twice (``{"a":1,"a":2}``, the old
    path: ``{"a":2}``); items given as lists raise ``ValueError``; ``IntWithInt(3)`` is ``3`` (old: ``7``);
    ``MagicMock(spec=dict)`` raises ``TypeError`` (old: ``{"a":1}``); a ``__class__`` str proxy raises a bare
    ``TypeError`` instead of ``IdentityError(NOT_CANONICAL)``."""
    value = ODD_VALUES[case]
    if value == "mock":
        value = _mock_dict()
    elif value == "proxy":
        value = StrProxy()
    assert _outcome(canonical_bytes, value) == _outcome(_rfc8785_path, value)


def test_a_delivery_key_with_str_subclass_keys_is_the_one_the_rfc8785_path_hashed():
    """The delivery key keeps the request's key objects (``normalize_projection`` rebuilds dicts with the same
    keys), so a key type with its own ordering changes the delivery key itself: the same request would get
    a new identity after the upgrade, and an intent submitted before it would not be found."""
    request = {CaseInsensitive("Body"): "hi", CaseInsensitive("attachments"): []}
    projected = identity.normalize_projection(request)
    before = identity.digest_bytes(_rfc8785_path(["atmostonce/delivery-key", 1, "acct", "post", "room", projected]))
    assert delivery_key("acct", "post", "room", request) == before


def test_canonical_bytes_never_writes_an_object_with_a_repeated_key():
    """RFC 8785 objects have unique keys (I-JSON); a dict subclass whose ``items()`` repeats a key was
    collapsed by the old path into the one dict entry."""
    raw = canonical_bytes({"outer": RepeatingItems(a=1)})

    def unique(pairs):
        keys = [k for k, _ in pairs]
        assert len(keys) == len(set(keys)), keys
        return dict(pairs)

    assert json.loads(raw, object_pairs_hook=unique) == {"outer": {"a": 2}}


def _nested_dict(depth):
    v = "x"
    for _ in range(depth):
        v = {"k": v}
    return v


def _nested_list(depth):
    v = "x"
    for _ in range(depth):
        v = [v]
    return v


@pytest.mark.slow  # builds and walks nestings thousands deep: 10 to 16 s on a slow machine
@pytest.mark.parametrize("shape", [_nested_dict, _nested_list], ids=["dicts", "lists"])
def test_canonical_bytes_refuses_exactly_the_depths_the_rfc8785_path_refused(shape):
    """Nesting up to and past the recursion limit, each depth at the same call depth on both paths (the checked
    path is reached through one call, as ``canonical_bytes`` reaches it): every depth gives the checked path's
    bytes or its IdentityError (TOO_DEEP or NOT_CANONICAL). The review found (dicts) that at the last depth or
    two before the limit the checked path ran out of stack inside rfc8785 (NOT_CANONICAL) while the fast path
    (one Python frame per level, then the C encoder) returned bytes; deep values now take the checked path."""
    differ = []
    for depth in range(1, sys.getrecursionlimit() + 20):
        value = shape(depth)
        new, old = _outcome(canonical_bytes, value), _outcome(lambda v: _rfc8785_path(v), value)
        if new != old:
            differ.append((depth, new[0], old[0] if old[0] == "bytes" else old[1]))
    assert differ == []


HELD = {
    "int-enum": {"x": enum.IntEnum("E", {"A": 5}).A},
    "str-enum": {"x": enum.Enum("S", {"A": "val"}, type=str).A},
    "line-and-paragraph-separators-del-controls": ['\u2028\u2029\x7f\x1f\x08\x0c\n\r\t"\\/'],
    "nul-in-value": {"a": ["ok", "\x00"]},
    "nul-in-key": {"a\x00": 1},
    "lone-surrogate-key": {"\ud800": 1},
    "lone-surrogate-value": {"a": {"b": "\udfff"}},
    "surrogate-pair-spelled-as-two-lone-ones": ["\ud83d\ude00"],
    "keys-differing-only-in-astral-characters": {"a\U0001f600": 1, "a\uffff": 2, "a\U00010000": 3},
    "largest-and-smallest-53-bit-ints": [2**53 - 1, -(2**53 - 1)],
    "int-just-past-53-bits": [2**53],
    "negative-int-just-past-53-bits": {"n": -(2**53)},
    "huge-int": [10**400],
    "minus-zero-and-floats": [-0.0, 0.0, 1e21, 1e-7, 0.1],
    "nan": [math.nan],
    "tuples": ("a", (1, (True, None))),
    "non-str-key": {1: "a"},
    "bool-key": {True: "a"},
    "user-dict": __import__("collections").UserDict(a=1),
    "bytes": [b"x"],
    "empty-containers": {"": [], "e": {}},
}


@pytest.mark.parametrize("case", list(HELD))
def test_canonical_bytes_of_a_value_that_held_is_what_the_rfc8785_path_gave(case):
    """What held in review: the fast path gives the old bytes or the same IdentityError code and field."""
    value = HELD[case]
    assert _outcome(canonical_bytes, value) == _outcome(_rfc8785_path, value)


def test_canonical_bytes_of_a_circular_value_is_too_deep_on_both_paths():
    loop: list = []
    loop.append({"again": loop})
    assert (
        _outcome(canonical_bytes, loop)
        == _outcome(_rfc8785_path, loop)
        == ("IdentityError", IdentityCode.TOO_DEEP, None)
    )


# -- PostgreSQL: the statement encoder, the cached Transformer, the record, the context manager --------------------


def _database_setting(url, setting, value):
    with psycopg.connect(_dsn(url), autocommit=True) as admin:
        db = admin.execute("SELECT current_database()").fetchone()[0]
        admin.execute(f'ALTER DATABASE "{db}" SET {setting} = {value}')


def _run(store, stmts, params, autocommit):
    """A cached statement's first row through the prepared path (autocommit) or psycopg's cursor (in a
    transaction); an error as its type and its cause's type."""
    try:
        with store._exec.tx(autocommit=autocommit) as conn:
            row = store._exec.run(conn, stmts, "q", params)
    except Exception as exc:  # noqa: BLE001 - compared between the paths
        cause = getattr(exc.__cause__, "orig", exc.__cause__)
        return ("error", type(exc).__name__, type(cause).__name__)
    # repr: -0.0 and 0.0 apart, NaN equal to NaN
    return {k: (repr(v), type(v).__name__, getattr(v, "utcoffset", lambda: None)()) for k, v in row.items()}


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("setting", "value", "sql"),
    [
        ("TimeZone", "'Asia/Tokyo'", "timestamptz '2024-12-25 10:00:00+00'"),
        ("DateStyle", "'SQL, DMY'", "date '2024-12-25'"),
        ("DateStyle", "'German'", "timestamp '2024-12-25 10:00:00'"),
    ],
    ids=["timezone", "datestyle-sql", "datestyle-german"],
)
def test_a_date_or_time_reads_back_under_the_sessions_settings_as_the_cursor_path_reads_it(pg_url, setting, value, sql):
    """BUG. The cached ``Transformer`` is built from ``_Loading``, whose ``connection`` is ``None``; psycopg's
    date and time loaders read the session's ``DateStyle`` and ``TimeZone`` from their connection, so without
    it they assume ``ISO`` and UTC. Under a database default ``DateStyle = 'SQL, DMY'`` a date the cursor path
    reads as 2024-12-25 is refused (``can't parse date '25/12/2024'``); under ``TimeZone = 'Asia/Tokyo'`` a
    timestamptz comes back in UTC where the cursor (and the old per-call ``Transformer(raw)``) gives +09:00."""
    _database_setting(pg_url, setting, value)
    stmts = {"q": sa.select(sa.text(f"{sql} AS x"))}
    store = _open(pg_url)
    try:
        for _ in range(2):  # the first run builds the cached Transformer, the second reuses it
            assert _run(store, stmts, {}, True) == _run(store, stmts, {}, False)
    finally:
        store.close()


@pytest.mark.postgres
def test_a_loader_registered_when_the_pool_connects_is_used_by_the_prepared_path(pg_url):
    """Held: a loader registered in the engines' ``connect`` event (before any statement ran) is the one the
    cached ``Transformer`` uses, for text and for jsonb, as on the cursor path."""
    from psycopg.types.json import set_json_loads
    from psycopg.types.string import TextLoader

    class Upper(TextLoader):
        def load(self, data):
            return super().load(data).upper()

    def register(dbapi_conn, _record):
        dbapi_conn.adapters.register_loader("text", Upper)
        set_json_loads(lambda s: {"loaded": json.loads(s)}, dbapi_conn)

    store = _open(pg_url)
    try:
        store.close()  # the pools reconnect after close, now through the listener
        for engine in (store._exec.engine, store._exec.autocommit):
            sa.event.listen(engine, "connect", register)
        stmts = {
            "q": sa.select(
                sa.cast(sa.bindparam("p_t", type_=sa.Text), sa.Text).label("t"),
                sa.cast(sa.cast(sa.bindparam("p_j", type_=sa.Text), sa.Text), sa.dialects.postgresql.JSONB).label("j"),
            )
        }
        params = {"p_t": "abc", "p_j": '{"a": 1}'}
        for _ in range(2):
            prepared, cursor = _run(store, stmts, params, True), _run(store, stmts, params, False)
            assert prepared == cursor
            assert (prepared["t"][0], prepared["j"][0]) == ("'ABC'", "{'loaded': {'a': 1}}")
    finally:
        store.close()


@pytest.mark.postgres
def test_a_row_whose_column_type_changed_is_loaded_with_the_new_type_on_every_pooled_connection(pg_url):
    """Held: after ``ALTER COLUMN ... TYPE`` the cached plans fail with 0A000 on each connection; each is
    prepared again with a new Transformer, so ``created_at`` (float8 made numeric) and ``attempt_count``
    (integer made text) load as the cursor path loads them, not with the loaders cached before."""
    from decimal import Decimal

    store = _open(pg_url, pool_size=2)
    try:
        dispatcher = Dispatcher(store, Platform(), CONFIG)
        key, _ = dispatcher.publish("acct", "post", "room-1", {"text": "one"})
        # warm both pooled autocommit connections so each caches the find statement's Transformer
        with store._exec.tx(autocommit=True) as a, store._exec.tx(autocommit=True) as b:
            assert a.connection.dbapi_connection is not b.connection.dbapi_connection
        for _ in range(3):
            assert isinstance(store.get(key).created_at, float)
        with psycopg.connect(_dsn(pg_url), autocommit=True) as admin:
            admin.execute("ALTER TABLE aom_intents ALTER COLUMN created_at TYPE numeric")
            admin.execute("ALTER TABLE aom_intents ALTER COLUMN attempt_count TYPE text")
        for _ in range(4):
            it = store.get(key)
            assert (type(it.created_at), type(it.attempt_count), it.attempt_count) == (Decimal, str, "1")
    finally:
        store.close()


@pytest.mark.postgres
def test_a_constant_is_sent_unless_the_caller_names_it_and_odd_values_read_back_as_the_cursor_reads_them(pg_url):
    """Held: the encoder's template of constants, its fast paths and its fallback give what psycopg's cursor
    gives: a constant named by the caller is replaced, a missing required bind is refused on both paths, and
    str/int/float subclasses, Decimal, NaN, infinities, -0.0, very large ints and NUL in text behave alike."""
    import decimal

    class S(str):
        def __str__(self):
            return "not-this"

    class F(float):
        def __repr__(self):
            return "not-this"

    class Color(enum.IntEnum):
        RED = 3

    stmts = {
        "q": sa.select(
            sa.cast(sa.bindparam("c", value="const", type_=sa.Text), sa.Text).label("c"),
            sa.cast(sa.bindparam("v", type_=sa.Text), sa.Text).label("v"),
            sa.cast(sa.bindparam("f", type_=sa.Float(53)), sa.Float(53)).label("f"),
            sa.cast(sa.bindparam("n", type_=sa.Numeric), sa.Numeric).label("n"),
            sa.cast(sa.bindparam("i", type_=sa.BigInteger), sa.BigInteger).label("i"),
            sa.cast(sa.bindparam("b", value=True, type_=sa.Boolean), sa.Boolean).label("b"),
        )
    }
    base = {"v": "x", "f": 1.5, "n": decimal.Decimal("1.25"), "i": 1}
    cases = [
        base,
        {**base, "c": "named"},
        {**base, "c": None, "b": None},
        {**base, "b": False},
        {k: v for k, v in base.items() if k != "v"},
        {**base, "v": S("sub")},
        {**base, "v": "a\x00b"},
        {**base, "v": S("a\x00b")},
        {**base, "c": "a\x00b"},
        {**base, "f": F(2.5)},
        {**base, "f": -0.0},
        {**base, "f": math.inf},
        {**base, "f": -math.inf},
        {**base, "n": decimal.Decimal("NaN")},
        {**base, "i": Color.RED},
        {**base, "i": 2**63},
    ]
    store = _open(pg_url)
    try:
        seen = []
        for params in cases:
            prepared, cursor = _run(store, stmts, params, True), _run(store, stmts, params, False)
            assert prepared == cursor, (params, prepared, cursor)
            seen.append(prepared)
        assert [seen[i]["c"][0] for i in (0, 1, 2)] == ["'const'", "'named'", "None"]
        assert (seen[4][0], seen[5]["v"][0], seen[9]["f"][0], seen[10]["f"][0]) == ("error", "'sub'", "2.5", "-0.0")
        assert [seen[i][2] for i in (6, 7, 8)] == ["DataError"] * 3
    finally:
        store.close()


def _normal_intent(it):
    return Intent(**{f.name: getattr(it, f.name) for f in dataclasses.fields(Intent)})


@pytest.mark.postgres
def test_an_intent_read_from_the_store_is_the_record_its_constructor_makes(pg_url):
    """Held: ``_intent`` fills the frozen record's ``__dict__`` directly; the record is equal to (and repr,
    pickles, copies, replaces and converts as) the one ``Intent(**fields)`` makes, with every field set and
    no attribute besides them, and it stays frozen."""
    store = _open(pg_url)
    try:
        key, _ = Dispatcher(store, Platform(), CONFIG).publish("acct", "post", "room-1", {"text": "one"})
        it = store.get(key)
        normal = _normal_intent(it)
        assert vars(it) == vars(normal) and list(vars(it)) == [f.name for f in dataclasses.fields(Intent)]
        assert it == normal and repr(it) == repr(normal)
        assert pickle.loads(pickle.dumps(it)) == normal
        assert copy.deepcopy(it) == normal and copy.copy(it) == normal
        assert dataclasses.asdict(it) == dataclasses.asdict(normal)
        assert dataclasses.replace(it, state="x") == dataclasses.replace(normal, state="x")
        assert dataclasses.replace(it) == normal
        with pytest.raises(dataclasses.FrozenInstanceError):
            it.state = "x"  # type: ignore[misc]
        with pytest.raises(TypeError):  # request is a dict: unhashable, as for the normal record
            hash(it)
    finally:
        store.close()


@pytest.mark.postgres
def test_a_store_used_as_a_context_manager_closes_its_connections_and_raises_what_the_block_raised(pg_url):
    """Held: ``with open_store(url) as store`` gives the store, and at the block's end (normal or raising) every
    pooled connection of both pools is closed on the server; the block's exception is not swallowed."""
    from atmostonce import MemoryStore
    from atmostonce_sql import open_store

    def sessions(until_none: bool = False):
        """The other sessions on the database. A closed connection's server process leaves a moment after the
        client hung up: with ``until_none``, polled (up to 2000 times) until none is left, a wait for a
        condition and not a timing."""
        with psycopg.connect(_dsn(pg_url), autocommit=True) as admin:
            for _ in range(2000):
                n = admin.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
                ).fetchone()[0]
                if n == 0 or not until_none:
                    return n
                admin.execute("SELECT pg_sleep(0.005)")
            return n

    opened = open_store(pg_url, migrate=False, pool_size=1)
    with opened as store:
        assert store is opened
        Dispatcher(store, Platform(), CONFIG).publish("acct", "post", "room-1", {"text": "one"})
        assert sessions() >= 2
    assert sessions(until_none=True) == 0

    with pytest.raises(KeyError), open_store(pg_url, migrate=False, pool_size=1) as store:
        Dispatcher(store, Platform(), CONFIG).publish("acct", "post", "room-1", {"text": "two"})
        raise KeyError("inside")
    assert sessions(until_none=True) == 0

    memory = MemoryStore()
    with memory as store:
        assert store is memory
