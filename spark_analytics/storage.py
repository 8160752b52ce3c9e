"""Where the jobs read and write: local paths or any Hadoop file-system URL.

Every location is kept as a URL string (a local path becomes ``file:///...``), which Spark's
readers and writers take as they are. Listing and the files the driver itself writes (charts,
the page) go through Hadoop's ``FileSystem`` in the driver's JVM, so ``hdfs://`` or ``s3a://``
work wherever Spark has the connector. Before a session exists only local folders can be
listed (:class:`LocalFiles`), which is how a local input sizes its session up front.
"""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from urllib.parse import urlparse

from py4j.protocol import Py4JJavaError
from pyspark.sql import SparkSession

SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def to_url(location: str | os.PathLike) -> str:
    """A local path as an absolute ``file://`` URL; a URL as given (without a trailing /).

    Not percent-encoded, as Hadoop's ``Path`` and Spark take them: ``realm=a`` stays as is."""
    text = os.fspath(location)
    if SCHEME.match(text):
        return text.rstrip("/")
    return f"file://{Path(text).resolve()}"


def local_path(url: str) -> Path | None:
    """The local folder a ``file:`` URL names; None for any other file system."""
    parsed = urlparse(url)
    return Path(parsed.path) if parsed.scheme == "file" else None


def shown(url: str) -> str:
    """How to name a location to a user: a local one as the path they would type."""
    path = local_path(url)
    return str(path) if path is not None else url


def join(url: str, *names: str) -> str:
    return "/".join((url.rstrip("/"), *names))


@dataclass(frozen=True)
class Entry:
    """One listed file or folder: its name (last path component) and size in bytes."""

    url: str
    size: int

    @property
    def name(self) -> str:
        return self.url.rstrip("/").rsplit("/", 1)[-1]

    @property
    def parent_names(self) -> list[str]:
        """The folder names above it, nearest first (``date=...``, then ``realm=...``)."""
        return self.url.rstrip("/").split("/")[-2::-1]


class Files(Protocol):
    """The few file-system operations the jobs need beyond Spark's readers and writers."""

    def glob(self, pattern: str) -> list[Entry]:
        """Entries matching a glob URL (``*`` within one component), sorted; [] if none."""

    def upload(self, local: Path, url: str) -> None:
        """Copy a file written on the driver to ``url`` (replacing it; parents created)."""

    def touch(self, url: str) -> None:
        """Create an empty file at ``url`` (replacing it; parents created): a marker."""


class LocalFiles:
    """``file:`` URLs through the local file system: usable before any Spark session."""

    def glob(self, pattern: str) -> list[Entry]:
        base = local_path(pattern)
        assert base is not None, pattern
        # hidden names too, as Hadoop's glob lists them (a part the router has open)
        return [Entry(f"file://{match}", os.stat(match).st_size)
                for match in sorted(glob.glob(str(base), include_hidden=True))]

    def upload(self, local: Path, url: str) -> None:
        target = local_path(url)
        assert target is not None, url
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(local.read_bytes())

    def touch(self, url: str) -> None:
        target = local_path(url)
        assert target is not None, url
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(b"")


class HadoopFiles:
    """Any URL Spark can read, through Hadoop's ``FileSystem`` in the driver's JVM."""

    def __init__(self, spark: SparkSession) -> None:
        self._jvm = spark.sparkContext._jvm
        self._conf = spark.sparkContext._jsc.hadoopConfiguration()

    def _path(self, url: str):  # -> org.apache.hadoop.fs.Path
        return self._jvm.org.apache.hadoop.fs.Path(url)

    def _fs(self, path):  # -> org.apache.hadoop.fs.FileSystem
        return path.getFileSystem(self._conf)

    def glob(self, pattern: str) -> list[Entry]:
        path = self._path(pattern)
        statuses = self._fs(path).globStatus(path) or []  # null when a plain path is missing
        return sorted((Entry(status.getPath().toString(), status.getLen())
                       for status in statuses), key=lambda entry: entry.url)

    def upload(self, local: Path, url: str) -> None:
        target = self._path(url)
        self._fs(target).copyFromLocalFile(False, True, self._path(local.resolve().as_uri()),
                                           target)

    def touch(self, url: str) -> None:
        target = self._path(url)
        self._fs(target).create(target, True).close()

    def copy(self, url: str, target_url: str) -> bool:
        """Copy a file (replacing the target; parents created); False when the source is
        gone (a part renamed as it closed)."""
        source, target = self._path(url), self._path(target_url)
        try:
            return self._jvm.org.apache.hadoop.fs.FileUtil.copy(
                self._fs(source), source, self._fs(target), target, False, True, self._conf)
        except Py4JJavaError as error:
            if error.java_exception.getClass().getName() == "java.io.FileNotFoundException":
                return False
            raise

    def delete(self, url: str) -> None:
        """Delete a file or a folder with everything in it (nothing if it does not exist)."""
        path = self._path(url)
        self._fs(path).delete(path, True)


def upload_folder(files: Files, local: Path, url: str) -> list[str]:
    """Upload every file under ``local`` to the same relative place under ``url``."""
    uploaded = []
    for path in sorted(local.rglob("*")):
        if path.is_file():
            target = join(url, *path.relative_to(local).parts)
            files.upload(path, target)
            uploaded.append(target)
    return uploaded
