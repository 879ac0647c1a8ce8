"""Conformance drivers for the two PyPI peers, through their public APIs only: agent-once 0.1.0
(``once.Once.execute``) and exactly-once 0.2.1 (``exactly_once.once``). docs/conformance.md, "The peers".

Neither peer has delivery intents, leases, guards or records, so each driver answers the few
operations its library can express and ``unsupported`` for the rest (the runner reports those cases
not applicable, never as errors):

* ``submit`` remembers the request (the peer keeps nothing until the effect runs) and answers an
  intent whose ``key`` is the peer's own key for that call (agent-once's ``make_key``; exactly-once
  takes the key it is given: our delivery key); ``get`` answers the peer's record as an intent state
  (no record: ``pending``; running: ``authorized``; done: ``published``; failed: ``failed``; unknown
  or left in flight: ``indeterminate``); ``count_by_state`` and ``claimable`` the same view;
* ``dispatch`` is one call of the peer's guarded effect, the effect being a send to a scripted
  platform (the same faults as the reference runtime's: a refused connection raises
  ``ConnectionRefusedError``, a lost answer ``TimeoutError``, a worker death a ``BaseException`` the
  library sees); it answers the outcome in our vocabulary: ``send.success`` (the library keeps the
  answer as proof: it reads nothing back), ``send.not_sent``, ``send.unknown``;
* ``sweep`` is what an agent framework does with a failed tool call: call it again, without a
  verifier; ``retried`` counts the calls that ran the effect again;
* ``reconcile`` calls every unsettled effect again with the library's own reconciliation hook
  (agent-once's ``verify``, exactly-once's ``check_then_decide`` prober) answering from the
  platform's lookup by key; it counts what the lookup said (``lookup.found``, ``lookup.not_found``,
  ``lookup.not_found_fenced``) and, with lookup ``none``, ``lookup.unsupported``; the library decides
  what follows (the platform counts show whether it sent again);
* ``platform`` counts the requests that reached the platform and the objects it holds per key.
"""

from __future__ import annotations

import itertools
import tempfile
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from atmostonce import identity
from atmostonce.conformance import Driver
from atmostonce.conformance.drivers import CRASH_POINTS

__all__ = ["PEERS", "AgentOnceDriver", "ExactlyOnceDriver", "peer_driver"]

BEFORE_SEND = ("after_begin", "after_work", "after_authorize")


class WorkerDied(BaseException):  # noqa: N818 - a crash, as the libraries see one (not an Exception)
    """A worker death inside the guarded effect (a BaseException: an interruption, not an error)."""


class Platform:
    """A platform without idempotency dedupe that counts every request (the reference runtime's rules)."""

    def __init__(self) -> None:
        self.lookup = "none"
        self.sends: Counter[str] = Counter()
        self.objects: dict[str, list[str]] = {}
        self.tombstones: set[str] = set()
        self.next_fault: str | None = None
        self._ids = itertools.count(1)

    def send(self, key: str, request: Mapping[str, Any], crash_at: str | None) -> str:
        fault, self.next_fault = self.next_fault, None
        if crash_at in BEFORE_SEND:
            raise WorkerDied(crash_at)
        if fault == "connect_refused":
            raise ConnectionRefusedError("connection refused: nothing reached the platform")
        self.sends[key] += 1
        if fault == "error_before_write":
            raise TimeoutError("the request arrived, the answer was lost")
        if key in self.tombstones:
            raise ConnectionRefusedError("the key is tombstoned by a fenced lookup")
        remote_id = f"obj-{next(self._ids)}"
        self.objects.setdefault(key, []).append(remote_id)
        if fault == "error_after_write":
            raise TimeoutError("the object was created, the answer was lost")
        if crash_at is not None:
            raise WorkerDied(crash_at)
        return remote_id

    def find(self, key: str) -> str | None:
        found = self.objects.get(key)
        if not found and self.lookup == "fenced":
            self.tombstones.add(key)
        return found[-1] if found else None


