"""Principals and their credentials, stored only as salted hashes or public keys.

* ticket: ``pbkdf2-sha256$<iterations>$<salt b64>$<hash b64>`` of the secret;
* wampcra (salted WAMP-CRA): ``{"salt", "iterations", "keylen", "key"}`` where ``key`` is
  the base64 PBKDF2-SHA256 key derived from the secret (what autobahn's
  ``auth.derive_key`` computes); the router signs challenges with it, never with the secret;
* cryptosign: ``{"pubkeys": [hex Ed25519 public keys]}``.

A ticket may also be a hash imported from a Mosquitto password file, verified as it is so
users keep their passwords: ``$7$<iterations>$<salt b64>$<hash b64>`` (PBKDF2-HMAC-SHA512,
Mosquitto 2's default) or ``$6$<salt b64>$<hash b64>`` (SHA-512 of password + salt,
Mosquitto 1.6 and earlier).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from dataclasses import dataclass, field

SCHEME = "pbkdf2-sha256"
DEFAULT_ITERATIONS = 200_000
WAMPCRA_ITERATIONS = 100_000
WAMPCRA_KEYLEN = 32
METHODS = ("ticket", "wampcra", "cryptosign")
MOSQUITTO_HASHES = ("$7$", "$6$")
"""How the hashes of a Mosquitto password file start (PBKDF2-SHA512, salted SHA-512)."""


@dataclass(frozen=True)
class WampCra:
    """Salted WAMP-CRA: the PBKDF2 parameters and the derived key (base64 text)."""

    salt: str
    iterations: int
    keylen: int
    key: str

    def as_json(self) -> dict[str, str | int]:
        """The form the realm files keep, so salted WAMP-CRA secrets survive a rewrite of the
        file."""
        return {"salt": self.salt, "iterations": self.iterations, "keylen": self.keylen,
                "key": self.key}


@dataclass(frozen=True)
class Principal:
    """A known user of a realm: authid, role and the credentials of each method it has."""

    authid: str
    role: str
    ticket_hash: str | None = None
    wampcra: WampCra | None = None
    cryptosign_pubkeys: tuple[str, ...] = field(default_factory=tuple)

    def methods(self) -> list[str]:
        """The authentication methods this principal can use (TLS client certs aside)."""
        return [name for name, present in (("ticket", self.ticket_hash),
                                           ("wampcra", self.wampcra),
                                           ("cryptosign", self.cryptosign_pubkeys)) if present]


def secret_problem(secret: str) -> str | None:
    """Why a secret may not be stored, or None. A NUL byte is refused: PBKDF2's HMAC pads a
    short key with zero bytes, so ``s`` and ``s\\0`` would derive the same hash."""
    if not secret:
        return "an empty secret is not allowed"
    if "\0" in secret:
        return "a secret may not contain NUL bytes"
    return None


def hash_secret(secret: str, iterations: int = DEFAULT_ITERATIONS) -> str:
    """``pbkdf2-sha256$<iterations>$<salt b64>$<hash b64>`` for storing in a realm file."""
    salt = secrets.token_bytes(16)
    digest = hashlib.pbkdf2_hmac("sha256", secret.encode("utf-8"), salt, iterations)
    return "$".join((SCHEME, str(iterations), base64.b64encode(salt).decode(),
                     base64.b64encode(digest).decode()))


def verify_secret(secret: str, stored: str) -> bool:
    """Constant-time check of ``secret`` against a stored hash; malformed hashes never match,
    nor does a secret with a NUL byte (which PBKDF2 would take for the secret without its
    trailing NULs)."""
    if "\0" in secret:
        return False
    if stored.startswith(MOSQUITTO_HASHES):
        return verify_mosquitto(secret, stored)
    try:
        scheme, iterations, salt, digest = stored.split("$")
        if scheme != SCHEME:
            return False
        expected = base64.b64decode(digest)
        actual = hashlib.pbkdf2_hmac("sha256", secret.encode("utf-8"), base64.b64decode(salt),
                                     int(iterations))
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(expected, actual)


def verify_mosquitto(secret: str, stored: str) -> bool:
    """Constant-time check of ``secret`` against a Mosquitto ``$7$`` or ``$6$`` hash (the
    salt is the decoded bytes, as mosquitto_passwd uses it); malformed hashes never match."""
    try:
        fields = stored.split("$")
        if fields[1] == "7" and len(fields) == 5:
            expected = base64.b64decode(fields[4], validate=True)
            if not expected:
                return False
            actual = hashlib.pbkdf2_hmac("sha512", secret.encode("utf-8"),
                                         base64.b64decode(fields[3], validate=True),
                                         int(fields[2]), len(expected))
        elif fields[1] == "6" and len(fields) == 4:
            expected = base64.b64decode(fields[3], validate=True)
            actual = hashlib.sha512(secret.encode("utf-8")
                                    + base64.b64decode(fields[2], validate=True)).digest()
        else:
            return False
    except (ValueError, TypeError, OverflowError):
        return False
    return hmac.compare_digest(expected, actual)


def derive_wampcra(secret: str, iterations: int = WAMPCRA_ITERATIONS,
                   keylen: int = WAMPCRA_KEYLEN, salt: str | None = None) -> WampCra:
    """The stored form of a WAMP-CRA secret: a random salt and the PBKDF2-derived key."""
    salt = salt if salt is not None else secrets.token_hex(16)
    key = hashlib.pbkdf2_hmac("sha256", secret.encode("utf-8"), salt.encode("utf-8"),
                              iterations, keylen)
    return WampCra(salt, iterations, keylen, base64.b64encode(key).decode("ascii"))


def wampcra_signature(key: str, challenge: str) -> str:
    """base64 HMAC-SHA256 of the challenge, keyed with the base64 text of the derived key
    (exactly what ``autobahn.wamp.auth.compute_wcs`` computes on the client)."""
    digest = hmac.new(key.encode("ascii"), challenge.encode("utf-8"), hashlib.sha256).digest()
    return base64.b64encode(digest).decode("ascii")


def verify_wampcra(cra: WampCra, challenge: str, signature: str) -> bool:
    """Is ``signature`` the client's proof of the key for ``challenge``? Compared in constant
    time, so timing does not leak the expected value."""
    expected = wampcra_signature(cra.key, challenge)
    return hmac.compare_digest(expected.encode("ascii"),
                               signature.strip().encode("utf-8", "replace"))


def normalize_pubkey(text: str) -> str | None:
    """The lower-case hex of a 32-byte Ed25519 public key, or None if it is not one."""
    text = text.strip().lower()
    try:
        raw = binascii.unhexlify(text)
    except (binascii.Error, ValueError):
        return None
    return text if len(raw) == 32 else None


def verify_cryptosign(pubkey_hex: str, challenge_hex: str, signature_hex: str) -> bool:
    """Check autobahn's cryptosign answer: hex of 64-byte signature + the 32-byte challenge."""
    from nacl.exceptions import BadSignatureError
    from nacl.signing import VerifyKey

    try:
        signed = binascii.unhexlify(signature_hex)
        challenge = binascii.unhexlify(challenge_hex)
        if len(signed) != 96 or not hmac.compare_digest(signed[64:], challenge):
            return False
        VerifyKey(binascii.unhexlify(pubkey_hex)).verify(signed)
    except (BadSignatureError, binascii.Error, ValueError, TypeError):
        return False
    return True
