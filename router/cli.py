"""Command line: ``python -m router run|check-config|hash-secret|principal|role|import-mosquitto|
retained|status|init``."""

from __future__ import annotations

import argparse
import getpass
import json
import logging
import os
import re
import shlex
import sys
from pathlib import Path

from router import __version__
from router.config import ConfigError, NodeConfig, RealmConfig, load_config, parse_rule
from router.core.uri import MATCH_POLICIES, PREFIX
from router.realm_files import (apply_hint, principal_lines, realm_awaiting_role,
                                 remove_principal, remove_role, set_secret)


TWISTED_CHATTER = re.compile(r"(Starting|Stopping) factory |\S+ starting on (\d+|'.*')$"
                             r"|\(\w+ Port .+ Closed\)$|Main loop terminated\.$")
"""Twisted's info lines about each port and factory it starts and stops: the ``ready:`` line
and the shutdown lines say the same once, so these are logged at debug level."""


def _setup_logging(level: str, log_format: str = "text") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        from router.logging_json import JsonFormatter
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=getattr(logging, level.upper()), handlers=[handler])
    from twisted.logger import LogLevel, STDLibLogObserver, formatEvent, globalLogBeginner

    to_stdlib = STDLibLogObserver()

    def observe(event: dict) -> None:
        if event.get("log_level") == LogLevel.info and TWISTED_CHATTER.match(formatEvent(event)):
            event = dict(event, log_level=LogLevel.debug)
        to_stdlib(event)

    globalLogBeginner.beginLoggingTo([observe], redirectStandardIO=False)


def _load(args: argparse.Namespace) -> NodeConfig | None:
    """The configuration, or None after saying what is wrong with it."""
    try:
        return load_config(args.config)
    except ConfigError as exc:
        print(f"configuration error: {exc}", file=sys.stderr)
        return None


def _run(args: argparse.Namespace) -> int:
    config = _load(args)
    if config is None:
        return 2
    from router.tls import leave_out_tls, needs_tls
    without_tls = not needs_tls(config) and leave_out_tls()  # before the reactor is imported
    _setup_logging(args.log_level, args.log_format)
    if without_tls:
        logging.getLogger("router").info(
            "running without TLS (pyOpenSSL not loaded): no listener, webhook or bridge "
            "asks for it")
    from router.reactor import install
    install()
    import txaio
    txaio.use_twisted()
    from twisted.internet import reactor

    from router.node import Node

    failed: list[Exception] = []

    def cannot_start(exc: Exception) -> None:
        logging.getLogger("router").error("cannot start: %s", exc)
        failed.append(exc)
        if reactor.running:  # the engine connected once the reactor ran
            reactor.stop()

    try:
        node = Node(config, reactor)
        node.start(cannot_start)  # a port in use is told to cannot_start
    except Exception as exc:  # Redis unreachable, a data dir that cannot be written
        cannot_start(exc)
    if not failed:
        reactor.run()
    return 1 if failed else 0


def _check_config(args: argparse.Namespace) -> int:
    config = _load(args)
    if config is None:
        return 2
    print(f"{args.config}: OK ({len(config.realms)} realm(s): {', '.join(config.realms)}; "
          f"{len(config.listeners)} listener(s))")
    from router.ports import unavailable

    # not an error: the port may be held by this very configuration's running router
    for problem in unavailable(config):
        print(f"warning: {problem}", file=sys.stderr)
    return 0


def _hash_secret(args: argparse.Namespace) -> int:
    from router.core.credentials import hash_secret

    secret = _read_secret("secret: ")
    if not _acceptable(secret):
        return 2
    print(hash_secret(secret))
    return 0


def _read_secret(prompt: str) -> str:
    if sys.stdin.isatty():
        return getpass.getpass(prompt)
    return sys.stdin.readline().rstrip("\n")


def _acceptable(secret: str) -> bool:
    """Whether a secret may be stored; if not, say why."""
    from router.core.credentials import secret_problem

    problem = secret_problem(secret)
    if problem is not None:
        print(problem, file=sys.stderr)
    return problem is None


