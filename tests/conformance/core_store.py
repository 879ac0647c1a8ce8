"""A store with only the core of the Store protocol: the reference model seen through a proxy that
hides the approval and claim operations and the late outcomes (and, optionally, more members).

It is how a third party's first store looks: ``--impl tests.conformance.core_store:factory`` must give
a clean report, with the claims cases listed as not applicable and never as errors.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from atmostonce.conformance import Implementation, ManualClock
from atmostonce.conformance.drivers import CLAIM_OPS, EVIDENCE_OPS
from atmostonce.model import MemoryStore

__all__ = ["CoreOnlyStore", "factory", "wrong_factory"]

HIDDEN = frozenset(CLAIM_OPS) | frozenset(EVIDENCE_OPS) | {"claim_log", "approve_signed", "add_operator_key"}


class CoreOnlyStore:
    """Forwards every member of the wrapped store except ``hidden`` ones (AttributeError, as if never written)."""

    def __init__(self, inner: Any, hidden: Iterable[str] = HIDDEN):
        self._inner, self._hidden = inner, frozenset(hidden)

    def __getattr__(self, name: str) -> Any:
        if name in self._hidden:
            raise AttributeError(f"{type(self).__name__} has no {name}")
        return getattr(self._inner, name)


def factory(hidden: Iterable[str] = HIDDEN, features: frozenset[str] | None = None) -> Implementation:
    clock = ManualClock()
    return Implementation(CoreOnlyStore(MemoryStore(clock=clock), hidden), clock.advance, features=features)


class _BeginsNothing(CoreOnlyStore):
    """A wrong store: every begin is refused (the stateful machine's shortest disagreement)."""

    def begin(self, key: str, **kw: Any) -> Any:
        from atmostonce.errors import GuardRefused

        raise GuardRefused("begin", key, "no_open_attempt", None)


def wrong_factory() -> Implementation:
    clock = ManualClock()
    return Implementation(_BeginsNothing(MemoryStore(clock=clock)), clock.advance)


class OwnIdentities:
    """The model under identities of its own: every delivery key and request digest it hands out is
    prefixed, and taken back on the way in. A store whose identity functions differ from the model's
    (they pass the identity vectors only where they agree): the stateful machine must map the model's
    keys to these, never compare them byte for byte."""

    KEY, DIGEST = "own-", "own-digest-"

    def __init__(self, inner: Any):
        self._inner = inner

    def _in(self, v: Any) -> Any:
        import dataclasses

        if isinstance(v, (list, tuple)):  # a batch: (event, intent) pairs, (event, plan, keywords) triples
            return type(v)(self._in(x) for x in v)
        if isinstance(v, str) and v.startswith(self.DIGEST):
            return v.removeprefix(self.DIGEST)
        if isinstance(v, str) and v.startswith(self.KEY):
            return v.removeprefix(self.KEY)
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            changes = {
                f.name: self._in(getattr(v, f.name))
                for f in dataclasses.fields(v)
                if f.name in ("key", "request_digest")
            }
            return dataclasses.replace(v, **changes)
        return v

    def _out(self, v: Any) -> Any:
        import dataclasses

        if isinstance(v, list):
            return [self._out(x) for x in v]
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            changes = {}
            if getattr(v, "key", None) is not None:
                changes["key"] = self.KEY + v.key
            if getattr(v, "request_digest", None) is not None:
                changes["request_digest"] = self.DIGEST + v.request_digest
            if (
                getattr(v, "plan", None) is not None
                and hasattr(v, "__dataclass_fields__")
                and "plan" in v.__dataclass_fields__
            ):
                changes["plan"] = self._out(v.plan)
            return dataclasses.replace(v, **changes) if changes else v
        return v

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if not callable(attr) or name in ("now", "table"):
            return attr

        def call(*args: Any, **kw: Any) -> Any:
            out = attr(*(self._in(a) for a in args), **{k: self._in(v) for k, v in kw.items()})
            if name == "claimable":
                return [self.KEY + k for k in out]
            return self._out(out)

        return call


def own_identities_factory() -> Implementation:
    clock = ManualClock()
    return Implementation(
        OwnIdentities(MemoryStore(clock=clock)), clock.advance, features=frozenset({"store", "runtime", "evidence"})
    )
