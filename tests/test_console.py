"""The operator console at /console, in headless Debian chromium driven by selenium, against a
real router with real MQTT (paho) and WAMP (autobahn) clients; what the page shows is checked
against the REST API and an MQTT subscriber."""

from __future__ import annotations

import base64
import http.client
import json
import urllib.error
import urllib.request

import pytest

from tests.console_browser import (SECRETS, WAIT, BackgroundWamp, chromium, console_router,
                                   log_in, script_errors, wait_until)
from tests.test_cli import router_cli

from selenium.common.exceptions import StaleElementReferenceException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support import expected_conditions as seen  # noqa: E402

OPERATOR = ("op", SECRETS["op"])


@pytest.fixture
def router(tmp_path):
    """A router per test (its session counts are the test's own); conftest's ``mqtt`` pool
    connects to it."""
    process = console_router(tmp_path)
    yield process
    process.stop()


@pytest.fixture(scope="module")
def browser():
    with chromium() as driver:
        yield driver


@pytest.fixture
def page(browser, router):
    """The browser, with the console's login forgotten between tests; no test may leave
    an uncaught script error behind."""
    script_errors(browser)
    yield browser
    browser.execute_script("sessionStorage.clear()")
    assert script_errors(browser) == []


def console_url(router) -> str:
    return router.urls["http"] + "console/"


def api(router, method: str, path: str, auth: tuple[str, str] | None = OPERATOR):
    """(status, JSON body) of one REST request."""
    request = urllib.request.Request(router.urls["http"] + path, method=method)
    if auth:
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=WAIT) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def shown(driver, element_id: str, text: str) -> None:
    wait_until(driver, seen.text_to_be_present_in_element((By.ID, element_id), text),
               f"#{element_id} never showed {text!r}; it shows "
               f"{driver.find_element(By.ID, element_id).text!r}, error box: "
               f"{driver.find_element(By.ID, 'error').text!r}")


def protocol_count(driver, protocol: str) -> str:
    found = driver.find_elements(By.CSS_SELECTOR, f"#protocol-counts li[data-protocol={protocol}] b")
    return found[0].text if found else ""


def retained_row(driver, topic: str):
    return driver.find_elements(By.CSS_SELECTOR, f'#retained-rows tr[data-topic="{topic}"]')


def click_in_row(driver, topic: str, button: str) -> None:
    """Click ``button`` in the retained row of ``topic``, found again if a listing answered
    meanwhile replaced the rows (the one the console loads on entering may answer after
    the test's own)."""
    def clicked(d) -> bool:
        try:
            retained_row(d, topic)[0].find_element(
                By.XPATH, f".//button[text()='{button}']").click()
        except (IndexError, StaleElementReferenceException):
            return False
        return True
    wait_until(driver, clicked, f"no {button} button for {topic}")


def show_retained(driver, mode: str, pattern: str) -> None:
    driver.find_element(By.CSS_SELECTOR, f'#retained-mode option[value="{mode}"]').click()
    field = driver.find_element(By.ID, "retained-pattern")
    field.clear()
    field.send_keys(pattern)
    driver.find_element(By.CSS_SELECTOR, "#retained-form button[type=submit]").click()


def test_operator_sees_the_real_session_count_and_deletes_a_retained_topic(page, router, mqtt):
    publisher, _listener = mqtt(), mqtt()
    wamp = BackgroundWamp(router)
    try:
        publisher.publish("home/kitchen/temp", json.dumps({"celsius": 21.5}).encode(), qos=1,
                          retain=True)
        publisher.publish("home/door", b"closed", qos=1, retain=True)
        publisher.publish("home/camera", bytes(range(0, 256, 7)), qos=1, retain=True)
        status, sessions = api(router, "GET", "sessions")
        assert status == 200 and sessions["total"] == 3, sessions
        assert sessions["by_protocol"] == {"mqtt": 2, "wamp": 1}

        log_in(page, console_url(router), *OPERATOR)
        shown(page, "session-count", "3")
        wait_until(page, lambda d: protocol_count(d, "mqtt") == "2"
                   and protocol_count(d, "wamp") == "1", "per-protocol counts never 2 + 1")
        assert page.find_element(By.ID, "identity").text == "as op"

        show_retained(page, "filter", "home/#")
        wait_until(page, lambda d: len(d.find_elements(By.CSS_SELECTOR,
                                                       "#retained-rows tr[data-topic]")) == 3,
                   "the retained browser never listed the 3 home/# topics")
        click_in_row(page, "home.kitchen.temp", "View")
        shown(page, "retained-view-body", '"celsius": 21.5')
        click_in_row(page, "home.camera", "View")
        shown(page, "retained-view-body", "000000  00 07 0e 15")
        shown(page, "retained-view-kind", "binary, 37 bytes")
        click_in_row(page, "home.door", "View")
        shown(page, "retained-view-body", "closed")
        shown(page, "retained-view-kind", "text")

        click_in_row(page, "home.door", "Delete")
        wait_until(page, seen.alert_is_present(), "no confirmation asked").accept()
        wait_until(page, lambda d: not retained_row(d, "home.door"),
                   "home.door is still listed after Delete")
        assert retained_row(page, "home.kitchen.temp") and retained_row(page, "home.camera")

        status, body = api(router, "GET", "retained/home.door")
        assert status == 404 and body["error"] == "wamp.error.no_such_retained", body
        reader = mqtt()
        reader.subscribe(("home/#", 1))
        publisher.publish("home/sentinel", b"end", qos=1)
        topics = {message.topic for message in reader.collect_until(b"end")}
        assert topics == {"home/kitchen/temp", "home/camera"}  # and no home/door
    finally:
        wamp.close()


