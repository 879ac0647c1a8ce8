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

from atmostonce.runtime import RuntimeConfig
from atmostonce.table import table
from atmostonce_cli.main import EXIT_OK, EXIT_USAGE, main
from atmostonce_email.transport import EmailPlatformConfig
from atmostonce_http import HttpPlatformConfig, PlatformSink, sink_config
from atmostonce_http.profile import (
    PROFILE_FIELDS,
    TOMBSTONE_FIELDS,
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
    lines = [f"{k} = {_toml_value(v)}" for k, v in raw.items() if k not in ("http", "matrix")]
    for section in ("http", "matrix"):
        if section in raw:
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
    with pytest.raises(ProfileError, match=r"\[http\] platform config read_timeout must be a number"):
        load_profile("json-server", read_timeout="5")


REFUSED = {
    "unknown top-level field": (_profile(retries=3), r"unknown profile fields \['retries'\]"),
    "unknown http field": (
        _profile(http={"base_url": "http://x:1", "bogus": 1}),
        r"unknown platform config keys: \['bogus'\]",
    ),
    "wrong type in http": (
        _profile(http={"base_url": "http://x:1", "lookup_fenced": "yes"}),
        r"lookup_fenced must be true or false",
    ),
    "missing base_url": (_profile(http={"create_path": "/p"}), r"needs base_url"),
    "unknown transport": (_profile(transport="smtp"), r"transport must be one of"),
    "unknown outcomes table": (_profile(outcomes="other.toml"), r"outcomes must name a http classification table"),
    "matrix outcomes for http": (_profile(outcomes="matrix_outcomes.toml"), r"outcomes must name a http"),
    "wrong format": (_profile(format=2), r"format must be 1"),
    "no name": ({k: v for k, v in _profile().items() if k != "name"}, r"name must be a non-empty string"),
    "negative read lag": (_profile(read_lag_seconds=-1), r"read_lag_seconds must be a number of seconds, 0 or more"),
    "read lag as text": (_profile(read_lag_seconds="1"), r"read_lag_seconds must be"),
    "fenced without tombstone": (
        _profile(http={"base_url": "http://x:1", "lookup_path": "/p?k={key}", "lookup_fenced": True}),
        r"lookup_fenced = true needs a \[tombstone\]",
    ),
    "tombstone without fence": (_profile(tombstone={"kept": "forever"}), r"\[tombstone\] is only for a fenced lookup"),
    "retention without age bound": (
        _profile(tombstone={"kept": "retention", "retention_seconds": 60}),
        r"needs retention_seconds and age_bound",
    ),
    "tombstone kept sometimes": (_profile(tombstone={"kept": "sometimes"}), r"tombstone.kept must be"),
    "unknown tombstone field": (
        _profile(tombstone={"kept": "forever", "ttl": 5}),
        r"unknown tombstone fields \['ttl'\]",
    ),
    "no transport table": ({k: v for k, v in _profile().items() if k != "http"}, r"needs a \[http\] table"),
    "matrix unknown field": (
        {
            **{k: v for k, v in _profile(transport="matrix", outcomes="matrix_outcomes.toml").items() if k != "http"},
            "matrix": {"txn_prefix": "x"},
        },
        r"\[matrix\] unknown fields \['txn_prefix'\]",
    ),  # fmt: skip
    "matrix wrong type": (
        {
            **{k: v for k, v in _profile(transport="matrix", outcomes="matrix_outcomes.toml").items() if k != "http"},
            "matrix": {"lookup_max_events": "many"},
        },
        r"lookup_max_events must be an integer",
    ),  # fmt: skip
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_profile_with_a_bad_field_is_refused_naming_the_file_and_the_field(tmp_path, case):
    raw, message = REFUSED[case]
    path = _write_toml(tmp_path / "bad.toml", raw)
    with pytest.raises(ProfileError, match=message) as info:
        load_platform_file(path)
    assert str(info.value).startswith(path)


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
    with pytest.raises(ProfileError, match="needs homeserver_url, room_id, user, password, state_path"):
        p.matrix_config()
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
    terminal = table().states_of_kind("terminal")
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
    with pytest.raises(ProfileError, match=r"email\.toml: \[email\] needs imap_port"):
        bare.email_config(smtp_port=25)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"smtp_port": "25"}, r"\[email\] platform config smtp_port must be an integer"),
        ({"smtp_post": 25}, r"\[email\] unknown fields \['smtp_post'\]"),
        ({"recipient": "nobody"}, r"\[email\] recipient must be a plain address"),
    ],
)
def test_a_bad_email_field_is_refused_naming_the_file_and_the_field(change, message):
    with pytest.raises(ProfileError, match=r"email\.toml: " + message):
        load_profile("email", **(EMAIL_DEPLOYMENT | change))


def test_an_email_profile_with_a_tombstone_or_another_table_is_refused(tmp_path):
    raw = tomllib.loads((profiles_dir() / "email.toml").read_text("utf-8"))
    with pytest.raises(ProfileError, match="never fenced"):
        parse_profile(raw | {"tombstone": {"kept": "forever"}}, where="e.toml")
    with pytest.raises(ProfileError, match="email_outcomes.toml"):
        parse_profile(raw | {"outcomes": "http_outcomes.toml"}, where="e.toml")
