"""A WAMP router with event retention, built on Twisted and autobahn."""

__version__ = "0.1.0"