class PeerDriver(Driver):
    """The part both peers share: intents remembered, the platform, the operations mapped."""

    library = ""
    features = frozenset({"store", "runtime"})

    def __init__(self) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="atmostonce-peer-")
        self._n = 0
        self.intents: dict[str, dict[str, Any]] = {}
        self.platform = Platform()

    # -- the peer ------------------------------------------------------------------------
    def open(self, path: Path) -> None:
        raise NotImplementedError

    def key_for(self, account: str, action_kind: str, target: str, request: Mapping[str, Any]) -> str:
        raise NotImplementedError

    def status(self, key: str) -> str:
        """The peer's record for ``key`` as one of our states."""
        raise NotImplementedError

    def call_effect(self, key: str, effect: Callable[[], str], lookup: Callable[[], str | None] | None) -> str:
        """One call of the peer's guarded effect; ``lookup`` is its reconciliation hook, if any."""
        raise NotImplementedError

    # -- the driver ----------------------------------------------------------------------
    def reset(self) -> None:
        self.close_peer()
        self._n += 1
        self.intents, self.platform = {}, Platform()
        self.open(Path(self._dir.name) / f"case-{self._n}")

    def close_peer(self) -> None:
        pass

    def close(self) -> None:
        self.close_peer()
        self._dir.cleanup()

    def advance(self, seconds: float) -> None:
        pass  # neither peer has a lease or a window the cases' clock could move

    def call(self, op: str, args: Mapping[str, Any]) -> dict[str, Any]:
        handler = getattr(self, f"op_{op}", None)
        if handler is None:
            return {"error": {"type": "unsupported", "message": f"{self.library} has no {op}"}}
        try:
            return handler(args)
        except (ValueError, TypeError, KeyError) as exc:  # bad input the peer (or our identity check) rejects
            return {"error": {"type": "intake", "message": f"{type(exc).__name__}: {exc}"}}

    def intent(self, key: str) -> dict[str, Any]:
        it = self.intents[key]
        return {**it, "state": self.status(key), "attempt_count": it["calls"], "plan": {"key": key}}

    def op_submit(self, a: Mapping[str, Any]) -> dict[str, Any]:
        extra = set(a) - {"account", "action_kind", "target", "request"}
        if extra:
            return {"error": {"type": "unsupported", "message": f"{self.library} takes no {sorted(extra)}"}}
        key = self.key_for(a["account"], a["action_kind"], a["target"], a["request"])
        self.intents.setdefault(
            key,
            {
                "key": key,
                "account": a["account"],
                "action_kind": a["action_kind"],
                "target": a["target"],
                "request": a["request"],
                "request_digest": identity.request_digest(a["request"]),
                "calls": 0,
            },
        )
        return self.intent(key)

    def op_get(self, a: Mapping[str, Any]) -> dict[str, Any]:
        if a.get("key") not in self.intents:
            return {"refused": "intent_exists"}
        return self.intent(a["key"])

    def op_count_by_state(self, a: Mapping[str, Any]) -> dict[str, Any]:
        return dict(Counter(self.status(k) for k in self.intents))

    def op_claimable(self, a: Mapping[str, Any]) -> dict[str, Any]:
        return {"items": [k for k in self.intents if self.status(k) == "pending"]}

    def op_configure_platform(self, a: Mapping[str, Any]) -> dict[str, Any]:
        self.platform.lookup = a.get("lookup", "none")
        return {}

    def op_platform(self, a: Mapping[str, Any]) -> dict[str, Any]:
        key = a.get("key")
        return {"sends": self.platform.sends[key], "objects": len(self.platform.objects.get(key, ()))}

    def _effect(self, key: str, crash_at: str | None) -> Callable[[], str]:
        def effect() -> str:
            self.intents[key]["calls"] += 1
            return self.platform.send(key, self.intents[key]["request"], crash_at)

        return effect

    def _one_call(self, key: str, crash_at: str | None, lookup: Callable[[], str | None] | None) -> str:
        try:
            self.call_effect(key, self._effect(key, crash_at), lookup)
        except WorkerDied as exc:
            return f"crashed:{exc.args[0]}"
        except ConnectionRefusedError:
            return "send.not_sent"
        except TimeoutError:
            return "send.unknown"
        except Exception as exc:  # the library refused to run it (failed earlier, unknown, quarantined)
            return f"refused:{type(exc).__name__}"
        return "send.success"

    def op_dispatch(self, a: Mapping[str, Any]) -> dict[str, Any]:
        fault = a.get("fault") or {}
        crash_at = fault.get("at") if fault.get("kind") == "worker_dies" else None
        if crash_at is not None and crash_at not in CRASH_POINTS:
            return {"error": {"type": "intake", "message": f"unknown crash point {crash_at!r}"}}
        if fault.get("kind") not in (None, "worker_dies"):
            self.platform.next_fault = fault["kind"]
        out = self._one_call(a["key"], crash_at, None)
        if out.startswith("crashed:"):
            return {"crashed": out.removeprefix("crashed:")}
        return {"outcome": out}

    def op_dispatch_pending(self, a: Mapping[str, Any]) -> dict[str, Any]:
        keys = [k for k in self.intents if self.status(k) == "pending"]
        return {"outcomes": dict(Counter(self._one_call(k, None, None) for k in keys))}

    def op_sweep(self, a: Mapping[str, Any]) -> dict[str, Any]:
        retried = skipped = 0
        for key in [k for k in self.intents if self.status(k) in ("failed", "indeterminate")]:
            before = self.platform.sends[key] + self.intents[key]["calls"]
            self._one_call(key, None, None)
            if self.platform.sends[key] + self.intents[key]["calls"] > before:
                retried += 1
            else:
                skipped += 1
        return {"expired": 0, "abandoned": 0, "retried": retried, "exhausted": 0, "skipped": skipped}

    def op_reconcile(self, a: Mapping[str, Any]) -> dict[str, Any]:
        counts: Counter[str] = Counter()
        for key in [k for k in self.intents if self.status(k) == "indeterminate"]:
            if self.platform.lookup == "none":
                counts["lookup.unsupported"] += 1
                self._one_call(key, None, None)
                continue
            said: list[str] = []

            def lookup(key: str = key, said: list[str] = said) -> str | None:
                found = self.platform.find(key)
                miss = "lookup.not_found_fenced" if self.platform.lookup == "fenced" else "lookup.not_found"
                said.append("lookup.found" if found else miss)
                return found

            self._one_call(key, None, lookup)
            counts.update(said)
        return dict(counts)


