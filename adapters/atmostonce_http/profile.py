"""Platform profiles as data: one TOML file per platform in ``spec/platforms/`` (docs/platforms.md).

A profile describes a platform the way ``spec/http_outcomes.toml`` describes a classification: as data
that the transport, the docs and the tests read. Its top level says what kind of platform it is::

    format = 1
    name = "json-server"
    description = "..."
    transport = "http"              # or "matrix", "email"
    outcomes = "http_outcomes.toml" # the classification table, a file in spec/
    read_lag_seconds = 0.0          # a create may stay invisible to read-back and lookup this long

    [tombstone]                     # only, and then required, for a fenced lookup
    kept = "forever"                # or "retention" with retention_seconds and age_bound

    [http]                          # the transport's own fields, exactly HttpPlatformConfig's
    base_url = "http://127.0.0.1:3000"
    ...

The ``[http]`` table goes through :meth:`HttpPlatformConfig.from_mapping` unchanged (after any
``overrides`` given to :func:`load_profile`), so a profile and a hand-written JSON config build the very
same :class:`HttpPlatformConfig`. A ``[matrix]`` table holds :class:`atmostonce_matrix.MatrixConfig`
fields; its deployment fields (homeserver, room, user, password, state file) may be left out of the file
and given to :meth:`PlatformProfile.matrix_config`.

Every refusal is a :class:`ProfileError` (a ``ValueError``) whose message names the file and the field, and
whose ``code`` (a :class:`ProfileCode`), ``where`` (the field, e.g. ``"http.read_timeout"``) and ``path`` (the
file) say the same to a script.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
import math
import tomllib
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from .transport import HttpPlatformConfig, _check_plain_type

__all__ = [
    "PROFILE_FIELDS",
    "TOMBSTONE_FIELDS",
    "TRANSPORTS",
    "PlatformProfile",
    "ProfileCode",
    "ProfileError",
    "Tombstone",
    "load_platform_file",
    "load_profile",
    "parse_profile",
    "profile_path",
    "profiles_dir",
    "shipped_profiles",
]

FORMAT = 1
TRANSPORTS = ("http", "matrix", "email")
"""Transport kinds a profile can describe; the table of that name holds the transport's own fields."""

PROFILE_FIELDS = ("format", "name", "description", "transport", "outcomes", "read_lag_seconds", "tombstone")
"""The top-level fields of a profile, besides the transport table."""

TOMBSTONE_FIELDS = ("kept", "retention_seconds", "age_bound")
"""The fields of ``[tombstone]``."""

_OUTCOME_TABLES = {
    "http": ("http_outcomes.toml",),
    "matrix": ("matrix_outcomes.toml",),
    "email": ("email_outcomes.toml",),
}
MATRIX_DEPLOYMENT_FIELDS = ("homeserver_url", "room_id", "user", "password", "state_path")
"""MatrixConfig fields that belong to one deployment, not to the platform: a profile may leave them out."""
EMAIL_DEPLOYMENT_FIELDS = (
    "smtp_host",
    "smtp_port",
    "imap_host",
    "imap_port",
    "imap_user",
    "imap_password",
    "imap_mailbox",
    "sender",
    "recipient",
)
"""EmailPlatformConfig fields that belong to one deployment (the servers, the login, the addresses): a
profile may leave them out and have them given as overrides or to :meth:`PlatformProfile.email_config`."""


class ProfileCode(enum.StrEnum):
    """Why a platform profile was refused: :attr:`ProfileError.code`."""

    NOT_FOUND = "not_found"
    """no file at the path, or no shipped profile of that name"""
    UNREADABLE = "unreadable"
    """the file is there and cannot be read (permissions, a directory, ...)"""
    NOT_TEXT = "not_text"
    """the file is not UTF-8 text"""
    SYNTAX = "syntax"
    """the file is not valid TOML (not valid JSON, for a ``.json`` file)"""
    FORMAT = "format"
    """``format`` is not a format this loader reads (``1``)"""
    UNKNOWN_FIELD = "unknown_field"
    """a field the profile, its ``[tombstone]`` or its transport table does not have (a ``retention_seconds``
    or an ``age_bound`` in a tombstone kept for ever)"""
    MISSING = "missing"
    """a field or a table that is required is absent (or null in JSON): ``transport``, ``name``,
    ``outcomes``, the transport table, a field the transport's config needs (``http.base_url``), a
    tombstone's ``kept`` or a retention tombstone's ``retention_seconds`` or ``age_bound``, the
    ``[tombstone]`` of a fenced lookup"""
    WRONG_TYPE = "wrong_type"
    """a value of the wrong type: a string where a number belongs, a ``[tombstone]`` that is not a table, a
    file that is not a table of fields (``where`` is then ``None``)"""
    INVALID_VALUE = "invalid_value"
    """a value of the right type that the field does not allow: an unknown transport, an outcomes table of
    another transport, a negative number, an empty name, a tombstone kept neither for ever nor for a
    retention, a transport config value its own checks refuse (``where`` is then the transport table, or
    ``None`` for a JSON file of ``HttpPlatformConfig`` fields; the message names the field)"""
    NOT_FENCED = "not_fenced"
    """a ``[tombstone]`` for a lookup that is not fenced (HTTP without ``lookup_fenced = true``) or never is
    (Matrix, email)"""
    WRONG_TRANSPORT = "wrong_transport"
    """a profile asked for the config or the transport of another transport kind (``where`` is
    ``"transport"``)"""


