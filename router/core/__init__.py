"""Transport-agnostic router core: realms, broker, dealer, authorization, retention.

Nothing in this package knows about sockets, reactors or wire formats; the frontends
(:mod:`router.wamp`, :mod:`router.mqtt`, :mod:`router.amqp`) translate to and from it
through the contract of :mod:`router.core.peer`, and the engines (:mod:`router.engines`)
implement the Protocols of :mod:`router.core.engine`. Start with :mod:`router.core.realm`.
"""