class AgentOnceDriver(PeerDriver):
    """agent-once 0.1.0: ``Once(path).execute(fn, key=..., verify=...)`` over its SQLite store."""

    name = library = "agent-once 0.1.0"

    def open(self, path: Path) -> None:
        import once

        self.once = once.Once(str(path.with_suffix(".db")))
        self._once = once

    def close_peer(self) -> None:
        if getattr(self, "once", None) is not None:
            self.once.close()
            self.once = None

    def key_for(self, account, action_kind, target, request) -> str:
        return self._once.make_key(action_kind, {"account": account, "target": target, "request": request}, None)

    def status(self, key: str) -> str:
        record = self.once.get(key)
        if record is None:
            return "pending"
        return {"pending": "authorized", "done": "published", "failed": "failed", "unknown": "indeterminate"}[
            record.status.value
        ]

    def call_effect(self, key, effect, lookup) -> str:
        verify = None
        if lookup is not None:

            def verify(_key: str, _args: dict[str, Any]) -> Any:
                found = lookup()
                return self._once.NOT_HAPPENED if found is None else found

        return self.once.execute(lambda: effect(), key=key, tool_name="publish", verify=verify)


class ExactlyOnceDriver(PeerDriver):
    """exactly-once 0.2.1: ``once(store, key=..., policy=...)`` over its in-memory store (default policy
    ``quarantine``; ``check_then_decide`` with the platform lookup as prober when reconciling)."""

    name = library = "exactly_once 0.2.1"

    def open(self, path: Path) -> None:
        import exactly_once

        self._eo = exactly_once
        self.store = exactly_once.Store.memory()

    def key_for(self, account, action_kind, target, request) -> str:
        return identity.delivery_key(account, action_kind, target, request)

    def status(self, key: str) -> str:
        record = self.store.get(key)
        if record is None:
            return "pending"
        return "published" if record.state is self._eo.State.COMMITTED else "indeterminate"

    def call_effect(self, key, effect, lookup) -> str:
        eo = self._eo
        policy = eo.quarantine
        if lookup is not None:

            def prober(_key: str) -> Any:
                found = lookup()
                if found is None:
                    return eo.ProbeResult(eo.Verdict.NOT_COMMITTED)
                return eo.ProbeResult(eo.Verdict.COMMITTED, found)

            policy = eo.check_then_decide(prober)

        @eo.once(self.store, key=lambda delivery_key: delivery_key, policy=policy)
        def publish(delivery_key: str) -> str:
            return effect()

        return publish(key)


