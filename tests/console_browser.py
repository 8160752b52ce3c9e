"""Helpers for the operator console in a real browser (tests/test_console.py and the
screenshot script docs/console_screenshot.py): a router with an ``http`` listener and an
operator principal, headless Debian chromium driven by chromedriver, and an autobahn
session kept open on its own thread while the browser test runs."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import threading
from pathlib import Path
from typing import Iterator

from router.core.credentials import hash_secret
from tests.clients import Client, connect
from tests.harness import OPEN_ROLE, RouterProcess
from tests.mqtt_clients import listeners

from selenium import webdriver  # noqa: E402  (after tests.clients picked asyncio for txaio)
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support import expected_conditions  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

SECRETS = {"op": "operator-secret", "viewer": "viewer-secret"}
WAIT = 20.0
"""Seconds the browser may take to show something (a loaded 2-core machine)."""

OPERATOR_ROLE = OPEN_ROLE + [
    {"uri": prefix, "match": "prefix", "allow": ["call"]}
    for prefix in ("wamp.router.", "wamp.retained.", "wamp.session.", "wamp.admin.")]
"""Anything outside wamp.*, plus the operator routes: stats, incidents, purge, kick."""

VIEWER_ROLE = [{"uri": "", "match": "prefix", "allow": ["subscribe"]}]
"""May read retained events; no operator route."""


def console_realm(name: str = "realm1") -> dict:
    """Anonymous clients may do anything outside wamp.* (as the shipped realm's), ``op`` is an
    operator, ``viewer`` may only subscribe."""
    return {"name": name, "anonymous_role": "anonymous",
            "roles": {"anonymous": OPEN_ROLE, "operator": OPERATOR_ROLE,
                      "viewer": VIEWER_ROLE},
            "principals": {
                "op": {"role": "operator", "ticket": hash_secret(SECRETS["op"], 1000)},
                "viewer": {"role": "viewer", "ticket": hash_secret(SECRETS["viewer"], 1000)}}}


def console_router(workdir: Path) -> RouterProcess:
    """A started router with WAMP, MQTT and ``http`` listeners on ``realm1``."""
    http = {"type": "http", "host": "127.0.0.1", "port": 0, "realm": "realm1"}
    return RouterProcess(workdir, [console_realm()],
                         listeners=listeners("realm1") + [http]).start()


def browser_missing() -> str | None:
    """Why no browser test can run here, or None."""
    for program, package in (("chromium", "chromium"), ("chromedriver", "chromium-driver")):
        if shutil.which(program) is None:
            return f"{program} not found (Debian package {package}; README command 2 installs it)"
    return None


@contextlib.contextmanager
def chromium(width: int = 1280, height: int = 900) -> Iterator[webdriver.Chrome]:
    """Headless chromium through chromedriver, quit on the way out."""
    missing = browser_missing()
    if missing:
        raise RuntimeError(missing)
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                     "--disable-gpu", f"--window-size={width},{height}"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # see script_errors
    driver = webdriver.Chrome(options=options,
                              service=Service(shutil.which("chromedriver")))
    try:
        yield driver
    finally:
        driver.quit()


def wait_until(driver: webdriver.Chrome, condition, message: str, timeout: float = WAIT):
    return WebDriverWait(driver, timeout, poll_frequency=0.1).until(condition, message)


def script_errors(driver: webdriver.Chrome) -> list[str]:
    """Uncaught exceptions the page's script raised since the last call (the browser's
    console log; a refused fetch is logged too, and is not one)."""
    return [entry["message"] for entry in driver.get_log("browser")
            if "Uncaught" in entry["message"]]


def log_in(driver: webdriver.Chrome, console_url: str, authid: str | None,
           ticket: str | None = None) -> None:
    """Open the console and log in with a principal and ticket (None: anonymously)."""
    driver.get(console_url)
    wait_until(driver, expected_conditions.visibility_of_element_located((By.ID, "login")),
               "the login form is not shown")
    if authid is None:
        driver.find_element(By.ID, "login-anonymous").click()
        return
    driver.find_element(By.ID, "login-authid").send_keys(authid)
    driver.find_element(By.ID, "login-ticket").send_keys(ticket or "")
    driver.find_element(By.ID, "login-submit").click()


class BackgroundWamp:
    """An autobahn session on its own thread and event loop, open until :meth:`close`, so a
    blocking browser test can run meanwhile."""

    def __init__(self, router: RouterProcess, transport: str = "websocket") -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.session: Client = self.run(connect(router, transport))

    def run(self, coroutine, timeout: float = WAIT):
        """Run ``coroutine`` on the session's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def wait_disconnected(self, timeout: float = WAIT) -> None:
        async def disconnected() -> None:
            await asyncio.wait_for(asyncio.shield(self.session.disconnected), timeout)
        self.run(disconnected(), timeout + 1)

    def close(self) -> None:
        try:
            with contextlib.suppress(Exception):
                self.run(self.session.close())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(WAIT)
            self.loop.close()
