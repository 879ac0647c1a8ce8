"""The console in a real browser (headless Chromium through Selenium, Debian's chromium and chromium-driver):
`atmostonce console` serves a SQLite database on loopback; an operator signs in, finds a parked intent in the
queue, settles it through the bulk settle confirmation, and sees the audit row; a request without a session or
without the CSRF token is refused. The screenshots it takes are the ones docs/console.md shows."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from tests.helpers import to_state

pytestmark = pytest.mark.slow

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
# the screenshots docs/console.md shows: written there by `make console-screenshots`; a plain test run keeps
# them in a temporary folder, so `make test` leaves the working tree as it found it
SHOTS = Path(os.environ.get("ATMOSTONCE_SCREENSHOTS") or tempfile.mkdtemp(prefix="atmostonce-console-shots-"))
TOKEN = "browser-test-token"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def served(tmp_path):
    from atmostonce_sql import open_store

    url = f"sqlite:///{tmp_path / 'console.sqlite3'}"
    store = open_store(url)
    parked, _ = to_state(store, "parked", text="the launch post", account="shop", target="news")
    failed, _ = to_state(store, "failed", text="a reply", account="shop", target="review-7", max_attempts=1)
    to_state(store, "published", text="done already", account="shop", target="news-2")
    tokens = tmp_path / "tokens"
    tokens.write_text(f"alice:{TOKEN}\n", "utf-8")
    port = _free_port()
    log = tmp_path / "audit.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "atmostonce_cli.main", "console", "--database-url", url, "--port", str(port),
         "--token-file", str(tokens), "--audit-log", str(log)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=os.environ | {"PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                httpx.get(f"{base}/login", timeout=1)
                break
            except httpx.TransportError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the console did not start: {proc.stderr.read().decode()}") from None
                time.sleep(0.1)
        yield {"base": base, "store": store, "parked": parked.key, "failed": failed.key, "log": log}
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        store.close()


@pytest.fixture
def browser():
    if not (CHROMIUM and CHROMEDRIVER):
        pytest.fail("chromium and chromedriver are needed (bash .ci/install-tools.sh installs them)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1400,1000",
    ):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    driver.implicitly_wait(5)
    try:
        yield driver
    finally:
        driver.quit()


def shot(driver, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(SHOTS / f"{name}.png"))


def navigate(d, element) -> None:
    """Click what loads a new page and wait until the new page has loaded, so the next lookup reads it (under
    load the old page's rows would otherwise be found, then go stale). The old page is marked in its window
    object, which a loaded page no longer has; errors while the browser is between the two pages are waited out."""
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.support.ui import WebDriverWait

    d.execute_script("window.__atmostonce_old_page = true")
    element.click()
    WebDriverWait(d, 30, ignored_exceptions=(WebDriverException,)).until(
        lambda drv: drv.execute_script(
            "return window.__atmostonce_old_page === undefined && document.readyState === 'complete'"
        )
    )


def test_an_operator_signs_in_settles_a_parked_intent_and_sees_the_audit_row(served, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    base, store, key = served["base"], served["store"], served["parked"]
    d = browser
    d.get(f"{base}/")
    assert "/login" in d.current_url  # nothing without signing in
    d.find_element(By.ID, "login-token").send_keys(TOKEN)
    shot(d, "login")
    navigate(d, d.find_element(By.ID, "login-submit"))
    assert d.find_element(By.ID, "operator").text == "alice"

    row = d.find_element(By.CSS_SELECTOR, f'tr.queue-item[data-key="{key}"]')
    assert row.get_attribute("data-state") == "parked"
    shot(d, "queue")
    navigate(d, row.find_element(By.CSS_SELECTOR, "a[href^='/intents/']"))
    assert d.find_element(By.ID, "intent-state").text == "parked"
    shot(d, "intent")

    d.get(f"{base}/settle")
    Select(d.find_element(By.ID, "settle-state")).select_by_visible_text("parked")
    Select(d.find_element(By.ID, "settle-as")).select_by_value("not-sent")
    d.find_element(By.ID, "settle-account").send_keys("shop")
    navigate(d, d.find_element(By.ID, "settle-preview"))
    selected = [e.get_attribute("data-key") for e in d.find_elements(By.CSS_SELECTOR, "tr.settle-row")]
    assert selected == [key]
    d.find_element(By.ID, "settle-reason").send_keys("checked the platform: not there")
    d.find_element(By.ID, "settle-confirm-box").click()
    shot(d, "settle-confirm")
    navigate(d, d.find_element(By.ID, "settle-submit"))
    result = d.find_element(By.CSS_SELECTOR, f'tr.settle-result[data-key="{key}"]')
    assert result.get_attribute("data-result") == "moved"
    shot(d, "settle-done")
    assert store.get(key).state == "failed"
    assert store.history(key)[-1].detail["operator"] == "alice"

    d.get(f"{base}/audit")
    audit = d.find_element(By.CSS_SELECTOR, f'tr.audit-row[data-subject="{key}"]')
    assert (audit.get_attribute("data-operator"), audit.get_attribute("data-action")) == ("alice", "settle:not-sent")
    assert audit.get_attribute("data-result") == "done"
    shot(d, "audit")
    d.get(f"{base}/policy")
    shot(d, "policy")

    # a form sent without its CSRF token is refused (403) and moves nothing
    failed = served["failed"]
    d.get(f"{base}/intents/{failed}")
    d.execute_script("document.querySelectorAll('#act-park input[name=csrf]').forEach(e => e.remove())")
    d.find_element(By.CSS_SELECTOR, "#act-park input[name=reason]").send_keys("no token")
    navigate(d, d.find_element(By.CSS_SELECTOR, "#act-park button"))
    assert "CSRF" in d.find_element(By.TAG_NAME, "body").text
    assert store.get(failed).state == "failed"
    cookie = {c["name"]: c["value"] for c in d.get_cookies()}
    r = httpx.post(f"{base}/intents/{failed}/park", data={"reason": "x"}, cookies=cookie)
    assert r.status_code == 403

    # without a session: the pages send the browser to sign in, and an action is 401
    d.delete_all_cookies()
    d.get(f"{base}/intents/{failed}")
    assert "/login" in d.current_url
    r = httpx.post(f"{base}/intents/{failed}/park", data={"reason": "x", "csrf": "guess"})
    assert r.status_code == 401
    assert store.get(failed).state == "failed"
