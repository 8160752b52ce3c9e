"""Prometheus metrics (see docs/metrics.md): the node's figures as metric families
(:mod:`.collector`) and the ``metrics`` listener that serves them (:mod:`.http`). The
figures clients read (MQTT ``$SYS`` topics, ``wamp.router.stats``) are :mod:`router.sysinfo`'s."""