class ProfileError(ValueError):
    """A profile file is missing, not TOML/JSON, or has an unknown field, a wrong type or an invalid value.

    Attributes: ``code`` (a :class:`ProfileCode`), ``where`` (the field at fault as its path in the profile,
    e.g. ``"read_lag_seconds"``, ``"tombstone.kept"``, ``"http.base_url"``, ``"matrix"`` for the transport
    table itself; ``None`` when the whole file is at fault) and ``path`` (the file, as the ``where`` given to
    :func:`parse_profile`, which is ``"platform profile"`` unless one is given; ``None`` when no shipped
    profile has the name asked for). The message starts with the file and names the field: what the CLI
    prints (``--platform-config``, the worker's config check)."""

    def __init__(self, message: str, *, code: ProfileCode, where: str | None = None, path: str | None = None):
        self.code, self.where, self.path = code, where, path
        super().__init__(message)

    def as_dict(self) -> dict[str, Any]:
        return {"code": self.code, "where": self.where, "path": self.path}


Code = ProfileCode


@dataclass(frozen=True)
class Tombstone:
    """What a fenced lookup leaves behind (``Capabilities.fenced_lookup``; docs/design.md, "A fence is a
    tombstone"): after answering "not found" for a key, the platform refuses every later create carrying it,
    ``kept = "forever"``, or for ``retention_seconds`` together with its own refusal of any create with
    that key older than the retention (``age_bound`` says how it enforces that)."""

    kept: str
    retention_seconds: float | None = None
    age_bound: str | None = None