def _realm(args: argparse.Namespace, creating: str | None = None) -> RealmConfig | None:
    """The realm ``--realm`` names in ``--config``, or None after saying what is wrong.
    ``creating``: a role about to be added, which the realm's ``anonymous_role`` may name."""
    if creating is not None:
        waiting = realm_awaiting_role(args.config, args.realm, creating)
        if waiting is not None:
            return waiting
    config = _load(args)
    if config is None:
        return None
    realm = config.realms.get(args.realm)
    if realm is None:
        print(f"no realm '{args.realm}' in {args.config} (realms: {', '.join(config.realms)})",
              file=sys.stderr)
    return realm


def _rewrite_realm(args: argparse.Namespace, path: Path, data: dict, done: str) -> int:
    """Replace the realm file atomically, check that the configuration still loads and say
    ``done``; the exit code."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)
    try:
        load_config(args.config)
    except ConfigError as exc:  # should not happen; say so rather than leave it silent
        print(f"warning: the configuration does not load now: {exc}", file=sys.stderr)
        return 1
    print(f"{path}: {done}; {apply_hint(args.config, args.typed)}")
    return 0


def _principal_add(args: argparse.Namespace) -> int:
    """Write one principal's credential (hash, derived key or public key) to a realm file."""
    from router.core.credentials import derive_wampcra, hash_secret, normalize_pubkey
    from router.core.ownership import principal_name_refusal

    realm = _realm(args)
    if realm is None:
        return 2
    refusal = principal_name_refusal(args.authid)
    if refusal is not None:
        print(f"{args.authid!r}: {refusal}", file=sys.stderr)
        return 2
    if args.role not in realm.roles:
        print(f"{realm.source}: roles: there is no role '{args.role}' (roles: "
              f"{', '.join(sorted(realm.roles))})", file=sys.stderr)
        return 2
    if args.method == "cryptosign":
        pubkey = normalize_pubkey(_read_secret("Ed25519 public key (hex): "))
        if pubkey is None:
            print("the public key must be 64 hex digits (a 32-byte Ed25519 public key)",
                  file=sys.stderr)
            return 2
    else:
        secret = _read_secret("secret: ")
        if not _acceptable(secret):
            return 2
    path = Path(realm.source)
    data = json.loads(path.read_text(encoding="utf-8"))
    principals = data.setdefault("principals", {})
    entry = principals.setdefault(args.authid, {})
    entry["role"] = args.role
    if args.method == "ticket":
        entry["ticket"] = hash_secret(secret)
    elif args.method == "wampcra":
        entry["wampcra"] = derive_wampcra(secret).as_json()
    else:
        keys = entry.setdefault("cryptosign", {}).setdefault("pubkeys", [])
        if pubkey not in keys:
            keys.append(pubkey)
    return _rewrite_realm(args, path, data, f"principal '{args.authid}' (role {args.role}) "
                          f"can now log in with {args.method}")


def _role_add(args: argparse.Namespace) -> int:
    """Add a permission rule to a role of a realm file, creating the role if it is new.
    A rule for the same URI and match that the role has already is refused, not merged:
    the operator says which one is meant by editing the file."""
    realm = _realm(args, creating=args.role)
    if realm is None:
        return 2
    if not args.role.strip():
        print("the role name must not be empty", file=sys.stderr)
        return 2
    path = Path(realm.source)
    data = json.loads(path.read_text(encoding="utf-8"))
    rules = data.setdefault("roles", {}).setdefault(args.role, [])
    rule = ({"topic": args.topic} if args.topic is not None
            else {"uri": args.uri, "match": args.match})
    rule["allow"] = [action.strip() for action in args.allow.split(",") if action.strip()]
    if not rule["allow"]:
        print("--allow must name at least one action (publish, subscribe, call, register)",
              file=sys.stderr)
        return 2
    if args.disclose:
        rule["disclose"] = True
    try:
        parsed = parse_rule(path, f"roles.{args.role}[{len(rules)}]", rule, realm.uri_check)
    except ConfigError as exc:
        print(f"configuration error: {exc}", file=sys.stderr)
        return 2
    for existing in realm.roles.get(args.role, ()):
        if (existing.pattern, existing.match) == (parsed.pattern, parsed.match):
            print(f"{path}: role '{args.role}' has a rule for {parsed.text()} already "
                  f"(allow: {', '.join(sorted(existing.actions))}); edit the file to change it",
                  file=sys.stderr)
            return 2
    rules.append(rule)
    if parsed.match == PREFIX and parsed.pattern[-1] != "":
        print(f"note: a WAMP prefix is a string prefix: '{args.uri}' also grants "
              f"'{args.uri}r.x'; end it with '.' or use --topic '{args.uri.replace('.', '/')}/#'")
    return _rewrite_realm(args, path, data, f"role '{args.role}' may now "
                          f"{', '.join(rule['allow'])} on {parsed.text()}")


