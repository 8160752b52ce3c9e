"""The AMQP 1.0 frontend (python-qpid-proton engine behind a Twisted protocol)."""
