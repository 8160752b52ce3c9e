"""The same analytics job on a real standalone Spark cluster: a master and a worker started
from the installed pyspark on 127.0.0.1, with ``file://`` URLs for the logs, the output and
the checkpoint. Its tables must equal those of a ``local[2]`` run over the same log.
"""

from __future__ import annotations

import csv
import os
import queue
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import pyspark
from spark_analytics.storage import to_url
from tests.harness import ROOT
from tests.test_spark_analytics import DAY_1, DAY_2, alpha_day_1, alpha_day_2, beta, write_part

SPARK_HOME = Path(pyspark.__file__).parent
START_TIMEOUT = 40
RUN_TIMEOUT = 180  # one command on the 1-core worker; ~90 s when the machine is idle


def java_home() -> str:
    return os.environ.get("JAVA_HOME") or str(Path(shutil.which("java")).resolve().parent.parent)


def environment() -> dict[str, str]:
    """What the cluster's daemons and the jobs need: Java, this Python on the executors, and
    every Spark address on the loopback interface."""
    return dict(os.environ, JAVA_HOME=java_home(), SPARK_HOME=str(SPARK_HOME),
                PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")


class Daemon:
    """A ``spark-class`` process whose log lines are read into a queue as they come."""

    def __init__(self, main_class: str, *args: str) -> None:
        self.process = subprocess.Popen(
            [str(SPARK_HOME / "bin" / "spark-class"), main_class, *args], env=environment(),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        self.log: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.put(line)

    def wait_for(self, pattern: str) -> re.Match:
        """The first log line matching ``pattern``; fails after START_TIMEOUT seconds."""
        while True:
            try:
                line = self.lines.get(timeout=START_TIMEOUT)
            except queue.Empty:
                pytest.fail(f"no {pattern!r} in {START_TIMEOUT} s:\n{''.join(self.log)}")
            self.log.append(line)
            if match := re.search(pattern, line):
                return match

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """``spark://127.0.0.1:<port>`` of a master with one registered worker (1 core, 1 GiB)."""
    daemons = []
    try:
        master = Daemon("org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                        "--port", "0", "--webui-port", "0")
        daemons.append(master)
        url = master.wait_for(r"Starting Spark master at (spark://127\.0\.0\.1:\d+)").group(1)
        daemons.append(Daemon("org.apache.spark.deploy.worker.Worker", url, "--cores", "1",
                              "--memory", "1g", "--webui-port", "0", "--host", "127.0.0.1"))
        master.wait_for(r"Registering worker 127\.0\.0\.1:\d+ with 1 cores")
        yield url
    finally:
        for daemon in reversed(daemons):
            daemon.stop()


def start_job(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "spark_analytics", *args], cwd=ROOT,
                            env=environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def finished(job: subprocess.Popen) -> str:
    """The job's stdout once it exits 0."""
    try:
        stdout, stderr = job.communicate(timeout=RUN_TIMEOUT)
    finally:
        job.kill()
    assert job.returncode == 0, stderr
    return stdout


def run_both(master: str, logs: str, folder: Path) -> str:
    """``report`` then ``stream --once`` on ``master``, output under ``folder``; returns the
    report's stdout (the page's location)."""
    out = to_url(folder)
    page = finished(start_job("report", "--master", master, "--driver-memory", "1g",
                              "--logs", logs, "--out", out + "/report"))
    finished(start_job("stream", "--once", "--master", master, "--driver-memory", "1g",
                       "--logs", logs, "--out", out + "/stream",
                       "--checkpoint", out + "/checkpoint"))
    return page


def tables(folder: Path) -> dict[str, list[tuple]]:
    """Every CSV table under ``folder`` (by its folder name), rows sorted."""
    found = {}
    for part in folder.rglob("csv/part-*.csv"):
        with part.open(newline="") as file:
            found[part.parent.parent.name] = sorted(tuple(row.items())
                                                    for row in csv.DictReader(file))
    return found


@pytest.mark.timeout(400)
def test_standalone_cluster_gives_the_tables_of_a_local_run(cluster, tmp_path):
    logs = tmp_path / "logs"
    for (realm, day), records in {("alpha", DAY_1): alpha_day_1(), ("alpha", DAY_2): alpha_day_2(),
                                  ("beta", DAY_1): beta(DAY_1, 30)}.items():
        write_part(logs, realm, day, 0, records)
    logs_url = to_url(logs)
    assert logs_url.startswith("file:///")

    # the local run (given the plain path) overlaps with the cluster's
    with ThreadPoolExecutor(1) as pool:
        local = pool.submit(run_both, "local[2]", str(logs), tmp_path / "local")
        page = run_both(cluster, logs_url, tmp_path / "cluster")
        local.result()

    on_cluster, on_local = tables(tmp_path / "cluster"), tables(tmp_path / "local")
    assert {"topics", "summary", "topic_totals", "ack_latency"} <= set(on_cluster)
    assert on_cluster == on_local
    # the page and charts were drawn on the driver and copied through Hadoop's file system
    assert page.strip() == str(tmp_path / "cluster" / "report" / "report.html")
    html = Path(page.strip()).read_text(encoding="utf-8")
    for chart in re.findall(r'src="(charts/[^"]+\.png)"', html):
        assert (tmp_path / "cluster" / "report" / chart).stat().st_size > 0
    assert (tmp_path / "cluster" / "stream" / "events_per_minute" / "_spark_metadata").is_dir()