@dataclass(frozen=True)
class PlatformProfile:
    """One loaded profile. ``fields`` is the transport table as given (with any overrides); ``config`` the
    :class:`HttpPlatformConfig` built from it (``None`` for a Matrix profile: see :meth:`matrix_config`), or
    for an email profile the :class:`atmostonce_email.EmailPlatformConfig` once every required field is given
    (``None`` until then: see :meth:`email_config`)."""

    name: str
    transport: str
    outcomes: str
    fields: Mapping[str, Any]
    description: str = ""
    read_lag_seconds: float = 0.0
    tombstone: Tombstone | None = None
    config: Any = None
    source: str = ""

    @property
    def outcomes_path(self) -> Path:
        from atmostonce.table import spec_dir

        return spec_dir() / self.outcomes

    def http_transport(self):
        """An :class:`atmostonce_http.HttpTransport` for this profile, classifying by its ``outcomes`` table."""
        from .classify import load_outcome_table
        from .transport import HttpTransport

        if self.transport != "http" or self.config is None:
            raise ProfileError(
                f"{self.source}: a {self.transport} profile has no HTTP transport",
                code=Code.WRONG_TRANSPORT,
                where="transport",
                path=self.source,
            )
        return HttpTransport(self.config, table=load_outcome_table(self.outcomes_path))

    def matrix_config(self, **deployment: Any):
        """The :class:`atmostonce_matrix.MatrixConfig` of a Matrix profile, ``deployment`` filling (or
        replacing) its fields. Raises :class:`ProfileError` naming a missing or invalid field."""
        if self.transport != "matrix":
            raise ProfileError(
                f"{self.source}: not a matrix profile", code=Code.WRONG_TRANSPORT, where="transport", path=self.source
            )
        from atmostonce_matrix.transport import MatrixConfig

        data = {**self.fields, **deployment}
        missing = [f.name for f in dataclasses.fields(MatrixConfig) if _required(f) and f.name not in data]
        if missing:
            raise ProfileError(
                f"{self.source}: [matrix] needs {', '.join(missing)}",
                code=Code.MISSING,
                where=f"matrix.{missing[0]}",
                path=self.source,
            )
        try:
            return MatrixConfig.from_mapping(data)
        except ValueError as exc:
            raise ProfileError(
                f"{self.source}: [matrix] {exc}", code=Code.INVALID_VALUE, where="matrix", path=self.source
            ) from exc

    def email_config(self, **deployment: Any):
        """The :class:`atmostonce_email.EmailPlatformConfig` of an email profile, ``deployment`` filling (or
        replacing) its fields. Raises :class:`ProfileError` naming a missing or invalid field."""
        if self.transport != "email":
            raise ProfileError(
                f"{self.source}: not an email profile", code=Code.WRONG_TRANSPORT, where="transport", path=self.source
            )
        return _email_config(self.source, {**self.fields, **deployment}, complete=True)

    def email_transport(self, **deployment: Any):
        """An :class:`atmostonce_email.EmailTransport` for this profile, classifying by its ``outcomes`` table."""
        from atmostonce_email.classify import load_email_outcomes
        from atmostonce_email.transport import EmailTransport

        return EmailTransport(self.email_config(**deployment), table=load_email_outcomes(self.outcomes_path))

    def runtime_config(self, **fields: Any):
        """A :class:`atmostonce.runtime.RuntimeConfig` that respects the read lag: the first look at an
        unknown send waits ``read_lag_seconds``, and lookups of one intent are spaced at least as much."""
        from atmostonce.runtime import RuntimeConfig

        lag = self.read_lag_seconds
        defaults = {
            "first_look_after": lag,
            "reconcile_interval": max(RuntimeConfig.reconcile_interval, lag),
        }
        return RuntimeConfig(**{**defaults, **fields})


def _required(f: dataclasses.Field) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


def profiles_dir() -> Path:
    """``platforms/`` beside ``table.toml``: in the wheel's ``atmostonce/_spec`` or the repo's ``spec/``."""
    from atmostonce.table import spec_dir

    return spec_dir() / "platforms"


def shipped_profiles() -> dict[str, Path]:
    """Every shipped profile, by its ``name``."""
    out: dict[str, Path] = {}
    for path in sorted(profiles_dir().glob("*.toml")):
        out[_read(str(path))["name"]] = path
    return out


def profile_path(name: str) -> Path:
    """The shipped profile called ``name`` (``json-server`` or ``json_server``). Raises :class:`ProfileError`."""
    path = profiles_dir() / f"{name.replace('-', '_')}.toml"
    if not path.is_file():
        known = ", ".join(sorted(shipped_profiles()))
        raise ProfileError(f"no shipped platform profile {name!r}; shipped: {known}", code=Code.NOT_FOUND)
    return path


@functools.cache
def _read(path: str) -> Mapping[str, Any]:
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise _unreadable(path, exc) from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProfileError(f"{path}: not UTF-8 text", code=Code.NOT_TEXT, path=path) from exc
    try:
        if path.endswith(".json"):
            data = json.loads(text)
        else:
            data = tomllib.loads(text)
    except ValueError as exc:  # json.JSONDecodeError and tomllib.TOMLDecodeError are both ValueErrors
        raise ProfileError(f"{path}: {exc}", code=Code.SYNTAX, path=path) from exc
    return data


def _unreadable(path: str, exc: OSError) -> ProfileError:
    code = Code.NOT_FOUND if isinstance(exc, FileNotFoundError) else Code.UNREADABLE
    return ProfileError(f"{path}: {exc.strerror or exc}", code=code, path=path)


def load_profile(source: str | Path, **overrides: Any) -> PlatformProfile:
    """Load a profile: a path to a TOML (or JSON) file, or the name of a shipped one (``"json-server"``).
    ``overrides`` replace fields of the transport table before it is checked (e.g. ``base_url=`` for a
    server on a port chosen at run time). Raises :class:`ProfileError`."""
    path = Path(source) if isinstance(source, Path) or source.endswith((".toml", ".json")) else profile_path(source)
    return parse_profile(_read(str(path)), where=str(path), overrides=overrides)