def test_operator_kicks_a_session(page, router, mqtt):
    mqtt()
    wamp = BackgroundWamp(router)
    try:
        log_in(page, console_url(router), *OPERATOR)
        shown(page, "session-count", "2")
        row = f'#session-rows tr[data-session="{wamp.session.session_id}"]'
        wait_until(page, seen.presence_of_element_located((By.CSS_SELECTOR, row)),
                   "the WAMP session has no row")
        page.find_element(By.CSS_SELECTOR, row + " button").click()
        wait_until(page, seen.alert_is_present(), "no confirmation asked").accept()
        wamp.wait_disconnected()
        shown(page, "session-count", "1")
        assert api(router, "GET", "sessions")[1]["total"] == 1
    finally:
        wamp.close()


def test_wrong_ticket_is_refused_with_401(page, router):
    log_in(page, console_url(router), "op", "not-the-ticket")
    shown(page, "error", "401")
    assert page.find_element(By.ID, "login").is_displayed()
    assert not page.find_element(By.ID, "console").is_displayed()


def test_a_role_without_operator_rights_sees_403(page, router, mqtt):
    publisher = mqtt()
    publisher.publish("home/door", b"open", qos=1, retain=True)
    log_in(page, console_url(router), "viewer", SECRETS["viewer"])
    shown(page, "error", "403")
    assert "viewer may not" in page.find_element(By.ID, "error").text
    # what the role may do still works: reading retained events
    show_retained(page, "prefix", "home")
    wait_until(page, lambda d: retained_row(d, "home.door"), "home.door not listed for viewer")
    click_in_row(page, "home.door", "Delete")
    wait_until(page, seen.alert_is_present(), "no confirmation asked").accept()
    shown(page, "error", "403")
    assert api(router, "GET", "retained/home.door")[0] == 200


def test_anonymous_login_where_the_realm_allows_it(page, router, mqtt):
    mqtt()
    log_in(page, console_url(router), None)
    wait_until(page, seen.visibility_of_element_located((By.ID, "console")),
               "the console is not shown to anonymous")
    shown(page, "session-count", "1")
    # the shipped-like anonymous role may not read the router's figures: said, not hidden
    shown(page, "error", "403")
    assert page.find_element(By.ID, "identity").text == "anonymous"


def test_fits_a_phone_screen(router, mqtt):
    mqtt()
    with chromium(390, 844) as phone:
        log_in(phone, console_url(router), *OPERATOR)
        shown(phone, "session-count", "1")
        overflow = phone.execute_script(
            "return document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 0, f"the page is {overflow}px wider than a phone screen"
        columns = phone.execute_script(
            "return getComputedStyle(document.querySelector('main'))"
            ".gridTemplateColumns.split(' ').length")
        assert columns == 1


def test_console_files_are_served_with_their_types(router):
    host, port = router.urls["http"].split("//", 1)[1].rstrip("/").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=WAIT)
    try:
        connection.request("GET", "/console")
        response = connection.getresponse()
        response.read()
        assert response.status in (301, 302) and response.getheader("Location") == "console/"
        for path, content_type in (("/console/", "text/html"),
                                   ("/console/console.js", "text/javascript"),
                                   ("/console/console.css", "text/css")):
            connection.request("GET", path)
            response = connection.getresponse()
            body = response.read()
            assert response.status == 200 and body, path
            assert response.getheader("Content-Type").startswith(content_type), path
            assert "default-src 'self'" in response.getheader("Content-Security-Policy")
        connection.request("GET", "/console/nothing.js")
        response = connection.getresponse()
        response.read()
        assert response.status == 404
    finally:
        connection.close()


