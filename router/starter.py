"""The starter configuration ``wamp-router init DIR`` writes: the repository's own ``config.json``
and ``realms/realm1.json``, shipped in the wheel as ``router/templates/`` so that an installed
router can be set up outside the repository (tests/test_packaging.py keeps the copies equal)."""

from __future__ import annotations

import json
from importlib.resources import files
from pathlib import Path

STARTER_FILES = ("config.json", "realms/realm1.json")
"""What ``init`` writes, relative to its folder (and to ``router/templates/``)."""


def template(name: str) -> bytes:
    """The shipped bytes of one starter file."""
    return files("router").joinpath("templates", *name.split("/")).read_bytes()


def starter_config(host: str | None, data_dir: str | None) -> bytes:
    """The starter ``config.json``: the template as shipped, or with every listener's host and
    the data folder replaced (a container must listen on 0.0.0.0; a service keeps its data in
    /var/lib, not next to its configuration in /etc)."""
    shipped = template("config.json")
    if host is None and data_dir is None:
        return shipped
    config = json.loads(shipped)
    if data_dir is not None:
        config["data_dir"] = data_dir
    for listener in config["listeners"]:
        if host is not None and "host" in listener:
            listener["host"] = host
    return (json.dumps(config, indent=2) + "\n").encode()


def write_starter(folder: Path, force: bool, host: str | None = None,
                  data_dir: str | None = None) -> list[Path]:
    """Writes the starter files into ``folder`` and returns their paths; raises FileExistsError
    naming every file already there unless ``force`` (nothing is written then)."""
    targets = [folder / name for name in STARTER_FILES]
    existing = [str(path) for path in targets if path.exists()]
    if existing and not force:
        raise FileExistsError(", ".join(existing))
    contents = [starter_config(host, data_dir)] + [template(name) for name in STARTER_FILES[1:]]
    for path, content in zip(targets, contents):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    return targets