def load_platform_file(path: str | Path) -> PlatformProfile:
    """What ``--platform-config FILE`` reads: a profile (TOML, or JSON with a ``transport`` field), or a
    JSON object of :class:`HttpPlatformConfig` fields (the format before profiles), read as an HTTP profile
    classified by ``http_outcomes.toml``; that format has no ``[tombstone]``, so a fenced lookup in it is refused
    (``MISSING`` at ``tombstone``), as in a profile without one. Raises :class:`ProfileError`."""
    where = str(path)
    if where.endswith(".toml"):
        return parse_profile(_read_fresh(where), where=where)
    data = _read_fresh(where, force_json=True)
    if isinstance(data, Mapping) and "transport" in data:
        return parse_profile(data, where=where)
    try:
        config = HttpPlatformConfig.from_mapping(data)
    except ValueError as exc:
        code, field = _config_fault(HttpPlatformConfig, data, None)
        raise ProfileError(f"{where}: {exc}", code=code, where=field, path=where) from exc
    if config.capabilities.fenced_lookup:  # this format has no [tombstone]: the contract could not be stated
        raise ProfileError(
            f"{where}: lookup_fenced = true needs a [tombstone] declaration, which a file of HttpPlatformConfig "
            "fields cannot carry: write a profile (TOML, or JSON with a transport field) with a [tombstone] table "
            "(docs/design.md, 'A fence is a tombstone')",
            code=Code.MISSING,
            where="tombstone",
            path=where,
        )
    return PlatformProfile(
        name=Path(where).stem,
        transport="http",
        outcomes="http_outcomes.toml",
        fields=MappingProxyType(dict(data)),
        config=config,
        source=where,
    )


def _read_fresh(path: str, *, force_json: bool = False) -> Any:
    """Read without the cache (an operator's file may change between two commands of one process)."""
    _read.cache_clear()
    if force_json and not path.endswith(".json"):
        try:
            with open(path, encoding="utf-8") as f:
                return json.load(f)
        except OSError as exc:
            raise _unreadable(path, exc) from exc
        except UnicodeDecodeError as exc:
            raise ProfileError(f"{path}: {exc}", code=Code.NOT_TEXT, path=path) from exc
        except ValueError as exc:
            raise ProfileError(f"{path}: {exc}", code=Code.SYNTAX, path=path) from exc
    return _read(path)


