from tests.clients import COMBINATIONS, connect, next_item, run
import pytest


@pytest.mark.parametrize("transport,serializer", COMBINATIONS)
def test_publish_reaches_subscriber(router, transport, serializer):
    async def scenario():
        sub = await connect(router, transport, serializer)
        pub = await connect(router, transport, serializer)
        events = await sub.events("com.example.smoke")
        await pub.publish("com.example.smoke", 1, "two", key="value",
                          options=__import__("autobahn").wamp.types.PublishOptions(acknowledge=True))
        args, kwargs, details = await next_item(events)
        assert args == [1, "two"] and kwargs == {"key": "value"}
        await pub.close()
        await sub.close()

    run(scenario())
