"""Load and validate the language-neutral case files (``spec/conformance/**/*.json``).

A case file holds ``{"format": 1, "cases": [...]}`` and validates against
``spec/conformance/case.schema.json`` (JSON Schema 2020-12). This module also
implements the two small languages cases use:

* **references**: a string ``"$name"`` or ``"$name.field.0.other"`` stands for a value bound
  earlier in the case (``bind`` on a step, or a setup intent's name); ``"$$x"`` is the literal
  ``"$x"``; ``{"$merge": [a, b, ...]}`` is the objects a, b, ... merged left to right (to
  forge a lease from a real one, say);
* **matchers** in expectations: a one-key object ``{"==": v}``, ``{"!=": v}``, ``{">": v}``,
  ``{">=": v}``, ``{"<": v}``, ``{"<=": v}``, ``{"len": n}``, ``{"prefix": list}``,
  ``{"contains": v}``, ``{"not_contains": v}`` or ``{"distinct_by": "field"}``; any other
  object matches the listed keys only (extra keys are allowed), a list matches item by item,
  anything else by equality.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..table import spec_dir

__all__ = [
    "BUNDLE_FILE",
    "MATCHERS",
    "Bundle",
    "bundle",
    "bundle_digest",
    "NON_CASE_FILES",
    "Case",
    "CaseError",
    "cases_dir",
    "load_cases",
    "vector_cases",
    "load_schema",
    "match",
    "resolve",
    "validate_document",
]

VECTOR_FILE = "identity_vectors.json"
BUNDLE_FILE = "bundle.json"
NON_CASE_FILES = frozenset({"case.schema.json", "verification_items.json", VECTOR_FILE, BUNDLE_FILE})
VECTOR_RULES = {
    "delivery": "docs/design.md#identities: test vectors (delivery key, request digest, text key)",
    "source": "docs/design.md#identities: test vectors (source version)",
}
MATCHERS = ("==", "!=", ">", ">=", "<", "<=", "len", "prefix", "contains", "not_contains", "distinct_by")


class CaseError(ValueError):
    """A case file is unreadable or invalid, or a case refers to something never bound."""


@dataclass(frozen=True)
class Case:
    """One case. ``requires``: features beyond ``store`` (the file's and the case's own)."""

    id: str
    description: str
    rule: str
    steps: tuple[Mapping[str, Any], ...]
    setup: Mapping[str, Any] = field(default_factory=dict)
    requires: tuple[str, ...] = ()
    source: str = ""

    @property
    def label(self) -> str:
        return f"{self.description} [{self.id}]"


def cases_dir() -> Path:
    """``conformance/`` beside the shipped table (the wheel's copy, else the repo's ``spec/``)."""
    return spec_dir() / "conformance"


def load_schema(folder: Path | None = None) -> dict[str, Any]:
    path = (folder or cases_dir()) / "case.schema.json"
    try:
        schema: dict[str, Any] = json.loads(path.read_text("utf-8"))
        return schema
    except (OSError, json.JSONDecodeError) as exc:
        raise CaseError(f"cannot read the case schema {path}: {exc}") from exc


def validate_document(doc: Any, schema: Mapping[str, Any] | None = None) -> list[str]:
    """Schema violations of one parsed case file, as ``path: message`` strings (empty when valid)."""
    import jsonschema

    validator = jsonschema.Draft202012Validator(schema or load_schema())
    return [
        f"{'/'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}"
        for e in sorted(validator.iter_errors(doc), key=lambda e: list(map(str, e.absolute_path)))
    ]


def case_files(folder: Path | None = None) -> list[Path]:
    root = folder or cases_dir()
    return sorted(p for p in root.rglob("*.json") if p.name not in NON_CASE_FILES)


def load_cases(folder: Path | str | None = None, *, validate: bool = True) -> list[Case]:
    """Every case under ``folder`` (default :func:`cases_dir`), in file then listed order.

    Raises :class:`CaseError` for an unreadable or invalid file, or a case id used twice.
    """
    root = Path(folder) if folder is not None else cases_dir()
    schema = load_schema(root) if validate else None
    out: list[Case] = []
    seen: dict[str, str] = {}
    files = case_files(root)
    if not files:
        raise CaseError(f"no case files under {root}")
    for path in files:
        rel = path.relative_to(root).as_posix()
        try:
            doc = json.loads(path.read_text("utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise CaseError(f"{rel}: {exc}") from exc
        if schema is not None:
            problems = validate_document(doc, schema)
            if problems:
                raise CaseError(f"{rel} does not match case.schema.json: " + "; ".join(problems[:5]))
        file_requires = tuple(doc.get("requires", ()))
        for raw in doc["cases"]:
            if raw["id"] in seen:
                raise CaseError(f"case id {raw['id']!r} appears in {seen[raw['id']]} and {rel}")
            seen[raw["id"]] = rel
            requires = tuple(dict.fromkeys(file_requires + tuple(raw.get("requires", ()))))
            out.append(
                Case(
                    id=raw["id"],
                    description=raw["description"],
                    rule=raw["rule"],
                    steps=tuple(raw["steps"]),
                    setup=raw.get("setup", {}),
                    requires=requires,
                    source=rel,
                )
            )
    vectors = root / VECTOR_FILE
    if vectors.exists():
        for case in vector_cases(vectors):
            if case.id in seen:
                raise CaseError(f"case id {case.id!r} appears in {seen[case.id]} and {VECTOR_FILE}")
            seen[case.id] = VECTOR_FILE
            out.append(case)
    return out


def vector_cases(path: Path) -> list[Case]:
    """One case per identity test vector (``identity_vectors.json``): a delivery vector is submitted
    and its intent must carry the vector's ``key``, ``request_digest`` and ``text_hash``; a source
    vector is captured and must give its ``version``. Every vector runs on a fresh implementation."""
    try:
        doc = json.loads(path.read_text("utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise CaseError(f"{VECTOR_FILE}: {exc}") from exc
    if not isinstance(doc, Mapping) or doc.get("format") != 1:
        raise CaseError(f"{VECTOR_FILE}: expected an object with format 1")
    out: list[Case] = []
    try:
        for v in doc.get("delivery", ()):
            args = {k: v[k] for k in ("account", "action_kind", "target", "request")}
            want = {"key": v["delivery_key"], "request_digest": v["request_digest"], "text_hash": v["text_key"]}
            step = {"op": "submit", "args": args, "expect": {"accepted": True, "result": want}}
            out.append(_vector_case(v, "delivery", step))
        for v in doc.get("source", ()):
            args = {"source_id": v["source_id"], "body": v["body"]}
            step = {
                "op": "capture_source",
                "args": args,
                "expect": {"accepted": True, "result": {"version": v["source_version"]}},
            }
            out.append(_vector_case(v, "source", step))
    except (KeyError, TypeError) as exc:
        raise CaseError(f"{VECTOR_FILE}: a vector lacks {exc}") from exc
    return out


def _vector_case(v: Mapping[str, Any], kind: str, step: Mapping[str, Any]) -> Case:
    what = "delivery key, digest and text key" if kind == "delivery" else "source version"
    return Case(
        id=f"identity-vector-{v['id']}",
        description=f"{what} of vector {v['id']}: {v['description']}"[:99],
        rule=VECTOR_RULES[kind],
        steps=(step,),
        source=VECTOR_FILE,
    )


# ------------------------------------------------------------------------------ the bundle
@dataclass(frozen=True)
class Bundle:
    """The case bundle's pinned version (``bundle.json``) and whether the files still match it.

    ``digest`` is the pinned SHA-256 over every file of the bundle (the case files, the schema, the
    identity vectors and the verification items, in path order, each as its path, a NUL, its bytes and
    a NUL); ``actual`` is that digest over the files as they are now. A claim of conformance names
    ``version``; ``modified`` says the cases were changed since it was pinned."""

    version: str
    format: int
    digest: str
    actual: str
    cases: int

    @property
    def modified(self) -> bool:
        return self.digest != self.actual

    def line(self) -> str:
        tail = " (modified since it was pinned)" if self.modified else ""
        return f"atmostonce conformance bundle {self.version} (case format {self.format}, {self.cases} cases, sha256 {self.actual[:16]}){tail}"


def bundle_digest(folder: Path | None = None) -> str:
    import hashlib

    root = folder or cases_dir()
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*.json") if p.name != BUNDLE_FILE):
        h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def bundle(folder: Path | str | None = None) -> Bundle:
    """The bundle under ``folder`` (default :func:`cases_dir`). Raises :class:`CaseError` without a ``bundle.json``."""
    root = Path(folder) if folder is not None else cases_dir()
    try:
        doc = json.loads((root / BUNDLE_FILE).read_text("utf-8"))
        version, fmt, digest = str(doc["version"]), int(doc["format"]), str(doc["digest"])
    except (OSError, json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise CaseError(f"no readable {BUNDLE_FILE} under {root}: {exc}") from exc
    return Bundle(version, fmt, digest, bundle_digest(root), len(load_cases(root)))


# ------------------------------------------------------------------------------ references
def resolve(value: Any, env: Mapping[str, Any]) -> Any:
    """``value`` with every reference replaced by what it names in ``env``."""
    if isinstance(value, str):
        if value.startswith("$$"):
            return value[1:]
        if value.startswith("$"):
            return lookup(value[1:], env)
        return value
    if isinstance(value, Mapping):
        if set(value) == {"$merge"}:
            merged: dict[str, Any] = {}
            for part in resolve(value["$merge"], env):
                if not isinstance(part, Mapping):
                    raise CaseError(f"$merge takes objects, got {part!r}")
                merged.update(part)
            return merged
        return {k: resolve(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve(v, env) for v in value]
    return value


def lookup(path: str, env: Mapping[str, Any]) -> Any:
    name, *parts = path.split(".")
    if name not in env:
        raise CaseError(f"${name} is not bound at this step (bound: {', '.join(sorted(env)) or 'nothing'})")
    cur: Any = env[name]
    walked = name
    for part in parts:
        walked += f".{part}"
        if isinstance(cur, Mapping) and part in cur:
            cur = cur[part]
        elif isinstance(cur, list) and part.isdigit() and int(part) < len(cur):
            cur = cur[int(part)]
        else:
            raise CaseError(f"${walked} does not exist")
    return cur


# ------------------------------------------------------------------------------ matchers
_MISSING = object()


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _cmp(op: str, want: Any, got: Any) -> bool:
    if op == "==":
        return bool(got == want)
    if op == "!=":
        return bool(got != want)
    if not (_num(want) and _num(got)):
        return False
    return bool({">": got > want, ">=": got >= want, "<": got < want, "<=": got <= want}[op])


def match(expected: Any, actual: Any, where: str = "") -> list[str]:
    """Mismatches between an (already resolved) expectation and an actual JSON value."""
    at = where or "value"
    if isinstance(expected, Mapping) and len(expected) == 1 and next(iter(expected)) in MATCHERS:
        op, want = next(iter(expected.items()))
        if actual is _MISSING:
            return [f"{at}: missing (wanted {op} {want!r})"]
        if op in ("==", "!=", ">", ">=", "<", "<="):
            return [] if _cmp(op, want, actual) else [f"{at}: {actual!r} is not {op} {want!r}"]
        if op == "len":
            n = len(actual) if isinstance(actual, (list, str, Mapping)) else None
            return [] if n == want else [f"{at}: length {n}, wanted {want}"]
        if op == "prefix":
            ok = isinstance(actual, list) and isinstance(want, list) and actual[: len(want)] == want
            return [] if ok else [f"{at}: does not start with the {len(want)} earlier items (it was rewritten)"]
        if op == "contains":
            return [] if isinstance(actual, (list, str)) and want in actual else [f"{at}: {want!r} not in {actual!r}"]
        if op == "not_contains":
            return [] if isinstance(actual, (list, str)) and want not in actual else [f"{at}: {want!r} in {actual!r}"]
        # distinct_by
        if not isinstance(actual, list) or not all(isinstance(x, Mapping) for x in actual):
            return [f"{at}: not a list of objects"]
        vals = [json.dumps(x.get(want), sort_keys=True) for x in actual]
        return [] if len(set(vals)) == len(vals) else [f"{at}: {want} values repeat: {vals}"]
    if isinstance(expected, Mapping):
        if not isinstance(actual, Mapping):
            return [f"{at}: expected an object, got {actual!r}"]
        out: list[str] = []
        for k, v in expected.items():
            out += match(v, actual.get(k, _MISSING), f"{where}.{k}" if where else k)
        return out
    if isinstance(expected, list):
        if not isinstance(actual, list) or len(actual) != len(expected):
            return [f"{at}: expected {expected!r}, got {actual!r}"]
        out = []
        for i, (e, a) in enumerate(zip(expected, actual, strict=True)):
            out += match(e, a, f"{at}[{i}]")
        return out
    if actual is _MISSING:
        return [f"{at}: missing (wanted {expected!r})"]
    if actual != expected or isinstance(actual, bool) != isinstance(expected, bool):
        return [f"{at}: {actual!r}, wanted {expected!r}"]
    return []
