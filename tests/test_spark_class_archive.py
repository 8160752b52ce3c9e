"""The report driver's class archive: chosen only whole, written once, ignored quietly when it
does not fit (spark_analytics/class_archive.py; the CLI report of test_spark_analytics.py
writes a real one)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from spark_analytics.class_archive import CACHE_ENV, ClassArchive, cache_folder


@pytest.fixture
def archive(tmp_path, monkeypatch) -> ClassArchive:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    found = ClassArchive.for_java("/nonexistent-java")
    assert found is not None and found.folder == tmp_path / "cache" and found.folder.is_dir()
    return found


def test_off_means_no_archive(monkeypatch):
    monkeypatch.setenv(CACHE_ENV, "off")
    assert cache_folder() is None and ClassArchive.for_java("/nonexistent-java") is None


def test_the_first_run_writes_the_archive_and_later_runs_map_it(archive):
    assert archive.usable() is None
    assert f"-XX:ArchiveClassesAtExit={archive.being_written()}" in archive.java_options()
    archive.being_written().write_bytes(b"x" * 1000)
    kept = archive.finish(0)
    assert kept is not None and kept.name.endswith("-1000.jsa")
    assert archive.usable() == kept
    assert archive.java_options().startswith(f"-XX:SharedArchiveFile={kept} ")


def test_a_failed_write_leaves_nothing(archive):
    archive.being_written().write_bytes(b"partial")
    assert archive.finish(1) is None
    assert not list(archive.folder.iterdir())


def test_a_truncated_archive_is_never_mapped(archive):
    """The JVM crashes on a truncated archive (SIGBUS), so its size must be the one written."""
    archive.being_written().write_bytes(b"x" * 1000)
    kept = archive.finish(0)
    os.truncate(kept, 500)
    assert archive.usable() is None
    assert "ArchiveClassesAtExit" in archive.java_options()


def test_the_archives_of_the_installations_used_last_are_kept(archive):
    """Two installations used in turn (a user's virtualenv and a test run's) keep both their
    archives; a third written removes the one mapped longest ago, and unfinished leftovers of
    dead processes, never one still being written."""
    used_lately = archive.folder / "driver-0123456789abcdef-77.jsa"
    used_long_ago = archive.folder / "driver-fedcba9876543210-66.jsa"
    for written_at, path in enumerate((used_lately, used_long_ago)):
        path.write_bytes(b"y" * int(path.stem.rsplit("-", 1)[1]))
        os.utime(path, (written_at, written_at))
    mapped = ClassArchive(archive.folder, "0123456789abcdef")
    assert mapped.java_options().startswith(f"-XX:SharedArchiveFile={used_lately} ")
    running_elsewhere = archive.folder / f"driver-{archive.key}.1.tmp"
    running_elsewhere.write_bytes(b"z")
    left_by_a_dead_process = archive.folder / "driver-0123456789abcdef.2.tmp"
    left_by_a_dead_process.write_bytes(b"z")
    os.utime(left_by_a_dead_process, (0, 0))
    archive.being_written().write_bytes(b"x" * 10)
    kept = archive.finish(0)
    assert sorted(archive.folder.iterdir()) == sorted([kept, used_lately, running_elsewhere])
    assert mapped.usable() == used_lately


@pytest.mark.skipif(shutil.which("java") is None, reason="needs Java")
def test_the_jvm_ignores_an_archive_that_does_not_fit_without_a_word_on_stdout(archive):
    """Another installation's archive, or garbage: the JVM starts without it, quietly (the
    report's stdout carries the page's path only)."""
    archive.being_written().write_bytes(os.urandom(100_000))
    kept = archive.finish(0)
    run = subprocess.run(["java", *archive.java_options().split(), "-version"],
                         capture_output=True, text=True, timeout=60)
    assert kept is not None and run.returncode == 0 and run.stdout == ""