def _role_list(args: argparse.Namespace) -> int:
    realm = _realm(args)
    if realm is None:
        return 2
    for name in sorted(realm.roles):
        print(name)
        for rule in realm.roles[name]:
            print(f"  {rule.text()}: {', '.join(sorted(rule.actions))}"
                  + (" (disclose)" if rule.disclose else ""))
    return 0


def _principal_list(args: argparse.Namespace) -> int:
    realm = _realm(args)
    if realm is None:
        return 2
    for line in principal_lines(realm):
        print(line)
    return 0


def _edit_realm(args: argparse.Namespace, edit) -> int:
    """Apply ``edit(realm, data) -> done message`` (or raise ValueError saying why not) to the
    realm file's JSON, and write it back."""
    realm = _realm(args)
    if realm is None:
        return 2
    path = Path(realm.source)
    data = json.loads(path.read_text(encoding="utf-8"))
    try:
        done = edit(realm, data)
    except ValueError as exc:
        print(f"{path}: {exc}", file=sys.stderr)
        return 2
    return _rewrite_realm(args, path, data, done)


def _principal_remove(args: argparse.Namespace) -> int:
    return _edit_realm(args, lambda realm, data: remove_principal(realm, data, args.authid))


def _principal_passwd(args: argparse.Namespace) -> int:
    """A new secret for a principal's ticket and/or WAMP-CRA credential."""
    realm = _realm(args)
    if realm is None:
        return 2
    if args.authid not in realm.principals:
        print(f"{realm.source}: principals: there is no principal '{args.authid}'",
              file=sys.stderr)
        return 2
    secret = _read_secret("new secret: ")
    if not _acceptable(secret):
        return 2
    return _edit_realm(args, lambda realm, data: set_secret(realm, data, args.authid, secret))


def _role_remove(args: argparse.Namespace) -> int:
    return _edit_realm(args, lambda realm, data: remove_role(realm, data, args.role))


def _reload(args: argparse.Namespace) -> int:
    config = _load(args)
    if config is None:
        print("not reloaded: the running router keeps its configuration", file=sys.stderr)
        return 2
    from router.reload import signal_reload

    return signal_reload(config, args.timeout)


def _import_mosquitto(args: argparse.Namespace) -> int:
    """Principals and roles from a Mosquitto password file and ACL file
    (:mod:`router.mosquitto`); roles and principals of the same names are replaced."""
    from router import mosquitto

    if args.password_file is None and args.acl_file is None:
        print("give --password-file, --acl-file or both", file=sys.stderr)
        return 2
    if args.realm is None:
        config = _load(args)
        if config is None:
            return 2
        if len(config.realms) != 1:
            print(f"{args.config} has {len(config.realms)} realms: say which with --realm",
                  file=sys.stderr)
            return 2
        args.realm = next(iter(config.realms))
    realm = _realm(args)
    if realm is None:
        return 2
    try:
        users = (mosquitto.read_passwords(Path(args.password_file))
                 if args.password_file is not None else {})
        acl = mosquitto.read_acl(Path(args.acl_file)) if args.acl_file is not None else None
    except (OSError, UnicodeDecodeError, mosquitto.MosquittoError) as exc:
        print(f"cannot import: {exc}", file=sys.stderr)
        return 2
    roles = mosquitto.roles(acl)
    path = Path(realm.source)
    try:
        for name, rules in roles.items():
            for index, rule in enumerate(rules):
                parse_rule(path, f"roles.{name}[{index}]", rule, realm.uri_check)
    except ConfigError as exc:
        print(f"cannot import: {exc}", file=sys.stderr)
        return 2
    data = json.loads(path.read_text(encoding="utf-8"))
    data.setdefault("roles", {}).update(roles)
    principals = data.setdefault("principals", {})
    for user, stored in users.items():
        entry = principals.setdefault(user, {})
        entry["role"] = mosquitto.role_name(user, acl)
        entry["ticket"] = stored
    without = sorted(user for user in (acl.users if acl else ()) if user and user not in users)
    if without:
        print(f"users of the ACL file without a password (add one with 'principal add'): "
              f"{', '.join(without)}")
    if acl is not None and None in acl.users:
        print(f"anonymous clients' lines are in role '{mosquitto.ANONYMOUS_ROLE}': set the "
              f"realm's anonymous_role to it to let them in (Mosquitto's allow_anonymous)")
    return _rewrite_realm(args, path, data, f"imported {len(users)} user(s) and "
                          f"{len(roles)} role(s) ({', '.join(sorted(roles))})")


