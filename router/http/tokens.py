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
"""Seconds between two looks at the file's modification time by a running router (in a
thread): a token created or revoked by the CLI works, or stops working, within this delay."""


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
    """The tokens of one data dir. A running router keeps the records in memory and looks
    at the file again every ``RECHECK_INTERVAL`` seconds in a thread (:meth:`refresh`);
    the CLI reads and writes the file directly."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / TOKENS_FILE
        self.current: list[TokenRecord] = []
        """The records as last read (what :meth:`find` checks)."""
        self._mtime: float | None = None

    def refresh(self) -> list[TokenRecord] | None:
        """The records if the file changed since the last look, else None (blocking: run it
        in a thread, and hand the answer to :meth:`replace` on the reactor)."""
        try:
            mtime: float | None = self.path.stat().st_mtime
        except FileNotFoundError:
            mtime = None
        if mtime == self._mtime:
            return None
        self._mtime = mtime
        return self.records() if mtime is not None else []

    def replace(self, records: list[TokenRecord] | None) -> None:
        if records is not None:
            self.current = records

    def find(self, token: str) -> TokenRecord | None:
        """The record of ``token`` (compared in constant time), or None."""
        digest = token_hash(token)
        for record in self.current:
            if hmac.compare_digest(record.sha256, digest):
                return record
        return None

    def records(self) -> list[TokenRecord]:
        """Every token's record, read from the file now."""
        if not self.path.exists():
            return []
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

    def create(self, realm: str, principal: str) -> tuple[TokenRecord, str]:
        """A new token for ``principal`` of ``realm``: its record and the token (to show
        once; only its hash is written)."""
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        record = TokenRecord(secrets.token_hex(4), realm, principal, token_hash(token),
                             time.time())
        self._write(self.records() + [record])
        return record, token

    def revoke(self, token_id: str) -> bool:
        """Remove the token with this id; False if there is none."""
        current = self.records()
        kept = [record for record in current if record.id != token_id]
        if len(kept) == len(current):
            return False
        self._write(kept)
        return True
