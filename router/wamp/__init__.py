"""The WAMP frontend: WebSocket and RawSocket transports, JSON/MsgPack/CBOR."""