def _retained(args: argparse.Namespace) -> int:
    config = _load(args)
    if config is None:
        return 2
    from router.admin import retained_command

    return retained_command(args, config)


def _status(args: argparse.Namespace) -> int:
    from pathlib import Path

    from router.status import status_command

    config = None
    if args.url is None or Path(args.config).exists():
        config = _load(args)
        if config is None:
            return 2
    return status_command(args, config)


def _seconds(text: str) -> float:
    """An argparse type: a finite number of seconds, 0 or more (``time.sleep`` refuses a
    negative one with a traceback, and NaN or inf would wait forever or not at all)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: seconds must be a finite number >= 0")
    return value


def _realm_file_command(commands, name: str, handler, help_text: str) -> argparse.ArgumentParser:
    """A subcommand about one realm file: ``--realm`` and ``--config``."""
    command = commands.add_parser(name, help=help_text)
    command.add_argument("--realm", required=True)
    command.add_argument("--config", default="config.json", help="node configuration file")
    command.set_defaults(handler=handler)
    return command


def _realm_management_commands(commands, principal_commands, role_commands) -> None:
    """``principal list|remove|passwd``, ``role remove`` and ``reload``."""
    _realm_file_command(principal_commands, "list", _principal_list,
                        "list a realm's principals, their roles and login methods")
    remove = _realm_file_command(principal_commands, "remove", _principal_remove,
                                 "remove a principal (its live sessions close on reload)")
    remove.add_argument("--authid", required=True)
    passwd = _realm_file_command(principal_commands, "passwd", _principal_passwd,
                                 "set a principal's secret (ticket / WAMP-CRA; read from stdin)")
    passwd.add_argument("--authid", required=True)
    role_remove = _realm_file_command(role_commands, "remove", _role_remove,
                                      "remove a role no principal and no anonymous login uses")
    role_remove.add_argument("--role", required=True)
    reload = commands.add_parser(
        "reload", help="apply changed roles and principals to the running router (SIGHUP)")
    reload.add_argument("--config", default="config.json", help="node configuration file")
    reload.add_argument("--timeout", type=_seconds, default=30.0,
                        help="seconds to wait for the router's answer")
    reload.set_defaults(handler=_reload)


def _token(args: argparse.Namespace) -> int:
    """``token create|list|revoke``: the bearer tokens of the ``http`` listeners."""
    from datetime import datetime, timezone

    from router.http.tokens import TokenFile

    config = _load(args)
    if config is None:
        return 2
    tokens = TokenFile(config.data_dir)
    if args.token_command == "create":
        realm = config.realms.get(args.realm)
        if realm is None:
            print(f"no realm {args.realm!r} in {args.config}", file=sys.stderr)
            return 1
        if args.principal not in realm.principals:
            print(f"realm {args.realm} has no principal {args.principal!r} (add it with "
                  "'principal add')", file=sys.stderr)
            return 1
        record, token = tokens.create(args.realm, args.principal)
        print(token)
        print(f"token {record.id} for {args.principal} in realm {args.realm}: shown once, only "
              f"its hash is kept in {tokens.path}", file=sys.stderr)
        return 0
    if args.token_command == "revoke":
        if not tokens.revoke(args.id):
            print(f"no token {args.id!r} in {tokens.path}", file=sys.stderr)
            return 1
        print(f"revoked token {args.id}")
        return 0
    print(f"{'ID':10}{'REALM':16}{'PRINCIPAL':24}CREATED")
    for record in tokens.records():
        created = datetime.fromtimestamp(record.created, timezone.utc).strftime("%Y-%m-%d %H:%M")
        print(f"{record.id:10}{record.realm:16}{record.principal:24}{created}")
    return 0


def _token_commands(commands) -> None:
    token = commands.add_parser("token", help="bearer tokens of the http listeners")
    token_commands = token.add_subparsers(dest="token_command", required=True)
    create = token_commands.add_parser("create", help="make a token for a principal (printed "
                                       "once; only its hash is stored in the data dir)")
    create.add_argument("--realm", required=True)
    create.add_argument("--principal", required=True, help="the authid whose role it gets")
    token_commands.add_parser("list", help="list the tokens (ids, never the tokens)")
    revoke = token_commands.add_parser("revoke", help="remove a token (a running router stops "
                                       "accepting it within 2 s)")
    revoke.add_argument("--id", required=True)
    for command in token_commands.choices.values():
        command.add_argument("--config", default="config.json", help="node configuration file")
        command.set_defaults(handler=_token)


def _init(args: argparse.Namespace) -> int:
    from router.starter import write_starter

    try:
        written = write_starter(Path(args.folder), args.force, args.host, args.data_dir)
    except OSError as exc:
        if isinstance(exc, FileExistsError) and exc.errno is None:  # write_starter's own
            print(f"not overwriting {exc} (--force replaces them)", file=sys.stderr)
        else:
            print(f"cannot write the starter files into {args.folder}: {exc.strerror} "
                  f"({exc.filename})", file=sys.stderr)
        return 1
    for path in written:
        print(f"wrote {path}")
    print(f"next: {args.typed} run --config {shlex.quote(str(written[0]))}")
    return 0


def _init_command(commands) -> None:
    """``init DIR``: a starter configuration for a router installed outside the repository."""
    init = commands.add_parser(
        "init", help="write a starter config.json and realms/realm1.json into a folder")
    init.add_argument("folder", help="where to write them (created if missing)")
    init.add_argument("--force", action="store_true", help="overwrite files already there")
    init.add_argument("--host", help="address every listener binds (default 127.0.0.1; "
                      "0.0.0.0 in a container)")
    init.add_argument("--data-dir", help="data folder, relative to config.json unless absolute "
                      "(default: data)")
    init.set_defaults(handler=_init)


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """The command line; ``prog`` is how usage lines name it (default: the script's name,
    e.g. ``wamp-router``)."""
    parser = argparse.ArgumentParser(prog=prog or os.path.basename(sys.argv[0]),
                                     description="A WAMP router with event retention.")
    parser.add_argument("--version", action="version",
                        version=f"%(prog)s (wamp-retain-router) {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="start the router")
    run.add_argument("--config", default="config.json", help="node configuration file")
    run.add_argument("--log-level", default="info",
                     choices=["debug", "info", "warning", "error"])
    run.add_argument("--log-format", default="text", choices=["text", "json"],
                     help="json: one JSON object per line (time, level, logger, realm...)")
    run.set_defaults(handler=_run)
    check = commands.add_parser("check-config", help="validate the configuration and exit")
    check.add_argument("--config", default="config.json", help="node configuration file")
    check.set_defaults(handler=_check_config)
    secret = commands.add_parser("hash-secret",
                                 help="hash a ticket secret (read from stdin) for a realm file")
    secret.set_defaults(handler=_hash_secret)
    principal = commands.add_parser("principal", help="manage the principals of a realm")
    principal_commands = principal.add_subparsers(dest="principal_command", required=True)
    add = _realm_file_command(
        principal_commands, "add", _principal_add,
        "add a principal, or a credential to one (secret or public key on stdin)")
    add.add_argument("--authid", required=True)
    add.add_argument("--role", required=True)
    add.add_argument("--method", required=True, choices=["ticket", "wampcra", "cryptosign"])
    role = commands.add_parser("role", help="manage the roles of a realm")
    role_commands = role.add_subparsers(dest="role_command", required=True)
    role_add = _realm_file_command(role_commands, "add", _role_add,
                                   "add a permission rule to a role (the role is created if new)")
    role_add.add_argument("--role", required=True)
    role_add.add_argument("--allow", required=True,
                          help="comma-separated: publish, subscribe, call, register")
    target = role_add.add_mutually_exclusive_group(required=True)
    target.add_argument("--uri", help="WAMP URI or pattern (\"\" with prefix: all; a prefix "
                        "is a string prefix: 'home' also grants 'homer.x')")
    target.add_argument("--topic", help="MQTT topic filter for every protocol ('home/#', "
                        "'sensors/+/temp', 'devices/%%u/#' with %%u = authid, %%c = client id)")
    role_add.add_argument("--match", default="exact", choices=MATCH_POLICIES,
                          help="with --uri: how it matches")
    role_add.add_argument("--disclose", action="store_true",
                          help="disclose the caller/publisher to callees/subscribers")
    _realm_file_command(role_commands, "list", _role_list, "list a realm's roles and their rules")
    _realm_management_commands(commands, principal_commands, role_commands)
    mosquitto = commands.add_parser(
        "import-mosquitto", help="principals and roles from a Mosquitto password and ACL file")
    mosquitto.add_argument("--password-file", help="mosquitto_passwd's file ($7$/$6$ hashes, "
                           "kept as they are: users keep their passwords)")
    mosquitto.add_argument("--acl-file", help="Mosquitto acl_file (user, topic, pattern lines)")
    mosquitto.add_argument("--realm", help="realm to import into (default: the only one)")
    mosquitto.add_argument("--config", default="config.json", help="node configuration file")
    mosquitto.set_defaults(handler=_import_mosquitto)
    retained = commands.add_parser(
        "retained", help="list or purge retained events on a running router (on its machine: "
        "over its admin socket, no user needed)")
    retained.add_argument("action", choices=["list", "purge"])
    retained.add_argument("--realm", help="realm (default: the configuration's only realm)")
    retained.add_argument("--prefix", help="topics starting with this string (\"\" = all)")
    retained.add_argument("--topic", help="a WAMP URI, or an MQTT topic or filter ('home/#', "
                          "'+/temp'): the topics it matches")
    retained.add_argument("--sys", action="store_true",
                          help="list: show the router's own $SYS topics too")
    retained.add_argument("--json", action="store_true",
                          help="list: JSON (as wamp.retained.list answers) instead of a table")
    retained.add_argument("--limit", type=int, default=1000, help="list: at most this many topics")
    retained.add_argument("--config", default="config.json",
                          help="node configuration (its data dir holds the admin socket)")
    retained.add_argument("--url", help="WebSocket URL of a router to join as a WAMP client "
                          "instead of the admin socket (default with --authid: from --config)")
    retained.add_argument("--authid", help="principal to authenticate as over WAMP (ticket "
                          "from $ROUTER_TICKET or a prompt)")
    retained.set_defaults(handler=_retained)
    status = commands.add_parser(
        "status", help="summary of a running router, from its metrics listener (without one: "
        "over the admin socket)")
    status.add_argument("--config", default="config.json",
                        help="node configuration (to find the metrics listener)")
    status.add_argument("--url", help="metrics URL (default: from --config)")
    status.add_argument("--token", help="bearer token (default: from --config)")
    status.add_argument("--interval", type=_seconds, default=2.0,
                        help="seconds between the two scrapes the rates come from")
    status.set_defaults(handler=_status)
    _init_command(commands)
    _token_commands(commands)
    args = parser.parse_args(argv)
    args.typed = _as_typed(parser.prog)
    return args.handler(args)


def _as_typed(prog: str) -> str:
    """The command as the user can type it again, for the next step a command suggests:
    ``python -m router`` names the interpreter that runs it (``.venv/bin/python`` in a
    clone, where a bare ``python`` has no Twisted)."""
    if prog != "python -m router":
        return prog
    interpreter = Path(sys.executable)
    try:
        interpreter = interpreter.relative_to(Path.cwd())
    except ValueError:
        pass
    return f"{shlex.quote(str(interpreter))} -m router"
