"""Principals and their secrets, stored only as salted PBKDF2-SHA256 hashes."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from dataclasses import dataclass

SCHEME = "pbkdf2-sha256"
DEFAULT_ITERATIONS = 200_000


@dataclass(frozen=True)
class Principal:
    """A known user of a realm: authid, role and (optionally) a hashed ticket."""

    authid: str
    role: str
    ticket_hash: str | None = None


def hash_secret(secret: str, iterations: int = DEFAULT_ITERATIONS) -> str:
    """``pbkdf2-sha256$<iterations>$<salt b64>$<hash b64>`` for storing in a realm file."""
    salt = secrets.token_bytes(16)
    digest = hashlib.pbkdf2_hmac("sha256", secret.encode("utf-8"), salt, iterations)
    return "$".join((SCHEME, str(iterations), base64.b64encode(salt).decode(),
                     base64.b64encode(digest).decode()))


def verify_secret(secret: str, stored: str) -> bool:
    """Constant-time check of ``secret`` against a stored hash; malformed hashes never match."""
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
