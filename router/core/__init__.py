"""Transport-agnostic router core: realms, broker, dealer, authorization.

Nothing in this package knows about sockets, reactors or wire formats; the
frontends in ``router.wamp`` (and later MQTT/AMQP) translate to and from it.
"""
