"""Raw-wire helpers for the retention and history tests."""

from __future__ import annotations

from router.core.credentials import hash_secret
from tests.clients import RawClient, raw_connect
from tests.harness import OPEN_ROLE

SUBSCRIBED, EVENT, PUBLISHED, ERROR, RESULT = 33, 36, 17, 8, 50

SECRETS = {"alice": "alice-secret", "bob": "bob-secret", "carol": "carol-secret",
           "op": "operator-secret"}


def retention_realm(name: str = "realm1", **extra) -> dict:
    """Anonymous may do anything; alice/carol are 'alpha', bob is 'beta', op may administer."""
    principals = {
        "alice": {"role": "alpha", "ticket": hash_secret(SECRETS["alice"], 1000)},
        "bob": {"role": "beta", "ticket": hash_secret(SECRETS["bob"], 1000)},
        "carol": {"role": "alpha", "ticket": hash_secret(SECRETS["carol"], 1000)},
        "op": {"role": "operator", "ticket": hash_secret(SECRETS["op"], 1000)},
    }
    roles = {
        "anonymous": OPEN_ROLE,
        "alpha": OPEN_ROLE,
        "beta": OPEN_ROLE,
        "operator": OPEN_ROLE + [{"uri": "wamp.retained.", "match": "prefix", "allow": ["call"]}],
    }
    realm = {"name": name, "anonymous_role": "anonymous", "roles": roles,
             "principals": principals}
    realm.update(extra)
    return realm


async def joined(router, transport: str = "rawsocket", serializer: str = "json",
                 authid: str | None = None, realm: str = "realm1") -> RawClient:
    """A raw client that has joined (with a ticket when ``authid`` is given)."""
    client = await raw_connect(router, transport, serializer)
    roles = {"publisher": {"features": {}}, "subscriber": {"features": {}},
             "caller": {"features": {}}, "callee": {"features": {}}}
    details = {"roles": roles}
    if authid:
        details.update(authmethods=["ticket"], authid=authid)
    welcome = await client.hello(realm, details)
    if welcome[0] == 4:
        client.send([5, SECRETS[authid], {}])
        welcome = await client.recv()
    assert welcome[0] == 2, welcome
    client.session_id = welcome[1]
    return client


async def publish(client: RawClient, topic: str, args=None, kwargs=None, **options) -> int:
    """Acknowledged publish; returns the publication id."""
    request = client.next_request()
    message = [16, request, dict(options, acknowledge=True), topic]
    if args is not None or kwargs is not None:
        message.append(args or [])
    if kwargs is not None:
        message.append(kwargs)
    client.send(message)
    reply = await client.recv()
    assert reply[:2] == [PUBLISHED, request], reply
    return reply[2]


async def subscribe(client: RawClient, topic: str, **options) -> int:
    """Subscribe and return the subscription id (SUBSCRIBED must be the next message)."""
    request = client.next_request()
    client.send([32, request, options, topic])
    reply = await client.recv()
    assert reply[:2] == [SUBSCRIBED, request], reply
    return reply[2]


async def retained_after_subscribe(router, client: RawClient, topic: str, sentinel_topic: str,
                                   **options) -> list[list]:
    """Subscribe ``client`` and collect the EVENTs that arrive before a live sentinel.

    The router sends retained events right after SUBSCRIBED and before any live
    event, so everything ahead of the sentinel (``sentinel_topic`` must match the
    subscription) is retained delivery.
    """
    await subscribe(client, topic, **options)
    marker = await joined(router)
    sentinel_id = await publish(marker, sentinel_topic, ["sentinel"])
    events = []
    while True:
        message = await client.recv()
        assert message[0] == EVENT, message
        if message[2] == sentinel_id:
            break
        events.append(message)
    marker.close()
    return events


async def call(client: RawClient, procedure: str, args=None, kwargs=None) -> list:
    request = client.next_request()
    message = [48, request, {}, procedure, args or []]
    if kwargs:
        message.append(kwargs)
    client.send(message)
    reply = await client.recv()
    assert reply[0] in (RESULT, ERROR) and reply[1 if reply[0] == RESULT else 2] == request, reply
    return reply