PEERS: dict[str, type[PeerDriver]] = {"agent-once": AgentOnceDriver, "exactly-once": ExactlyOnceDriver}


def peer_driver(name: str) -> PeerDriver:
    return PEERS[name]()


# ------------------------------------------------------------------------------ the published table
PEERS_BEGIN, PEERS_END = "<!-- peers:begin -->", "<!-- peers:end -->"


def measure(cases: Any) -> dict[str, Any]:
    """Each peer -> its report over ``cases``."""
    from atmostonce.conformance import run_suite

    out = {}
    for name in PEERS:
        d = peer_driver(name)
        try:
            out[name] = run_suite(d, cases)
        finally:
            d.close()
    return out


def _split(results: list[Any]) -> tuple[list[Any], list[Any]]:
    vectors = [r for r in results if r.case.source == "identity_vectors.json"]
    return [r for r in results if r.case.source != "identity_vectors.json"], vectors


def peers_markdown(reports: Mapping[str, Any]) -> str:
    from atmostonce.conformance.runner import FAILED, NOT_APPLICABLE, PASSED

    def counts(results: list[Any]) -> str:
        n = Counter(r.status for r in results)
        return f"{n[PASSED]} / {n[FAILED]} / {n[NOT_APPLICABLE]}"

    lines = [
        PEERS_BEGIN,
        "| peer | behaviour cases: passed / failed / not applicable | identity vectors: passed / failed / not applicable | errors |",
        "|---|---|---|---|",
    ]
    for name, report in reports.items():
        behaviour, vectors = _split(report.results)
        errors = sum(r.status == "error" for r in report.results)
        lines.append(f"| {PEERS[name].library} | {counts(behaviour)} | {counts(vectors)} | {errors} |")
    lines.append("")
    for name, report in reports.items():
        behaviour, _ = _split(report.results)
        passed = ", ".join(f"`{r.case.id}`" for r in behaviour if r.status == "passed") or "none"
        failed = ", ".join(f"`{r.case.id}`" for r in behaviour if r.status == "failed") or "none"
        lines.append(f"* **{PEERS[name].library}** passes {passed}; fails {failed}.")
    lines.append(PEERS_END)
    return "\n".join(lines)


def _write_docs() -> None:  # python -m tests.conformance.peers
    from atmostonce.conformance import load_cases

    docs = Path(__file__).resolve().parents[2] / "docs" / "conformance.md"
    text = docs.read_text("utf-8")
    start, end = text.index(PEERS_BEGIN), text.index(PEERS_END) + len(PEERS_END)
    docs.write_text(text[:start] + peers_markdown(measure(load_cases())) + text[end:], "utf-8")


if __name__ == "__main__":
    _write_docs()
