"""The web console: a Starlette application with server-side Jinja2 templates (docs/console.md).

Every action goes through the same store move as the CLI command of the same name, so the table's guards
decide it; a refusal is shown as the typed refusal (event, guard and its meaning, state, next moves),
never as a crash (docs/design.md, "The gate is the conditional write"). Sign-in is by a token the
administrator configures outside the database; the session is a signed cookie (HttpOnly, SameSite=strict);
every form carries the session's CSRF token and a POST without it is refused with 403.
"""

from __future__ import annotations

import datetime as dt
import functools
import hmac
import json
import secrets
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.sessions import SessionMiddleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route
from starlette.templating import Jinja2Templates

from atmostonce.errors import (
    AtMostOnceError,
    FoundOnPlatform,
    IntakeError,
    NotVerified,
    ObjectOnRecord,
    Rejected,
    RetractionUnsupported,
    StoreError,
)
from atmostonce.names import STATE
from atmostonce.protocols import OperatorStore
from atmostonce.records import Plan, check_text
from atmostonce.table import machine

from .audit import ActionLog
from .queue import ACTIONS, actions_for, build_queue
from .settle import SETTLE_MOVES, SettleResult, refusal_doc, select, settle, would

__all__ = ["Credentials", "create_app"]

TEMPLATES = Jinja2Templates(directory=str(Path(__file__).with_name("templates")))


