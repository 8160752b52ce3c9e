"""Bearer tokens of the ``http`` listener: made by ``python -m router token create``, shown
once, kept only as a SHA-256 hash in ``<data_dir>/http_tokens.json``.

A token is 32 random bytes, so a plain hash is enough to keep it secret at rest (no slow
hash: nobody can guess it). Each token names a realm and one of its principals; the
principal's role decides what the token may do, as for every other login of that
principal, and a token whose principal leaves the realm file stops working.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import time
from dataclasses import asdict, dataclass
from pathlib import Path

TOKENS_FILE = "http_tokens.json"
TOKEN_PREFIX = "wrt_"
RECHECK_INTERVAL = 2.0
"""Seconds between two looks at the file's modification time by a running router: a token
created or revoked by the CLI works, or stops working, within this delay."""


@dataclass(frozen=True)
class TokenRecord:
    """What the file keeps of one token (never the token itself)."""

    id: str
    realm: str
    principal: str
    sha256: str
    created: float


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


class TokenFile:
    """The tokens of one data dir, read again when the file changed."""

    def __init__(self, data_dir: Path, clock=time.monotonic) -> None:
        self.path = data_dir / TOKENS_FILE
        self._clock = clock
        self._records: list[TokenRecord] = []
        self._mtime: float | None = None
        self._checked = float("-inf")

    def records(self) -> list[TokenRecord]:
        """Every token's record, read again if the file changed since the last look (at
        most every ``RECHECK_INTERVAL`` seconds: a ``stat`` and, rarely, a small read)."""
        now = self._clock()
        if now - self._checked >= RECHECK_INTERVAL:
            self._checked = now
            try:
                mtime = self.path.stat().st_mtime
            except FileNotFoundError:
                mtime = None
            if mtime != self._mtime:
                self._mtime = mtime
                self._records = self._read() if mtime is not None else []
        return self._records

    def find(self, token: str) -> TokenRecord | None:
        """The record of ``token`` (compared in constant time), or None."""
        digest = token_hash(token)
        for record in self.records():
            if hmac.compare_digest(record.sha256, digest):
                return record
        return None

    def _read(self) -> list[TokenRecord]:
        data = json.loads(self.path.read_text(encoding="utf-8"))
        return [TokenRecord(**item) for item in data.get("tokens", [])]

    def _write(self, records: list[TokenRecord]) -> None:
        """Replace the file atomically, readable by its owner only."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_suffix(".tmp")
        with open(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w",
                  encoding="utf-8") as out:
            json.dump({"tokens": [asdict(record) for record in records]}, out, indent=2)
        os.replace(temporary, self.path)
        self._checked = float("-inf")

    def create(self, realm: str, principal: str) -> tuple[TokenRecord, str]:
        """A new token for ``principal`` of ``realm``: its record and the token (to show
        once; only its hash is written)."""
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        record = TokenRecord(secrets.token_hex(4), realm, principal, token_hash(token),
                             time.time())
        current = self._read() if self.path.exists() else []
        self._write(current + [record])
        return record, token

    def revoke(self, token_id: str) -> bool:
        """Remove the token with this id; False if there is none."""
        current = self._read() if self.path.exists() else []
        kept = [record for record in current if record.id != token_id]
        if len(kept) == len(current):
            return False
        self._write(kept)
        return True