def test_rates_subscriptions_and_incidents_follow_real_traffic(page, router, mqtt):
    subscriber, publisher = mqtt(), mqtt()
    subscriber.subscribe(("plant/#", 0))
    viewer = mqtt(username="viewer", password=SECRETS["viewer"])
    viewer.publish("plant/valve", b"open", qos=1)  # its role may only subscribe: an incident
    log_in(page, console_url(router), *OPERATOR)
    shown(page, "subscription-count", str(api(router, "GET", "subscriptions")[1]["total"]))
    wait_until(page, seen.presence_of_element_located(
        (By.XPATH, "//tbody[@id='subscription-rows']/tr[td[1]='plant/#' and td[3]='1']")),
        "the plant/# subscription is not listed with its one subscriber")
    wait_until(page, seen.presence_of_element_located(
        (By.XPATH, "//tbody[@id='incident-rows']/tr[td[2]='not_authorized' and td[3]='mqtt']")),
        "the refused publish is not among the recent incidents")

    def rates_shown(driver) -> bool:
        publisher.client.publish("plant/flow", b"1", qos=0)  # traffic while the page polls
        text = driver.find_element(By.ID, "rate-now").text  # "now 12 in / 12 out"
        return text.startswith("now ") and not text.startswith("now 0 in")
    wait_until(page, rates_shown, "the rate chart never showed messages coming in")
    painted = page.execute_script(
        "const c = document.getElementById('rate-chart');"
        "const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;"
        "let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i]) n++; return n")
    assert painted > 0, "the chart canvas is blank"


def test_retained_browser_pages(page, router, mqtt):
    publisher = mqtt()
    for n in range(55):
        publisher.publish(f"paged/t{n:02d}", str(n), qos=1, retain=True)
    log_in(page, console_url(router), *OPERATOR)
    show_retained(page, "prefix", "paged")
    rows = "#retained-rows tr[data-topic]"
    wait_until(page, lambda d: len(d.find_elements(By.CSS_SELECTOR, rows)) == 50,
               "the first page does not hold 50 topics")
    shown(page, "retained-count", "50+")
    wait_until(page, seen.element_to_be_clickable((By.ID, "retained-more")),
               "More is not offered after the first page")
    page.find_element(By.ID, "retained-more").click()
    wait_until(page, lambda d: len(d.find_elements(By.CSS_SELECTOR, rows)) == 55,
               "More did not add the last 5 topics")
    shown(page, "retained-count", "55")
    assert not page.find_element(By.ID, "retained-more").is_displayed()
    topics = [row.get_attribute("data-topic") for row in page.find_elements(By.CSS_SELECTOR, rows)]
    assert topics == [f"paged.t{n:02d}" for n in range(55)]


def test_a_token_logs_in_and_its_revocation_logs_out(page, router):
    def token_cli(*args: str):
        return router_cli("token", *args, "--config", str(router.config_path), timeout=60)

    created = token_cli("create", "--realm", "realm1", "--principal", "op")
    assert created.returncode == 0, created.stderr
    token = created.stdout.strip()
    page.get(console_url(router))
    wait_until(page, seen.visibility_of_element_located((By.ID, "login")), "no login form")
    page.find_element(By.ID, "login-token").send_keys(token)
    # the router reads the token file again within 2 s: until then the login is refused
    # and the form stays, so submit until the console opens
    def logged_in(driver) -> bool:
        if driver.find_element(By.ID, "console").is_displayed():
            return True
        driver.find_element(By.ID, "login-submit").click()
        return False
    wait_until(page, logged_in, "the token never logged in")
    assert page.find_element(By.ID, "identity").text == "as token"
    shown(page, "session-count", "0")

    token_id = token_cli("list").stdout.splitlines()[1].split()[0]
    assert token_cli("revoke", "--id", token_id).returncode == 0
    wait_until(page, seen.visibility_of_element_located((By.ID, "login")),
               "the console stayed open with a revoked token")
    assert "no longer accepts these credentials (401" in page.find_element(By.ID, "error").text
    assert not page.find_element(By.ID, "console").is_displayed()
