"""MQTT bridges: the router as an MQTT client of another broker, forwarding topics both ways.

Start at :mod:`router.bridge.bridge`; the wire side is :mod:`router.bridge.client`.
"""
