"""Platform profiles as data (docs/platforms.md): one TOML file per platform in spec/platforms/, loaded by one loader into
the very HttpPlatformConfig a JSON config builds; a schema check that refuses unknown fields, wrong types and a
fenced lookup without its tombstone, naming the field; ``--platform-config`` reads the same file."""

from __future__ import annotations

import dataclasses
import json
import re
import tomllib
from fnmatch import fnmatch
from pathlib import Path

import pytest

from atmostonce.names import STATE
from atmostonce.runtime import RuntimeConfig
from atmostonce_cli.main import EXIT_OK, EXIT_USAGE, main
from atmostonce_email.transport import EmailPlatformConfig
from atmostonce_http import HttpPlatformConfig, PlatformSink, sink_config
from atmostonce_http.profile import (
    PROFILE_FIELDS,
    TOMBSTONE_FIELDS,
    ProfileCode,
    ProfileError,
    Tombstone,
    load_platform_file,
    load_profile,
    parse_profile,
    profiles_dir,
    shipped_profiles,
)
from atmostonce_matrix.transport import MatrixConfig
from atmostonce_sql import open_store

ROOT = Path(__file__).resolve().parents[2]
FIELD = re.compile(r"`([a-z_]+)`")


def _profile(**top):
    http = top.pop("http", {"base_url": "http://127.0.0.1:9", "lookup_path": "/posts?key={key}"})
    return {"format": 1, "name": "t", "transport": "http", "outcomes": "http_outcomes.toml", **top, "http": http}


def _toml_value(v):
    return (
        json.dumps(v)
        if not isinstance(v, dict)
        else "{ " + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + " }"
    )