def _ts(t: float | None) -> str:
    if t is None:
        return "-"
    return dt.datetime.fromtimestamp(t, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S") + "Z"


def _age(seconds: float) -> str:
    s = int(seconds)
    if s < 120:
        return f"{s} s"
    if s < 7200:
        return f"{s // 60} min"
    if s < 172800:
        return f"{s // 3600} h"
    return f"{s // 86400} d"


TEMPLATES.env.filters["ts"] = _ts
TEMPLATES.env.filters["age"] = _age
TEMPLATES.env.filters["json"] = lambda v: json.dumps(v, indent=2, sort_keys=True, ensure_ascii=False, default=str)


class Credentials:
    """Who may sign in. Each configured line is ``NAME:TOKEN`` (that operator's own token: the name is the
    token's) or a bare ``TOKEN`` (a shared token: the operator gives a name at sign-in, recorded as given).
    Tokens are compared in constant time; they are never stored in the database."""

    def __init__(self, lines: list[str]):
        self.named: list[tuple[str, str]] = []
        self.shared: list[str] = []
        for raw in lines:
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            name, sep, token = line.partition(":")
            if sep and name.strip() and token.strip():
                self.named.append((check_text("operator", name.strip()), token.strip()))
            else:
                self.shared.append(line)
        if not self.named and not self.shared:
            raise ValueError("no console token configured")

    @classmethod
    def from_file(cls, path: str | Path) -> Credentials:
        return cls(Path(path).read_text("utf-8").splitlines())

    def check(self, token: str, name: str) -> str | None:
        """The operator ``token`` signs in, or ``None``. A named token ignores ``name``; a shared one needs it."""
        hit = None
        for who, tok in self.named:
            if hmac.compare_digest(tok.encode(), token.encode()):
                hit = who
        for tok in self.shared:
            if hmac.compare_digest(tok.encode(), token.encode()) and hit is None and name.strip():
                hit = name.strip()
        return hit


def create_app(
    store: OperatorStore,
    *,
    credentials: Credentials,
    action_log: ActionLog,
    session_secret: str | None = None,
    platform: Callable[[], Any] | None = None,
    projection: tuple[tuple[str, str], ...] | None = None,
    database: str = "",
    https_only: bool = False,
) -> Starlette:
    """The console over ``store``. ``platform``: makes a transport for read-back and retract checks (from
    ``--platform-config``); without it a remote id can only be recorded as asserted, not verified."""
    t = store.table

    def render(request: Request, name: str, status_code: int = 200, **ctx: Any) -> Response:
        flash = request.session.pop("flash", None)
        ctx |= {
            "operator": request.session.get("operator"),
            "csrf": request.session.get("csrf", ""),
            "flash": flash,
            "database": database,
            "table": t,
        }
        return TEMPLATES.TemplateResponse(request, name, ctx, status_code=status_code)

    def page(fn):
        async def endpoint(request: Request) -> Response:
            if not request.session.get("operator"):
                return RedirectResponse(f"/login?next={quote(request.url.path)}", status_code=303)
            return await run_in_threadpool(fn, request)

        return endpoint

    def action(fn):
        async def endpoint(request: Request) -> Response:
            if not request.session.get("operator"):
                return PlainTextResponse("sign in first", status_code=401)
            form = await request.form()
            want = request.session.get("csrf")
            got = form.get("csrf")
            if not want or not isinstance(got, str) or not hmac.compare_digest(want.encode(), got.encode()):
                return PlainTextResponse("refused: missing or wrong CSRF token", status_code=403)
            return await run_in_threadpool(fn, request, {k: v for k, v in form.items() if isinstance(v, str)})

        return endpoint

    def act(request: Request, name: str, subject: str, reason: str | None, fn: Callable[[], Any]) -> dict:
        """Run one operator action, record it in the action log under the operator, flash the result."""
        operator = request.session["operator"]
        try:
            result = {"done": fn()}
        except Rejected as exc:
            result = {"refused": refusal_doc(t, exc)}
        except FoundOnPlatform as exc:
            result = {"found_on_platform": exc.as_dict()}
        except ObjectOnRecord as exc:
            result = {"on_record": exc.as_dict()}
        except NotVerified as exc:
            result = {"not_verified": exc.as_dict()}
        except RetractionUnsupported as exc:
            result = {"unsupported": exc.as_dict()}
        except (IntakeError, ValueError) as exc:
            result = {"error": str(exc)}
        except StoreError as exc:
            result = {"store_error": str(exc)}
        except AtMostOnceError as exc:  # a read-back with no usable answer: nothing decided
            result = {"platform_error": str(exc)}
        action_log.record(operator=operator, action=name, subject=subject, reason=reason, result=result)
        shown = json.loads(json.dumps(result, default=str))
        if "not_verified" in shown and shown["not_verified"].get("evidence") is not None:
            shown["not_verified"]["evidence"] = json.dumps(shown["not_verified"]["evidence"], default=str)[:800]
        request.session["flash"] = {"action": name, "subject": subject, **shown}
        return result

    def reason_of(form: Mapping[str, str]) -> str:
        return check_text("reason", form.get("reason", ""))

    # ------------------------------------------------------------ sign-in
    async def login(request: Request) -> Response:
        if "csrf" not in request.session:
            request.session["csrf"] = secrets.token_urlsafe(32)
        nxt = request.query_params.get("next", "/")
        if request.method == "GET":
            return render(request, "login.html", next=nxt if nxt.startswith("/") else "/")
        form = await request.form()
        got = form.get("csrf")
        if not isinstance(got, str) or not hmac.compare_digest(request.session["csrf"].encode(), got.encode()):
            return PlainTextResponse("refused: missing or wrong CSRF token", status_code=403)
        who = credentials.check(str(form.get("token", "")), str(form.get("operator", "")))
        given = str(form.get("operator", "")).strip()[:256]
        action_log.record(
            operator=who or given or "(none given)",
            action="sign-in",
            subject=request.client.host if request.client else "",
            reason=None,
            result={"done": {"operator": who}} if who else {"error": "no operator has this token"},
        )
        if who is None:
            return render(request, "login.html", status_code=401, next=nxt, failed=True)
        request.session.clear()
        request.session["operator"] = who
        request.session["csrf"] = secrets.token_urlsafe(32)  # a fresh token for the signed-in session
        target = str(form.get("next", "/"))
        return RedirectResponse(target if target.startswith("/") and not target.startswith("//") else "/", 303)

    def logout(request: Request, form: Mapping[str, str]) -> Response:
        request.session.clear()
        return RedirectResponse("/login", status_code=303)

    # ------------------------------------------------------------ pages
    def queue(request: Request) -> Response:
        items, notes = build_queue(store)
        return render(request, "queue.html", items=items, notes=notes, labels=ACTIONS)

    def _key(raw: str) -> str:
        key = raw.strip().lower()
        if store.find(key) is None:
            raise KeyError(key)
        return key

    def intent(request: Request) -> Response:
        from atmostonce.identity import platform_idempotency_key
        from atmostonce.pointer import MISSING, pointer_get
        from atmostonce.projection import default_projection
        from atmostonce.runtime import wire_request

        try:
            key = _key(request.path_params["key"])
        except KeyError:
            return render(request, "missing.html", status_code=404, key=request.path_params["key"])
        it = store.get(key)
        body = dict(wire_request(it).body)
        pairs = projection if projection else default_projection(body)
        proj = []
        for req_ptr, obj_ptr in pairs:
            v = pointer_get(body, req_ptr)
            proj.append({"request": req_ptr, "object": obj_ptr, "value": None if v is MISSING else v})
        approvals = store.approvals(key) if it.requires_approval else []
        claim = store.claim(it.target) if it.requires_approval else None
        live = set(machine("approval").states_of_kind("live"))
        return render(
            request,
            "intent.html",
            it=it,
            body=body,
            projection=proj,
            projection_configured=bool(projection),
            idem=platform_idempotency_key(it.key, it.resend_epoch, it.fence_epoch),
            attempts=store.attempts(key),
            history=store.history(key),
            reconciliations=store.reconciliations(key),
            late=store.evidence(key),
            refusals=store.refusals(key),
            approvals=approvals,
            live_states=live,
            claim=claim,
            actions=actions_for(t, it),
            labels=ACTIONS,
            can_verify=platform is not None,
            published=it.state in (STATE.published,) and it.remote_id is not None,
            is_initial=it.state == t.initial,
        )

    def look_first(key: str, event: str) -> tuple[Plan, dict[str, Any]]:
        """Before a person sends ``key`` again: an object the store records as made by a send of it
        (``ObjectOnRecord``), and when the console has a platform its lookup by key under every key it was sent
        under (``FoundOnPlatform`` when an object is there): nothing is written then
        (:func:`atmostonce.runtime.check_before_sending_again`). Returns the plan of the read they were about,
        for the move to present, and the look's record."""
        from atmostonce.runtime import check_before_sending_again

        if platform is None:
            plan, _ = check_before_sending_again(store, None, key, event)
            return plan, {"looked_up": [], "not_looked_up": "the console has no --platform-config to look it up"}
        transport = platform()
        try:
            plan, looked = check_before_sending_again(store, transport, key, event)
        finally:
            transport.close()
        assert looked is not None  # a transport was given
        return plan, looked_doc(looked)

    def looked_doc(looked: Mapping[str, Any]) -> dict[str, Any]:
        """What a look-first found nothing under, as the action log keeps it."""
        return {"looked_up": looked["looked_up"], **({"not_looked_up": looked["why"]} if looked["why"] else {})}

    def intent_action(request: Request, form: Mapping[str, str]) -> Response:
        raw, name = request.path_params["key"], request.path_params["action"]
        back = RedirectResponse(f"/intents/{quote(raw)}", status_code=303)
        operator = request.session["operator"]

        def run() -> Any:
            key = raw.strip().lower()  # an unknown key is refused by the store (intent_exists)
            reason = reason_of(form)
            if name == "park":
                return {"state": store.park(key, operator=operator, reason=reason).state}
            if name == "resolve_not_sent":
                plan, looked = look_first(key, name)
                it = store.resolve_not_sent(key, operator=operator, reason=reason, plan=plan)
                return {"state": it.state, **looked}
            if name == "resend":
                plan, looked = look_first(key, name)
                return {"state": store.resend(key, operator=operator, plan=plan).state, **looked}
            if name == "retry":
                return {"state": store.retry(key, operator=operator).state}
            if name == "resolve_published":
                return resolve_published(key, operator, reason, form)
            if name == "approve":
                secs = float(form.get("expires_in") or 3600)
                a = store.approve(key, approver=operator, expires_in=secs)
                return {"approval_id": a.approval_id, "state": a.state, "expires_at": a.expires_at}
            if name == "withdraw":
                a = store.withdraw_approval(form.get("approval_id", ""), operator=operator, reason=reason)
                return {"approval_id": a.approval_id, "state": a.state}
            if name == "retract":
                return retract(key, form)
            raise IntakeError(f"the console has no action {name!r}")

        act(request, name, raw, form.get("reason"), run)
        return back

    def resolve_published(key: str, operator: str, reason: str, form: Mapping[str, str]) -> dict:
        from atmostonce.runtime import verify_remote_object

        remote_id = check_text("remote_id", form.get("remote_id", ""))
        unverified = form.get("unverified") == "yes"
        if unverified:
            evidence = {"verified": False, "asserted_by": operator, "remote_id": remote_id, "why": reason}
        else:
            if platform is None:
                raise IntakeError(
                    "the console has no --platform-config to read the object back: record it as asserted by you, "
                    "not verified, or restart the console with --platform-config"
                )
            if store.get(key).state not in t.sources("resolve_published"):
                evidence = {}  # the move is refused by its source state: read nothing back
            else:
                transport = platform()
                try:
                    evidence = verify_remote_object(store, transport, key, remote_id)
                finally:
                    transport.close()
            evidence = evidence | {"reason": reason} if evidence else evidence
        it = store.resolve_published(key, operator=operator, remote_id=remote_id, evidence=evidence or None)
        return {"state": it.state, "verified": evidence.get("verified") is True, "remote_id": remote_id}

    def retract(key: str, form: Mapping[str, str]) -> dict:
        correction = None
        if form.get("correct", "").strip():
            correction = json.loads(form["correct"])
            if not isinstance(correction, dict):
                raise IntakeError("a correction is a JSON object")
        checked = platform is not None
        if checked:
            from atmostonce.runtime import check_retraction

            assert platform is not None
            transport = platform()
            try:
                check_retraction(transport, key, "delete" if correction is None else "correct")
            finally:
                transport.close()
        it = store.submit_retraction(key, correction=correction)
        return {"retraction": it.key, "state": it.state, "capability_checked": checked}

    # ------------------------------------------------------------ bulk settle
    def _filters(src: Mapping[str, str]) -> dict[str, Any]:
        def opt(name: str) -> str | None:
            v = (src.get(name) or "").strip()
            return v or None

        return {
            "state": opt("state") or (STATE.parked,)[0],
            "account": opt("account"),
            "kind": opt("kind"),
            "target": opt("target"),
        }

    def settle_page(request: Request) -> Response:
        f = _filters(request.query_params)
        as_ = request.query_params.get("as", next(iter(SETTLE_MOVES)))
        try:
            picked = select(store, **f)
            rows = would(store, picked, as_)
            error = None
        except IntakeError as exc:
            rows, error = [], str(exc)
        return render(
            request, "settle.html", filters=f, as_=as_, moves=SETTLE_MOVES, rows=rows, error=error, stage="preview"
        )

    def settle_confirm(request: Request, form: Mapping[str, str]) -> Response:
        as_ = form.get("as", "")
        keys = [k for k in form.get("keys", "").split() if k]
        operator = request.session["operator"]
        reason = form.get("reason", "")
        if form.get("confirm") != "yes":
            return render(
                request,
                "settle.html",
                status_code=400,
                filters=_filters(form),
                as_=as_,
                moves=SETTLE_MOVES,
                rows=[],
                error="tick the confirmation box to settle the selection",
                stage="preview",
            )

        def log_result(r: SettleResult) -> None:  # as each key settles: an interrupt leaves every move logged
            looked = {} if r.lookup is None else looked_doc(r.lookup)  # as a single intent's move records it
            res = (
                {"done": {"state": r.state_after, **looked}}
                if r.result == "moved"
                else {r.result: r.refused or r.found or r.error}
            )
            action_log.record(operator=operator, action=f"settle:{as_}", subject=r.key, reason=reason, result=res)

        transport = None if platform is None else platform()
        try:
            from atmostonce.runtime import check_before_sending_again

            look = None if transport is None else functools.partial(check_before_sending_again, store, transport)
            results = settle(store, keys, as_=as_, operator=operator, reason=reason, look=look, on_result=log_result)
        except IntakeError as exc:  # refused before any key was touched (the move, the operator, the reason)
            action_log.record(
                operator=operator,
                action=f"settle:{as_}",
                subject=f"{len(keys)} keys",
                reason=reason,
                result={"error": str(exc)},
            )
            return render(
                request,
                "settle.html",
                status_code=400,
                filters=_filters(form),
                as_=as_,
                moves=SETTLE_MOVES,
                rows=[],
                error=str(exc),
                stage="preview",
            )
        finally:
            if transport is not None:
                transport.close()
        return render(request, "settle.html", results=results, as_=as_, moves=SETTLE_MOVES, stage="done")

    # ------------------------------------------------------------ policy
    def policy(request: Request) -> Response:
        return render(request, "policy.html", pol=store.policies(), changes=store.policy_changes(limit=50))

    def policy_action(request: Request, form: Mapping[str, str]) -> Response:
        name = request.path_params["what"]
        operator = request.session["operator"]

        def run() -> Any:
            reason_of(form)
            if name == "kill-switch":
                scope = form.get("scope", "").strip()
                scope = "global" if scope == "global" else f"account:{scope}"
                engaged = form.get("engaged") == "on"
                store.set_kill_switch(scope, engaged, operator=operator)
                return {"scope": scope, "engaged": engaged}
            if name == "rate-limit":
                account = check_text("account", form.get("account", "").strip())
                raw = form.get("max_sends", "").strip()
                limit = None if raw in ("", "clear") else int(raw)
                window = float(form.get("window_seconds") or 60)
                store.set_rate_limit(account, limit, window_seconds=window, operator=operator)
                return {"account": account, "max_sends": limit, "window_seconds": window}
            if name == "signing":
                account = check_text("account", form.get("account", "").strip())
                required = form.get("required") == "on"
                store.set_signing_required(account, required, operator=operator)
                return {"account": account, "signing_required": required}
            if name in ("credential", "contract"):
                subject = check_text("name", form.get("name", "").strip())
                version = form.get("version", "").strip() or None
                setter = store.set_credential_version if name == "credential" else store.set_contract_version
                setter(subject, version, operator=operator)
                return {"name": subject, "version": version}
            if name == "text-window":
                raw = form.get("seconds", "").strip()
                try:
                    seconds = float(raw)
                except ValueError:
                    raise IntakeError(f"the text window is a number of seconds, got {raw!r}") from None
                store.set_text_window(seconds, operator=operator)
                return {"text_window_seconds": seconds}
            raise IntakeError(f"the console has no policy {name!r}")

        act(
            request,
            f"policy:{name}",
            form.get("scope") or form.get("account") or form.get("name") or "",
            form.get("reason"),
            run,
        )
        return RedirectResponse("/policy", status_code=303)

    def audit(request: Request) -> Response:
        return render(request, "audit.html", rows=action_log.rows())

    routes = [
        Route("/login", login, methods=["GET", "POST"]),
        Route("/logout", action(logout), methods=["POST"]),
        Route("/", page(queue)),
        Route("/intents/{key}", page(intent)),
        Route("/intents/{key}/{action}", action(intent_action), methods=["POST"]),
        Route("/settle", page(settle_page)),
        Route("/settle", action(settle_confirm), methods=["POST"]),
        Route("/policy", page(policy)),
        Route("/policy/{what}", action(policy_action), methods=["POST"]),
        Route("/audit", page(audit)),
    ]
    middleware = [
        Middleware(
            SessionMiddleware,
            secret_key=session_secret or secrets.token_urlsafe(32),
            session_cookie="atmostonce_console",
            max_age=8 * 3600,
            same_site="strict",
            https_only=https_only,
        )
    ]

    async def store_down(request: Request, exc: Exception) -> Response:
        # the store failed (the database is unreachable, say): nothing was decided; say so instead of a 500
        return PlainTextResponse(f"store error: {exc}; nothing was changed by this page", status_code=503)

    return Starlette(routes=routes, middleware=middleware, exception_handlers={StoreError: store_down})
