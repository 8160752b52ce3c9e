"""The embedded engine: one node, its state in one SQLite file (:mod:`.engine`, :mod:`.sqlite`,
:mod:`.sessions` for MQTT, :mod:`.links` for AMQP)."""
