"""TLS for listeners: the server context from PEM files, and the verified client's CN; and
running without pyOpenSSL when the configuration asks for no TLS at all.

Twisted imports pyOpenSSL (and with it most of ``cryptography``) whenever it is installed,
from its TCP module, for ``startTLS``: about 5 MB of an idle router that never uses it
(bench/RESULTS.md). A router whose listeners, webhooks and bridges need no TLS
(:func:`needs_tls`) marks it as not importable before the reactor is imported
(:func:`leave_out_tls`); Twisted then builds its TCP transports without TLS support. What
needs TLS imports Twisted's TLS module where it builds a context (here, the bridge
client, the webhook client), never at module level, so a router without TLS still loads
them. A reload cannot add TLS (listeners, webhooks and bridges need a restart).
"""

from __future__ import annotations

import sys

from router.config import NodeConfig, TlsConfig

TLS_MODULE = "OpenSSL"
"""What Twisted's TLS is built on; left out of a router that needs no TLS."""


def needs_tls(config: NodeConfig) -> bool:
    """Does anything in ``config`` speak TLS: a listener with a ``tls`` block, an
    ``https://`` webhook, a bridge with a ``tls`` block?"""
    return (any(listener.tls is not None for listener in config.listeners)
            or any(bridge.tls is not None for bridge in config.bridges)
            or any(hook.url.lower().startswith("https:")
                   for realm in config.realms.values() for hook in realm.webhooks))


def leave_out_tls() -> bool:
    """Make pyOpenSSL unimportable in this process, so that the reactor, imported after,
    runs without it; False (nothing done) when it is already imported."""
    if TLS_MODULE in sys.modules:
        return False
    sys.modules[TLS_MODULE] = None  # type: ignore[assignment]  # import raises ImportError
    return True


def server_options(config: TlsConfig):
    """A ``twisted.internet.ssl.CertificateOptions`` for ``reactor.listenSSL``."""
    from twisted.internet import ssl

    cert_pem = config.cert.read_bytes()
    key_pem = config.key.read_bytes()
    chain = pem_blocks(cert_pem)
    private = ssl.PrivateCertificate.loadPEM(chain[0] + b"\n" + key_pem)
    extra = [ssl.Certificate.loadPEM(block).original for block in chain[1:]]
    verify = config.client_certs != "none"
    ca_certs = ([ssl.Certificate.loadPEM(block).original
                 for block in pem_blocks(config.ca.read_bytes())]
                if verify and config.ca is not None else None)
    options = ssl.CertificateOptions(
        privateKey=private.privateKey.original, certificate=private.original,
        extraCertChain=extra or None, verify=verify, caCerts=ca_certs,
        requireCertificate=config.client_certs == "required",
        raiseMinimumTo=ssl.TLSVersion.TLSv1_2)
    if verify:
        # tell clients which CAs we accept (some only send a certificate that matches)
        context = options.getContext()
        for cert in ca_certs or ():
            context.add_client_ca(cert)
    return options


def pem_blocks(data: bytes) -> list[bytes]:
    end = b"-----END CERTIFICATE-----"
    blocks = []
    for part in data.split(end):
        start = part.find(b"-----BEGIN CERTIFICATE-----")
        if start >= 0:
            blocks.append(part[start:] + end + b"\n")
    return blocks


def peer_common_name(transport) -> str | None:
    """The subject CN of the client certificate a TLS transport verified, else None.

    The listener verifies every certificate a client presents against its CA (a bad
    one fails the handshake), so a certificate seen here has been verified.
    """
    getter = getattr(transport, "getPeerCertificate", None)
    if getter is None:
        return None
    try:
        cert = getter()
    except Exception:  # not TLS, or the handshake is not done
        return None
    if cert is None:
        return None
    for key, value in cert.get_subject().get_components():
        if key == b"CN":
            return value.decode("utf-8", "replace")
    return None