def _number(source: str, name: str, value: Any, *, zero: bool) -> float:
    """``value`` as seconds; ``name`` is the field's path in the profile (``where`` of the error)."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not number or not math.isfinite(value) or value < 0 or (value == 0 and not zero):
        want = "a number of seconds, 0 or more" if zero else "a positive number of seconds"
        raise ProfileError(
            f"{source}: {name} must be {want}, got {json.dumps(value, default=repr)}",
            code=Code.INVALID_VALUE if number else Code.WRONG_TYPE,
            where=name,
            path=source,
        )
    return float(value)


def _string(source: str, name: str, value: Any) -> str:
    """``value`` as a non-empty string; ``None`` (the field is absent) is ``missing``."""
    if not isinstance(value, str) or not value.strip():
        code = Code.MISSING if value is None else Code.INVALID_VALUE if isinstance(value, str) else Code.WRONG_TYPE
        raise ProfileError(
            f"{source}: {name} must be a non-empty string, got {json.dumps(value, default=repr)}",
            code=code,
            where=name,
            path=source,
        )
    return value


def _tombstone(source: str, raw: Any) -> Tombstone:
    if not isinstance(raw, Mapping):
        raise ProfileError(
            f"{source}: tombstone must be a table, got {json.dumps(raw, default=repr)}",
            code=Code.WRONG_TYPE,
            where="tombstone",
            path=source,
        )
    unknown = sorted(set(raw) - set(TOMBSTONE_FIELDS))
    if unknown:
        raise ProfileError(
            f"{source}: unknown tombstone fields {unknown}; known: {list(TOMBSTONE_FIELDS)}",
            code=Code.UNKNOWN_FIELD,
            where=f"tombstone.{unknown[0]}",
            path=source,
        )
    kept = raw.get("kept")
    if kept == "forever":
        extra = sorted({"retention_seconds", "age_bound"} & set(raw))
        if extra:
            raise ProfileError(
                f"{source}: tombstone.kept = 'forever' takes no {extra}",
                code=Code.UNKNOWN_FIELD,
                where=f"tombstone.{extra[0]}",
                path=source,
            )
        return Tombstone("forever")
    if kept == "retention":
        missing = [name for name in ("retention_seconds", "age_bound") if name not in raw]
        if missing:
            raise ProfileError(
                f"{source}: tombstone.kept = 'retention' needs retention_seconds and age_bound (how the platform "
                "refuses a create carrying the key that is older than the retention)",
                code=Code.MISSING,
                where=f"tombstone.{missing[0]}",
                path=source,
            )
        seconds = _number(source, "tombstone.retention_seconds", raw["retention_seconds"], zero=False)
        return Tombstone("retention", seconds, _string(source, "tombstone.age_bound", raw["age_bound"]))
    raise ProfileError(
        f"{source}: tombstone.kept must be 'forever' or 'retention', got {json.dumps(kept)}",
        code=Code.MISSING if kept is None else Code.INVALID_VALUE,
        where="tombstone.kept",
        path=source,
    )


def parse_profile(
    raw: Any, *, where: str = "platform profile", overrides: Mapping[str, Any] | None = None
) -> PlatformProfile:
    """Check parsed TOML/JSON and build a :class:`PlatformProfile`; ``where`` names the file in the messages
    and is the errors' ``path``. Raises :class:`ProfileError`."""
    source = where
    if not isinstance(raw, Mapping):
        raise ProfileError(
            f"{source}: a profile is a table of fields, got {type(raw).__name__}", code=Code.WRONG_TYPE, path=source
        )
    transport = raw.get("transport")
    if transport not in TRANSPORTS:
        raise ProfileError(
            f"{source}: transport must be one of {list(TRANSPORTS)}, got {json.dumps(transport)}",
            code=Code.MISSING if transport is None else Code.INVALID_VALUE,
            where="transport",
            path=source,
        )
    unknown = sorted(set(raw) - set(PROFILE_FIELDS) - {transport})
    if unknown:
        raise ProfileError(
            f"{source}: unknown profile fields {unknown}; known: {[*PROFILE_FIELDS, transport]}",
            code=Code.UNKNOWN_FIELD,
            where=unknown[0],
            path=source,
        )
    if raw.get("format") != FORMAT:
        raise ProfileError(
            f"{source}: format must be {FORMAT}, got {json.dumps(raw.get('format'))}",
            code=Code.FORMAT,
            where="format",
            path=source,
        )
    name = _string(source, "name", raw.get("name"))
    description = raw.get("description", "")
    if not isinstance(description, str):
        raise ProfileError(
            f"{source}: description must be a string", code=Code.WRONG_TYPE, where="description", path=source
        )
    outcomes = raw.get("outcomes")
    if outcomes not in _OUTCOME_TABLES[transport]:
        raise ProfileError(
            f"{source}: outcomes must name a {transport} classification table in spec/ "
            f"({', '.join(_OUTCOME_TABLES[transport])}), got {json.dumps(outcomes)}",
            code=Code.MISSING if outcomes is None else Code.INVALID_VALUE,
            where="outcomes",
            path=source,
        )
    lag = _number(source, "read_lag_seconds", raw.get("read_lag_seconds", 0.0), zero=True)
    tombstone = _tombstone(source, raw["tombstone"]) if "tombstone" in raw else None
    table = raw.get(transport)
    if not isinstance(table, Mapping):
        raise ProfileError(
            f"{source}: needs a [{transport}] table of the transport's fields",
            code=Code.MISSING if table is None else Code.WRONG_TYPE,
            where=transport,
            path=source,
        )
    fields = {**table, **(overrides or {})}
    profile = dict(
        name=name,
        transport=transport,
        outcomes=outcomes,
        fields=MappingProxyType(fields),
        description=description,
        read_lag_seconds=lag,
        tombstone=tombstone,
        source=source,
    )
    if transport == "http":
        try:
            config = HttpPlatformConfig.from_mapping(fields)
        except ValueError as exc:
            code, field = _config_fault(HttpPlatformConfig, fields, "http")
            raise ProfileError(f"{source}: [http] {exc}", code=code, where=field, path=source) from exc
        if config.capabilities.fenced_lookup and tombstone is None:
            raise ProfileError(
                f"{source}: [http] lookup_fenced = true needs a [tombstone] table: a lookup proves absence only "
                "if the platform then refuses every later create with that key (docs/design.md, "
                "'A fence is a tombstone')",
                code=Code.MISSING,
                where="tombstone",
                path=source,
            )
        if tombstone is not None and not config.capabilities.fenced_lookup:
            raise ProfileError(
                f"{source}: [tombstone] is only for a fenced lookup ([http] lookup_fenced = true)",
                code=Code.NOT_FENCED,
                where="tombstone",
                path=source,
            )
        return PlatformProfile(**profile, config=config)
    if transport == "email":
        if tombstone is not None:
            raise ProfileError(
                f"{source}: [tombstone]: an email lookup is never fenced (docs/platforms.md)",
                code=Code.NOT_FENCED,
                where="tombstone",
                path=source,
            )
        return PlatformProfile(**profile, config=_email_config(source, fields, complete=False))
    return PlatformProfile(**_matrix_checked(source, fields, tombstone, profile))


