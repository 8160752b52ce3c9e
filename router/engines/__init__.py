"""The engines: where a realm's state beyond one connection lives, behind the contract of
:mod:`router.core.engine`.

* :mod:`router.engines.embedded`: one node; retained events in memory written behind to
  SQLite (WAL) by one background thread with group commit, MQTT sessions and AMQP durable
  links in the same file.
* :mod:`router.engines.redis`: many nodes serve the same realms; Redis is the only shared
  part (retained events, history, sessions, links, registrations, node failure).
* :mod:`router.engines.records`: the stored forms both engines share.

Only :mod:`router.node` picks an engine; the core and the frontends see the contract.
"""
