"""Reading the router's Prometheus endpoint the way a scraper does, for the tests."""

from __future__ import annotations

import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

Sample = tuple[str, frozenset]


def fetch(router, path: str | None = None, headers: dict | None = None) -> tuple[int, str]:
    """(status, body) of a GET on the router's metrics listener."""
    url = router.urls["metrics"]
    if path is not None:
        url = url.rsplit("/", 1)[0] + path
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def scrape(router, headers: dict | None = None) -> dict[Sample, float]:
    status, text = fetch(router, headers=headers)
    assert status == 200, text
    return {(sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def value(samples: dict[Sample, float], name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def delta(before: dict, after: dict, name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


def check_byte_counts(router, client, **login) -> None:
    """An MQTT client's CONNECT (``login``) and PINGREQ, answered: the router's byte
    counters moved by exactly what ``client`` (a tests.mqtt_clients.RawMqtt) wrote and read."""
    before = scrape(router)
    try:
        client.connect_and_ping(f"bytes-{id(client)}", **login)
        after = scrape(router)
    finally:
        client.close()
    assert client.bytes_received > 0
    assert delta(before, after, "router_received_bytes_total", protocol="mqtt") == \
        client.bytes_sent
    assert delta(before, after, "router_sent_bytes_total", protocol="mqtt") == \
        client.bytes_received
