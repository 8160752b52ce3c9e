"""WAMP Payload Passthru Mode (AP) on the wire: reading it from PUBLISH, CALL, YIELD and
ERROR, writing it into EVENT, INVOCATION, RESULT and ERROR.

Two dialects reach the router. The spec's: ``ppt_scheme`` (and ``ppt_serializer``,
``ppt_cipher``, ``ppt_keyid``) in the options and the payload as the one binary item of
Arguments, announced as ``payload_passthru_mode``. autobahn's older one, which its
cryptobox ``KeyRing`` speaks: ``enc_algo`` (and ``enc_key``, ``enc_serializer``) and the
payload as the message's last element itself, announced as ``payload_transparency``. The
options are copied into the receiver's details and the bytes into its message unchanged,
in the dialect they came in; the router never looks inside.

Using either without having announced it in HELLO is a protocol violation (the RFC's
rule); so is a passthru message whose payload is not one binary item.
"""

from __future__ import annotations

from typing import Callable

from router.core.errors import ProtocolViolation
from router.core.model import PPT_KEYS, TRANSPARENCY_KEYS, Passthru

Supports = Callable[[str, str], bool]
"""``session.supports(role, feature)``."""

RAW_SCHEME = "mqtt"
"""The one scheme byte-oriented receivers (MQTT, AMQP) take, and the one a subscription's
``_ppt_scheme`` option may ask for (see :func:`raw_details`)."""


def read(supports: Supports, role: str, options: dict, args: list | None,
         kwargs: dict | None, payload: bytes | str | None,
         what: str) -> tuple[Passthru, list]:
    """The passthru of a message that has ``ppt_scheme`` in its options or autobahn's
    ``payload`` (its parse of the transparency dialect's bare element), and its Arguments
    (``[payload]``); ``what`` names the message for the violation's text."""
    if payload is not None:
        return _transparency(supports, role, options, payload, what), [payload]
    if not supports(role, "payload_passthru_mode"):
        raise ProtocolViolation(f"{what} uses payload passthru mode, which the session did "
                                f"not announce for its {role} role")
    passthru = Passthru({key: options[key] for key in PPT_KEYS if key in options})
    for key, value in passthru.options.items():
        if type(value) is not str or (key == "ppt_scheme" and not value):
            raise ProtocolViolation(f"option '{key}' of {what} must be a non-empty string")
    if (args is None or type(args) is not list or len(args) != 1
            or type(args[0]) is not bytes or kwargs):
        raise ProtocolViolation(f"a passthru {what} carries its payload as the one binary "
                                "item of Arguments, without ArgumentsKw")
    return passthru, args


def _transparency(supports: Supports, role: str, options: dict, payload: bytes | str,
                  what: str) -> Passthru:
    if not supports(role, "payload_transparency"):
        raise ProtocolViolation(f"{what} uses payload transparency, which the session did "
                                f"not announce for its {role} role")
    if type(payload) is not bytes or type(options.get("enc_algo")) is not str:
        raise ProtocolViolation(f"a transparent {what} needs 'enc_algo' and a binary payload")
    return Passthru({key: options[key] for key in TRANSPARENCY_KEYS if key in options},
                    transparency=True)


def write(raw: list, details: dict, passthru: Passthru, args: list) -> list:
    """``raw`` (ending with ``details``) completed with the passthru options and payload."""
    details.update(passthru.options)
    raw.append(args[0] if passthru.transparency else args)
    return raw


def raw_details(details: dict, publisher_protocol: str | None,
                properties: dict | None) -> dict:
    """The details of an EVENT that gives a byte publication (MQTT payload, AMQP data body)
    to a subscription that asked for ``_ppt_scheme: "mqtt"``: ``ppt_serializer`` says
    where the bytes come from, ``_mqtt_properties`` carries the MQTT 5 properties (or
    the AMQP properties mapped to them)."""
    details["ppt_scheme"] = RAW_SCHEME
    details["ppt_serializer"] = ("amqp" if publisher_protocol is not None
                                 and publisher_protocol.startswith("amqp") else "mqtt")
    if properties:
        shown = {key: [list(pair) for pair in value] if key == "user_property" else value
                 for key, value in properties.items() if key in _SHOWN_PROPERTIES}
        if shown:
            details["_mqtt_properties"] = shown
    return details


_SHOWN_PROPERTIES = ("payload_format_indicator", "content_type", "response_topic",
                     "correlation_data", "user_property")
"""The MQTT 5 properties of a message (not of its hop: no topic alias or expiry interval,
which the EVENT does not need)."""
