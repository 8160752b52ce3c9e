"""Take docs/console.png: the operator console in headless chromium on a router from this
checkout with some realistic traffic (MQTT and WAMP sessions, an SSE stream, retained
readings, a varying publish rate, two refused publishes as incidents).

    .venv/bin/python docs/console_screenshot.py [--seconds 60] [--output docs/console.png]

Needs Debian's chromium and chromium-driver, and selenium (the test extras), as
tests/test_console.py does.
"""

from __future__ import annotations

import argparse
import contextlib
import base64
import json
import math
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.console_browser import (SECRETS, BackgroundWamp, chromium,  # noqa: E402
                                   console_router, log_in, wait_until)
from tests.mqtt_clients import ClientPool  # noqa: E402

from autobahn.wamp.types import SubscribeOptions  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402

READINGS = {
    "home/kitchen/temp": json.dumps({"celsius": 21.5, "sensor": "bme280", "battery": 0.82}),
    "home/living/humidity": json.dumps({"percent": 43}),
    "home/door": "closed",
    "home/camera/snapshot": bytes([0xFF, 0xD8, 0xFF, 0xE0, 0, 16]) + b"JFIF\0" + bytes(range(40)),
    "factory/line1/status": json.dumps({"state": "running", "rate": 118, "alarms": []}),
    "factory/line2/status": json.dumps({"state": "stopped", "reason": "maintenance"}),
}


def traffic(publisher, stop: threading.Event) -> None:
    """Publish on factory/line1/counter at a rate that rises and falls (a chart worth
    looking at), until ``stop``."""
    started = time.monotonic()
    count = 0
    while not stop.is_set():
        elapsed = time.monotonic() - started
        rate = 60 + 50 * math.sin(elapsed / 8)
        publisher.client.publish("factory/line1/counter", str(count), qos=0)
        count += 1
        stop.wait(1 / rate)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60, help="traffic before the shot")
    parser.add_argument("--output", default=str(ROOT / "docs" / "console.png"))
    args = parser.parse_args()
    router = console_router(Path(tempfile.mkdtemp(prefix="console-shot-")))
    pool = ClientPool(router)
    wamp = []
    stop = threading.Event()
    try:
        publisher = pool(client_id="line1-plc")
        for topic, payload in READINGS.items():
            publisher.publish(topic, payload, qos=1, retain=True)
        for client_id in ("kitchen-sensor", "door-sensor"):
            pool(client_id=client_id).subscribe(("home/#", 1))
        wamp = [BackgroundWamp(router, "websocket"), BackgroundWamp(router, "rawsocket")]
        for session in wamp:
            session.run(_follow_factory(session.session))
        viewer = pool(username="viewer", password=SECRETS["viewer"])
        viewer.publish("home/door", "open", qos=1)  # refused: an incident
        stream = _open_stream(router)
        threading.Thread(target=_drain, args=(stream,), daemon=True).start()
        pusher = threading.Thread(target=traffic, args=(publisher, stop), daemon=True)
        pusher.start()
        with chromium(1280, 1500) as driver:
            log_in(driver, router.urls["http"] + "console/", "op", SECRETS["op"])
            wait_until(driver, lambda d: d.find_element(By.ID, "session-count").text != "–",
                       "no session count")
            time.sleep(args.seconds)  # let the rate chart fill: a picture, not a test
            driver.find_element(By.ID, "retained-pattern").send_keys("home")
            driver.find_element(By.CSS_SELECTOR, "#retained-form button[type=submit]").click()
            wait_until(driver, lambda d: d.find_elements(
                By.CSS_SELECTOR, '#retained-rows tr[data-topic="home.kitchen.temp"]'),
                "retained topics not listed")
            driver.find_element(By.CSS_SELECTOR, '#retained-rows tr[data-topic='
                                '"home.kitchen.temp"] button').click()
            height = driver.execute_script("return document.documentElement.scrollHeight")
            # the whole page in one picture: a viewport as tall as the page (a window
            # cannot grow past the headless screen)
            driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
                "width": 1280, "height": height, "deviceScaleFactor": 1, "mobile": False})
            time.sleep(1)  # one more chart redraw at the new size
            driver.save_screenshot(args.output)
        stream.close()
        print(f"written to {args.output}")
    finally:
        stop.set()
        for session in wamp:
            session.close()
        pool.close()
        router.stop()


async def _follow_factory(session) -> None:
    """A WAMP prefix subscription on factory. (so the subscriptions table has one)."""
    await session.subscribe(lambda *args, **kwargs: None, "factory.",
                            options=SubscribeOptions(match="prefix"))


def _drain(stream) -> None:
    """Read the event stream until it is closed (a reader that keeps up)."""
    with contextlib.suppress(Exception):
        while stream.read1(65536):
            pass


def _open_stream(router):
    """One Server-Sent Events reader (a session of protocol http) on factory/#."""
    request = urllib.request.Request(router.urls["http"] + "subscribe?filter=factory/%23")
    token = base64.b64encode(f"op:{SECRETS['op']}".encode()).decode()
    request.add_header("Authorization", f"Basic {token}")
    return urllib.request.urlopen(request, timeout=30)


if __name__ == "__main__":
    main()
