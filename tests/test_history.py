"""Event history: wamp.subscription.get_events with limits and eligibility."""

from __future__ import annotations

import pytest
from autobahn.wamp.exception import ApplicationError
from autobahn.wamp.types import PublishOptions

from tests.clients import connect, run
from tests.harness import RouterProcess
from tests.retention_helpers import SECRETS, retention_realm


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    realm = retention_realm(history=[{"uri": "com.hist.", "match": "prefix", "limit": 3}])
    process = RouterProcess(tmp_path_factory.mktemp("history"), [realm]).start()
    yield process
    process.stop()


async def noop(*args, **kwargs):
    return None


def test_get_events_returns_the_latest_events_up_to_the_limit(router):
    async def scenario():
        publisher = await connect(router)
        for n in range(5):
            await publisher.publish("com.hist.a", n, options=PublishOptions(acknowledge=True))
        reader = await connect(router, "rawsocket", "msgpack")
        subscription = await reader.subscribe(noop, "com.hist.a")
        events = await reader.call("wamp.subscription.get_events", subscription.id)
        assert [e["args"] for e in events] == [[2], [3], [4]]
        assert all(e["subscription"] == subscription.id and e["details"]["topic"] == "com.hist.a"
                   and e["timestamp"].endswith("Z") for e in events)
        latest = await reader.call("wamp.subscription.get_events", subscription.id, limit=2,
                                   reverse=True)
        assert [e["args"] for e in latest] == [[4], [3]]
        await reader.close()
        await publisher.close()

    run(scenario())


def test_history_is_filtered_by_the_callers_eligibility(router):
    async def scenario():
        publisher = await connect(router)
        await publisher.publish("com.hist.elig", "for all", options=PublishOptions(acknowledge=True))
        await publisher.publish("com.hist.elig", "alpha only",
                                options=PublishOptions(acknowledge=True,
                                                       eligible_authrole=["alpha"]))
        await publisher.publish("com.hist.elig", "not bob",
                                options=PublishOptions(acknowledge=True, exclude_authid=["bob"]))
        await publisher.publish("com.hist.elig", "one session",
                                options=PublishOptions(acknowledge=True, eligible=[1]))
        seen = {}
        for who in ("alice", "bob"):
            client = await connect(router, authid=who, ticket=SECRETS[who])
            subscription = await client.subscribe(noop, "com.hist.elig")
            events = await client.call("wamp.subscription.get_events", subscription.id)
            seen[who] = [e["args"][0] for e in events]
            await client.close()
        assert seen == {"alice": ["for all", "alpha only", "not bob"], "bob": ["for all"]}
        await publisher.close()

    run(scenario())


def test_pattern_subscription_history_and_unknown_subscription(router):
    async def scenario():
        publisher = await connect(router)
        await publisher.publish("com.hist.p.one", 1, options=PublishOptions(acknowledge=True))
        await publisher.publish("com.hist.p.two", 2, options=PublishOptions(acknowledge=True))
        await publisher.publish("com.nohist.p", 3, options=PublishOptions(acknowledge=True))
        reader = await connect(router)
        from autobahn.wamp.types import SubscribeOptions
        subscription = await reader.subscribe(noop, "com.hist.p.",
                                              options=SubscribeOptions(match="prefix"))
        events = await reader.call("wamp.subscription.get_events", subscription.id)
        assert [(e["details"]["topic"], e["args"]) for e in events] == [
            ("com.hist.p.one", [1]), ("com.hist.p.two", [2])]
        with pytest.raises(ApplicationError) as error:
            await reader.call("wamp.subscription.get_events", 987654321)
        assert error.value.error == "wamp.error.no_such_subscription"
        await reader.close()
        await publisher.close()

    run(scenario())