def _config_fault(cls: type, data: Any, section: str | None) -> tuple[ProfileCode, str | None]:
    """What ``cls.from_mapping(data)`` refused, as ``(code, where)``: its checks before it builds the config, in
    its order (unknown fields, a required field absent, a value of the wrong plain type); else a value the
    config itself refused (``invalid_value``, at the transport table ``section``, ``None`` for a JSON file of
    config fields)."""
    prefix = f"{section}." if section else ""
    if not isinstance(data, Mapping):
        return Code.WRONG_TYPE, section
    unknown = sorted(set(data) - {f.name for f in dataclasses.fields(cls)})
    if unknown:
        return Code.UNKNOWN_FIELD, prefix + str(unknown[0])
    missing = [f.name for f in dataclasses.fields(cls) if _required(f) and f.name not in data]
    if missing:
        return Code.MISSING, prefix + missing[0]
    hints = typing.get_type_hints(cls)
    for key, value in data.items():
        try:
            _check_plain_type(key, hints[key], value)
        except ValueError:
            return Code.WRONG_TYPE, prefix + key
    return Code.INVALID_VALUE, section


def _email_config(source: str, fields: Mapping[str, Any], *, complete: bool):
    """Check ``[email]`` fields (names and plain types); build the config when every required field is there
    (``complete``: they must be). Raises :class:`ProfileError` naming the file and the field."""
    from atmostonce_email.transport import EmailPlatformConfig

    names = {f.name for f in dataclasses.fields(EmailPlatformConfig)}
    unknown = sorted(set(fields) - names)
    if unknown:
        raise ProfileError(
            f"{source}: [email] unknown fields {unknown}",
            code=Code.UNKNOWN_FIELD,
            where=f"email.{unknown[0]}",
            path=source,
        )
    hints = typing.get_type_hints(EmailPlatformConfig)
    for key, value in fields.items():
        try:
            _check_plain_type(key, hints[key], value)
        except ValueError as exc:
            raise ProfileError(
                f"{source}: [email] {exc}", code=Code.WRONG_TYPE, where=f"email.{key}", path=source
            ) from exc
    missing = [f.name for f in dataclasses.fields(EmailPlatformConfig) if _required(f) and f.name not in fields]
    if missing:
        if complete:
            raise ProfileError(
                f"{source}: [email] needs {', '.join(missing)}",
                code=Code.MISSING,
                where=f"email.{missing[0]}",
                path=source,
            )
        return None
    try:
        return EmailPlatformConfig.from_mapping(fields)
    except ValueError as exc:
        raise ProfileError(f"{source}: [email] {exc}", code=Code.INVALID_VALUE, where="email", path=source) from exc


def _matrix_checked(source: str, fields: Mapping[str, Any], tombstone: Tombstone | None, profile: dict) -> dict:
    from atmostonce_matrix.transport import MatrixConfig

    if tombstone is not None:
        raise ProfileError(
            f"{source}: [tombstone]: a Matrix history lookup is never fenced (docs/matrix.md)",
            code=Code.NOT_FENCED,
            where="tombstone",
            path=source,
        )
    names = {f.name for f in dataclasses.fields(MatrixConfig)}
    unknown = sorted(set(fields) - names)
    if unknown:
        raise ProfileError(
            f"{source}: [matrix] unknown fields {unknown}",
            code=Code.UNKNOWN_FIELD,
            where=f"matrix.{unknown[0]}",
            path=source,
        )
    hints = typing.get_type_hints(MatrixConfig)
    for key, value in fields.items():
        try:
            _check_plain_type(key, hints[key], value)
        except ValueError as exc:
            raise ProfileError(
                f"{source}: [matrix] {exc}", code=Code.WRONG_TYPE, where=f"matrix.{key}", path=source
            ) from exc
    return profile
