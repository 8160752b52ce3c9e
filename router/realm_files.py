"""Edits of a realm file's JSON for the command line (principals, roles), each checked
against the parsed realm first, so a refusal says why and the file is left as it was."""

from __future__ import annotations

import json
from pathlib import Path

from router.config import ConfigError, RealmConfig, load_config


def apply_hint(config: str, command: str = "python -m router") -> str:
    """How to make a running router take a realm file change (``command``: how the user
    runs the router's CLI)."""
    option = "" if config == "config.json" else f" --config {config}"
    return f"run '{command} reload{option}' to apply it to a running router"


def realm_awaiting_role(config: str, realm: str, role: str) -> RealmConfig | None:
    """The realm file (its roles left out) when the configuration is refused because that
    realm names ``role`` (as its ``anonymous_role``, or a principal's role) and the role
    does not exist yet: adding it is how the operator fixes that. None otherwise (the usual
    error handling follows)."""
    try:
        load_config(config)
        return None
    except ConfigError as exc:
        if not exc.problem.startswith(f"names the role '{role}',"):
            return None
        path = Path(exc.source)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if data.get("name") != realm:
        return None
    check = data.get("uri_check", "strict")
    return RealmConfig(realm, path, {}, check if check in ("strict", "loose") else "strict")


def principal_lines(realm: RealmConfig) -> list[str]:
    """One line per principal: authid, role, login methods; then the anonymous role."""
    lines = [f"{authid:24} role {principal.role:16} "
             f"{', '.join(principal.methods()) or '(TLS client certificate only)'}"
             for authid, principal in sorted(realm.principals.items())]
    if not lines:
        lines.append("(no principals)")
    anonymous = realm.anonymous_role
    lines.append(f"anonymous logins: {'role ' + anonymous if anonymous else 'refused'}")
    return lines


def remove_principal(realm: RealmConfig, data: dict, authid: str) -> str:
    """Remove ``authid`` from ``data``; the message to print (ValueError if there is none)."""
    if authid not in realm.principals:
        raise ValueError(f"principals: there is no principal '{authid}'")
    del data["principals"][authid]
    return f"principal '{authid}' removed (its live sessions close on reload)"


def set_secret(realm: RealmConfig, data: dict, authid: str, secret: str) -> str:
    """Replace the ticket hash and/or WAMP-CRA key of ``authid`` with ones for ``secret``."""
    from router.core.credentials import derive_wampcra, hash_secret

    principal = realm.principals[authid]
    entry = data["principals"][authid]
    changed = []
    if principal.ticket_hash is not None:
        entry["ticket"] = hash_secret(secret)
        changed.append("ticket")
    if principal.wampcra is not None:
        entry["wampcra"] = derive_wampcra(secret).as_json()
        changed.append("wampcra")
    if not changed:
        raise ValueError(f"principal '{authid}' has no secret to change (it logs in with "
                         f"{', '.join(principal.methods()) or 'a TLS client certificate'}); "
                         "add one with 'principal add --method ticket'")
    return (f"principal '{authid}' has a new secret for {' and '.join(changed)} "
            "(sessions already open stay open)")


def remove_role(realm: RealmConfig, data: dict, role: str) -> str:
    """Remove ``role`` unless a principal or anonymous logins use it."""
    if role not in realm.roles:
        raise ValueError(f"roles: there is no role '{role}' (roles: "
                         f"{', '.join(sorted(realm.roles))})")
    users = sorted(authid for authid, principal in realm.principals.items()
                   if principal.role == role)
    if users:
        raise ValueError(f"roles: role '{role}' is the role of {', '.join(users)}: remove "
                         "them or give them another role first")
    if realm.anonymous_role == role:
        raise ValueError(f"roles: role '{role}' is the anonymous_role: change that first")
    del data["roles"][role]
    return f"role '{role}' removed"
