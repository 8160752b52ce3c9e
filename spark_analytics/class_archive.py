"""A class-data-sharing archive for the report's driver JVM, created on first use, reused after.

A report in a new process loads ~25,000 classes (Spark, Scala, Hadoop, Parquet) from the jars:
parsing and verifying them is seconds of CPU each time. Java's application class-data sharing
(AppCDS) stores the loaded classes, parsed and verified, in an archive that a later JVM maps
instead (``-XX:ArchiveClassesAtExit`` writes it when the JVM exits,
``-XX:SharedArchiveFile`` maps it). The first report writes the archive into the cache folder
(:data:`CACHE_ENV`) and waits for its JVM to finish writing it; every later report starts
from it.

The JVM checks that an archive fits (its own build and the exact class path, jar sizes and
times) and ignores one that does not; its messages about the archive are kept off the
command's stdout. A truncated archive, though, crashes the JVM when mapped: an archive is
renamed into place only once the JVM that wrote it exited cleanly, its name records its size,
and one of another size is never used. The name also holds a key of the Java installation,
the Spark jars and the class-path settings, so an upgrade creates a new archive. The folder
keeps the archives of the :data:`KEPT_ARCHIVES` installations used last (about 200 MiB each):
two installations used in turn (a user's and a test run's virtualenv) must not each delete
the other's and pay for writing theirs again at every switch.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

import pyspark

CACHE_ENV = "SPARK_ANALYTICS_CACHE"
"""The folder for the archive (default ``$XDG_CACHE_HOME/spark-analytics``, else
``~/.cache/spark-analytics``); ``off`` runs without one."""
CLASS_PATH_SETTINGS = ("SPARK_HOME", "SPARK_CONF_DIR", "HADOOP_CONF_DIR", "YARN_CONF_DIR",
                       "SPARK_DIST_CLASSPATH", "SPARK_CLASSPATH")
"""Environment variables spark-submit builds the driver's class path from."""
QUIET = "-Xlog:cds*=off"
"""The JVM says on stdout when it ignores an archive; stdout carries the command's result."""
STALE_SECONDS = 24 * 3600
"""An unfinished archive this old is left over from a process that died: removed."""
PREFIX = "driver-"
KEPT_ARCHIVES = 2
"""How many installations' archives the folder keeps, the ones mapped or written last."""


def cache_folder() -> Path | None:
    """Where the archive lives, None when :data:`CACHE_ENV` is ``off``."""
    chosen = os.environ.get(CACHE_ENV)
    if chosen == "off":
        return None
    if chosen:
        return Path(chosen)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "spark-analytics"


def _stat_key(path: Path) -> str:
    try:
        stat = path.stat()
    except OSError:
        return f"{path}:-"
    return f"{path}:{stat.st_size}:{stat.st_mtime_ns}"


def installation_key(java_home: str) -> str:
    """A digest of what an archive depends on: the JVM's build, Spark's jars and the class
    path settings. (The JVM checks them itself; the key only keeps a stale archive from
    being kept instead of a useful one.)"""
    spark_home = Path(os.environ.get("SPARK_HOME") or Path(pyspark.__file__).parent)
    jars = spark_home / "jars"
    parts = [_stat_key(Path(java_home) / "lib" / "server" / "libjvm.so"),
             _stat_key(Path(java_home) / "release"), _stat_key(jars),
             *(_stat_key(jar) for jar in sorted(jars.glob("*.jar"))),
             *(f"{name}={os.environ.get(name, '')}" for name in CLASS_PATH_SETTINGS)]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class ClassArchive:
    """The archive of one installation in ``folder``: used when it is there whole, else
    written by this process's JVM (:meth:`java_options`, then :meth:`finish`)."""

    folder: Path
    key: str

    @classmethod
    def for_java(cls, java_home: str) -> ClassArchive | None:
        """The archive for this Java and Spark, None when switched off (:data:`CACHE_ENV`)
        or when its folder cannot be created."""
        folder = cache_folder()
        if folder is None:
            return None
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError:
            return None
        if any(character.isspace() or character in "'\"" for character in str(folder)):
            return None  # Spark splits the JVM's options on spaces
        return cls(folder, installation_key(java_home))

    def usable(self) -> Path | None:
        """The finished archive, when its size is the one it was written with."""
        for path in self.folder.glob(f"{PREFIX}{self.key}-*.jsa"):
            size = path.stem.rsplit("-", 1)[1]
            try:
                if size.isdigit() and path.stat().st_size == int(size):
                    return path
            except OSError:
                continue
        return None

    def being_written(self) -> Path:
        return self.folder / f"{PREFIX}{self.key}.{os.getpid()}.tmp"

    def java_options(self) -> str:
        """The driver's options: map the archive, or write it when the JVM exits."""
        archive = self.usable()
        if archive is not None:
            _mark_used(archive)
            return f"-XX:SharedArchiveFile={archive} {QUIET}"
        return f"-XX:ArchiveClassesAtExit={self.being_written()} {QUIET}"

    def finish(self, exit_status: int) -> Path | None:
        """After the JVM that was told to write the archive exited with ``exit_status``: put
        a whole archive in place (an atomic rename) and remove the archives of installations
        not used lately (beyond :data:`KEPT_ARCHIVES`) and unfinished ones left by dead
        processes. Returns the archive."""
        written = self.being_written()
        if exit_status != 0 or not written.is_file():
            written.unlink(missing_ok=True)
            return None
        archive = self.folder / f"{PREFIX}{self.key}-{written.stat().st_size}.jsa"
        os.replace(written, archive)
        others = [path for path in self.folder.glob(f"{PREFIX}*") if path != archive]
        finished = sorted((path for path in others if path.suffix == ".jsa"),
                          key=_last_used, reverse=True)
        stale = [path for path in others if path.suffix == ".tmp"
                 and time.time() - _last_used(path) > STALE_SECONDS]
        for path in finished[KEPT_ARCHIVES - 1:] + stale:
            with contextlib.suppress(OSError):
                path.unlink()
        return archive


def _last_used(path: Path) -> float:
    """When an archive was last mapped or written (its modification time, see
    :func:`_mark_used`); 0 for one that went meanwhile."""
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _mark_used(archive: Path) -> None:
    """Record that a JVM maps ``archive`` now, so the folder keeps it over ones unused longer."""
    with contextlib.suppress(OSError):  # a read-only cache folder: the archive is still mapped
        os.utime(archive)