def _write_toml(path: Path, raw: dict) -> str:
    sections = [s for s in ("http", "matrix") if isinstance(raw.get(s), dict)]
    lines = [f"{k} = {_toml_value(v)}" for k, v in raw.items() if k not in sections]
    for section in sections:
        lines.append(f"[{section}]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in raw[section].items()]
    path.write_text("\n".join(lines) + "\n")
    assert tomllib.loads(path.read_text()) == raw
    return str(path)


def test_every_shipped_profile_loads_and_names_itself():
    profiles = shipped_profiles()
    assert {"local-sink", "json-server", "matrix", "email"} <= set(profiles)
    for name, path in profiles.items():
        p = load_profile(path)
        assert p.name == name and p.outcomes_path.is_file()
        assert (p.config is not None) == (p.transport == "http")


def test_the_local_sink_profile_is_the_sink_config():
    assert load_profile("local-sink", base_url="http://127.0.0.1:5").config == sink_config("http://127.0.0.1:5")


def test_a_toml_profile_and_a_json_config_of_the_same_fields_build_the_same_config(tmp_path):
    shipped = load_profile("json-server")
    as_json = tmp_path / "platform.json"
    as_json.write_text(json.dumps(shipped.config.as_mapping()))
    from_json = load_platform_file(as_json)
    assert from_json.config == shipped.config == HttpPlatformConfig.from_mapping(dict(shipped.fields))
    assert load_platform_file(profiles_dir() / "json_server.toml").config == shipped.config
    assert from_json.outcomes == shipped.outcomes


def test_overrides_fill_the_port_and_are_checked_like_the_file():
    p = load_profile("json-server", base_url="http://127.0.0.1:4567", read_back_path=None)
    assert p.config.base_url == "http://127.0.0.1:4567" and not p.config.capabilities.read_back
    with pytest.raises(ProfileError) as e:
        load_profile("json-server", read_timeout="5")
    assert (e.value.code, e.value.where) == (ProfileCode.WRONG_TYPE, "http.read_timeout")


Code = ProfileCode


def _without(raw: dict, field: str) -> dict:
    return {k: v for k, v in raw.items() if k != field}


def _matrix(**fields) -> dict:
    return {**_without(_profile(transport="matrix", outcomes="matrix_outcomes.toml"), "http"), "matrix": fields}


REFUSED = {
    "unknown top-level field": (_profile(retries=3), Code.UNKNOWN_FIELD, "retries"),
    "unknown http field": (_profile(http={"base_url": "http://x:1", "bogus": 1}), Code.UNKNOWN_FIELD, "http.bogus"),
    "wrong type in http": (
        _profile(http={"base_url": "http://x:1", "lookup_fenced": "yes"}),
        Code.WRONG_TYPE,
        "http.lookup_fenced",
    ),
    "invalid value in http": (_profile(http={"base_url": "ftp://x:1"}), Code.INVALID_VALUE, "http"),
    "missing base_url": (_profile(http={"create_path": "/p"}), Code.MISSING, "http.base_url"),
    "no transport": (_without(_profile(), "transport"), Code.MISSING, "transport"),
    "unknown transport": (_profile(transport="smtp"), Code.INVALID_VALUE, "transport"),
    "no outcomes table": (_without(_profile(), "outcomes"), Code.MISSING, "outcomes"),
    "unknown outcomes table": (_profile(outcomes="other.toml"), Code.INVALID_VALUE, "outcomes"),
    "matrix outcomes for http": (_profile(outcomes="matrix_outcomes.toml"), Code.INVALID_VALUE, "outcomes"),
    "wrong format": (_profile(format=2), Code.FORMAT, "format"),
    "no name": (_without(_profile(), "name"), Code.MISSING, "name"),
    "blank name": (_profile(name=" "), Code.INVALID_VALUE, "name"),
    "name as a number": (_profile(name=7), Code.WRONG_TYPE, "name"),
    "description as a number": (_profile(description=7), Code.WRONG_TYPE, "description"),
    "negative read lag": (_profile(read_lag_seconds=-1), Code.INVALID_VALUE, "read_lag_seconds"),
    "read lag as text": (_profile(read_lag_seconds="1"), Code.WRONG_TYPE, "read_lag_seconds"),
    "fenced without tombstone": (
        _profile(http={"base_url": "http://x:1", "lookup_path": "/p?k={key}", "lookup_fenced": True}),
        Code.MISSING,
        "tombstone",
    ),
    "tombstone without fence": (_profile(tombstone={"kept": "forever"}), Code.NOT_FENCED, "tombstone"),
    "tombstone not a table": (_profile(tombstone="forever"), Code.WRONG_TYPE, "tombstone"),
    "retention without age bound": (
        _profile(tombstone={"kept": "retention", "retention_seconds": 60}),
        Code.MISSING,
        "tombstone.age_bound",
    ),
    "retention of no time": (
        _profile(tombstone={"kept": "retention", "retention_seconds": 0, "age_bound": "x"}),
        Code.INVALID_VALUE,
        "tombstone.retention_seconds",
    ),
    "forever with a retention": (
        _profile(tombstone={"kept": "forever", "retention_seconds": 60}),
        Code.UNKNOWN_FIELD,
        "tombstone.retention_seconds",
    ),
    "tombstone kept sometimes": (_profile(tombstone={"kept": "sometimes"}), Code.INVALID_VALUE, "tombstone.kept"),
    "tombstone without kept": (_profile(tombstone={}), Code.MISSING, "tombstone.kept"),
    "unknown tombstone field": (
        _profile(tombstone={"kept": "forever", "ttl": 5}),
        Code.UNKNOWN_FIELD,
        "tombstone.ttl",
    ),
    "no transport table": (_without(_profile(), "http"), Code.MISSING, "http"),
    "transport table not a table": (_profile(http="http://x:1"), Code.WRONG_TYPE, "http"),
    "matrix unknown field": (_matrix(txn_prefix="x"), Code.UNKNOWN_FIELD, "matrix.txn_prefix"),
    "matrix wrong type": (_matrix(lookup_max_events="many"), Code.WRONG_TYPE, "matrix.lookup_max_events"),
    "matrix tombstone": (_matrix() | {"tombstone": {"kept": "forever"}}, Code.NOT_FENCED, "tombstone"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_profile_with_a_bad_field_is_refused_naming_the_file_and_the_field(tmp_path, case):
    raw, code, where = REFUSED[case]
    path = _write_toml(tmp_path / "bad.toml", raw)
    with pytest.raises(ProfileError) as info:
        load_platform_file(path)
    assert info.value.as_dict() == {"code": code, "where": where, "path": path}
    assert str(info.value).startswith(path)  # what `--platform-config` prints starts with the file


def test_a_profile_that_cannot_be_read_or_parsed_is_refused_naming_the_file(tmp_path):
    cases = {
        "absent.toml": (None, Code.NOT_FOUND),
        "dir.toml": ("dir", Code.UNREADABLE),
        "latin1.toml": (b"name = '\xe9'\n", Code.NOT_TEXT),
        "broken.toml": (b"format = = 1\n", Code.SYNTAX),
        "broken.json": (b"{format: 1}", Code.SYNTAX),
        "list.json": (b"[1]", Code.WRONG_TYPE),
    }
    for name, (content, code) in cases.items():
        path = tmp_path / name
        if content == "dir":
            path.mkdir()
        elif content is not None:
            path.write_bytes(content)
        with pytest.raises(ProfileError) as info:
            load_platform_file(path)
        assert info.value.as_dict() == {"code": code, "where": None, "path": str(path)}, name
    with pytest.raises(ProfileError) as info:
        load_profile("no-such-platform")
    assert info.value.as_dict() == {"code": Code.NOT_FOUND, "where": None, "path": None}


@pytest.mark.parametrize(
    "fields, code, where",
    [
        ({"base_url": "http://x:1", "bogus": 1}, Code.UNKNOWN_FIELD, "bogus"),
        ({"create_path": "/p"}, Code.MISSING, "base_url"),
        ({"base_url": "http://x:1", "connect_timeout": "5"}, Code.WRONG_TYPE, "connect_timeout"),
        ({"base_url": "http://x:1", "create_path": "p"}, Code.INVALID_VALUE, None),  # the message names the field
    ],
)
def test_a_json_file_of_config_fields_is_refused_at_the_field(tmp_path, fields, code, where):
    path = tmp_path / "platform.json"
    path.write_text(json.dumps(fields))
    with pytest.raises(ProfileError) as info:
        load_platform_file(path)
    assert info.value.as_dict() == {"code": code, "where": where, "path": str(path)}


def test_a_json_file_of_config_fields_cannot_declare_a_fenced_lookup_without_its_tombstone(tmp_path):
    """A not-found lookup proves absence only under a stated tombstone; the old JSON format has no place to
    state it, so a fenced lookup there is refused as a profile without its [tombstone] is."""
    path = tmp_path / "platform.json"
    path.write_text(json.dumps({"base_url": "http://x:1", "lookup_path": "/p?k={key}", "lookup_fenced": True}))
    with pytest.raises(ProfileError) as info:
        load_platform_file(path)
    assert info.value.as_dict() == {"code": Code.MISSING, "where": "tombstone", "path": str(path)}
    path.write_text(json.dumps({"base_url": "http://x:1", "lookup_path": "/p?k={key}"}))
    assert not load_platform_file(path).config.capabilities.fenced_lookup


def test_a_fenced_lookup_declares_its_tombstone():
    fenced = _profile(
        http={"base_url": "http://x:1", "lookup_path": "/p?k={key}", "lookup_fenced": True},
        tombstone={"kept": "retention", "retention_seconds": 86400, "age_bound": "signed request timestamp"},
    )
    p = parse_profile(fenced)
    assert p.config.capabilities.fenced_lookup
    assert p.tombstone == Tombstone("retention", 86400.0, "signed request timestamp")


def test_the_read_lag_delays_the_first_look_and_spaces_the_lookups():
    lagged = parse_profile(_profile(read_lag_seconds=2.5)).runtime_config()
    assert (lagged.first_look_after, lagged.reconcile_interval) == (2.5, 2.5)
    prompt = parse_profile(_profile()).runtime_config()
    assert (prompt.first_look_after, prompt.reconcile_interval) == (0.0, RuntimeConfig.reconcile_interval)


def test_the_matrix_profile_builds_a_matrix_config_once_the_deployment_is_given(tmp_path):
    p = load_profile("matrix")
    with pytest.raises(ProfileError) as e:
        p.matrix_config()
    assert (e.value.code, e.value.where) == (Code.MISSING, "matrix.homeserver_url")
    deployment = dict(
        homeserver_url="http://127.0.0.1:8008", room_id="!r:localhost", user="u", password="pw",
        state_path=str(tmp_path / "s.json"),
    )  # fmt: skip
    cfg = p.matrix_config(**deployment)
    assert cfg == MatrixConfig(**deployment)  # the shipped profile holds MatrixConfig's own defaults


def test_work_reads_a_toml_profile_as_platform_config(capsys, tmp_path):
    url = f"sqlite:///{tmp_path / 'w.sqlite3'}"
    store = open_store(url)
    it = store.submit("acct", "post", "room", {"text": "through a toml profile"})
    terminal = (STATE.published,)
    with PlatformSink() as sink:
        raw = tomllib.loads((profiles_dir() / "local_sink.toml").read_text())
        raw["http"]["base_url"] = sink.url
        path = _write_toml(tmp_path / "sink.toml", raw)
        rc = main(["--json", "work", "--platform-config", path, "--database-url", url])
        out = json.loads(capsys.readouterr().out)
        assert rc == EXIT_OK and sum(out.values()) == 1 and sink.creates == 1
    assert store.get(it.key).state in terminal
    store.close()


def test_work_refuses_a_matrix_profile_as_a_usage_error(capsys, tmp_path):
    url = f"sqlite:///{tmp_path / 'm.sqlite3'}"
    open_store(url).close()
    path = str(profiles_dir() / "matrix.toml")
    rc = main(["--json", "work", "--platform-config", path, "--database-url", url])
    assert rc == EXIT_USAGE and "a matrix profile" in json.loads(capsys.readouterr().out)["error"]


def test_the_wheel_ships_every_profile():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    globs = pyproject["tool"]["setuptools"]["package-data"]["atmostonce._spec"]
    files = sorted(p.relative_to(ROOT / "spec").as_posix() for p in (ROOT / "spec" / "platforms").glob("*.toml"))
    assert files and all(any(fnmatch(f, g) and "/" in g for g in globs) for f in files)


def test_every_profile_field_the_loader_accepts_is_documented():
    documented = set(FIELD.findall((ROOT / "docs" / "platforms.md").read_text("utf-8")))
    accepted = {
        *PROFILE_FIELDS,
        *TOMBSTONE_FIELDS,
        *(f.name for f in dataclasses.fields(HttpPlatformConfig)),
        *(f.name for f in dataclasses.fields(MatrixConfig)),
        *(f.name for f in dataclasses.fields(EmailPlatformConfig)),
    }
    assert sorted(accepted - documented) == []


EMAIL_DEPLOYMENT = {
    "smtp_port": 2525,
    "imap_port": 1143,
    "imap_user": "inbox",
    "imap_password": "pw",
    "recipient": "inbox@example.org",
}


def test_the_email_profile_builds_the_email_config_once_the_deployment_is_given():
    bare = load_profile("email")
    assert (bare.transport, bare.outcomes, bare.config, bare.tombstone) == ("email", "email_outcomes.toml", None, None)
    assert bare.read_lag_seconds > 0 and bare.runtime_config().first_look_after == bare.read_lag_seconds
    filled = load_profile("email", **EMAIL_DEPLOYMENT)
    assert isinstance(filled.config, EmailPlatformConfig)
    assert filled.config == bare.email_config(**EMAIL_DEPLOYMENT)
    assert filled.config.message_id_domain == bare.fields["message_id_domain"]
    assert not filled.config.capabilities.fenced_lookup
    with filled.email_transport() as t:
        assert t.config == filled.config
    with pytest.raises(ProfileError) as e:
        bare.email_config(smtp_port=25)
    assert (e.value.code, e.value.where, Path(e.value.path or "").name) == (
        Code.MISSING,
        "email.imap_port",
        "email.toml",
    )


@pytest.mark.parametrize(
    "change, code, where",
    [
        ({"smtp_port": "25"}, Code.WRONG_TYPE, "email.smtp_port"),
        ({"smtp_post": 25}, Code.UNKNOWN_FIELD, "email.smtp_post"),
        ({"recipient": "nobody"}, Code.INVALID_VALUE, "email"),  # the config's own check: the message names it
    ],
)
def test_a_bad_email_field_is_refused_naming_the_file_and_the_field(change, code, where):
    with pytest.raises(ProfileError) as e:
        load_profile("email", **(EMAIL_DEPLOYMENT | change))
    assert (e.value.code, e.value.where, Path(e.value.path or "").name) == (code, where, "email.toml")


def test_an_email_profile_with_a_tombstone_or_another_table_is_refused(tmp_path):
    raw = tomllib.loads((profiles_dir() / "email.toml").read_text("utf-8"))
    with pytest.raises(ProfileError) as e:
        parse_profile(raw | {"tombstone": {"kept": "forever"}}, where="e.toml")
    assert e.value.as_dict() == {"code": Code.NOT_FENCED, "where": "tombstone", "path": "e.toml"}
    with pytest.raises(ProfileError) as e:
        parse_profile(raw | {"outcomes": "http_outcomes.toml"}, where="e.toml")
    assert e.value.as_dict() == {"code": Code.INVALID_VALUE, "where": "outcomes", "path": "e.toml"}


def test_a_profile_asked_for_another_transport_is_refused():
    http, matrix = load_profile("json-server"), load_profile("matrix")
    for call in (matrix.http_transport, http.matrix_config, http.email_config):
        with pytest.raises(ProfileError) as e:
            call()
        assert (e.value.code, e.value.where) == (Code.WRONG_TRANSPORT, "transport"), call
