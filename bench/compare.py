"""Side-by-side comparison of our router with Crossbar.io (WAMP) and Mosquitto (MQTT).

Installs Crossbar.io into bench/.venv-crossbar and Mosquitto from Debian when missing, starts
each broker on loopback in turn (our router with the event log off, like the others), runs
the same scenarios against each with the bench scripts' functions, prints one table
(ours, theirs, ours/theirs per metric) and writes it with the machine and versions to
bench/RESULTS.md. Every scenario runs --rounds times (default 3, brokers alternating) and
the table shows medians, because one run on a shared 2-core machine swings by 30 %. Every
process it starts is stopped on the way out; the whole run is bounded (--budget, default
14 minutes: later scenarios are skipped, and say so).

    .venv/bin/python bench/compare.py
    .venv/bin/python bench/compare.py --only "rpc,mqtt"    # scenarios whose name contains these
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT))

from bench.fanout import (BrokerMeter, Endpoint, current_rss, latency_report,  # noqa: E402
                          run_scenario)
from bench.mqtt_fanout import run_qos, run_retained_wildcard  # noqa: E402
from bench.retained_prefix import (retain_topics, subscribe_exact,  # noqa: E402
                                   subscribe_retained)
from bench.rpc import run_rpc  # noqa: E402
from tests.harness import RouterProcess, realm_file  # noqa: E402

CROSSBAR_VENV = BENCH / ".venv-crossbar"
PAIRS = [("rawsocket", "msgpack"), ("websocket", "json")]
# sizes: chosen so the whole comparison stays well under 15 minutes on 2 cores
FANOUT_SUBSCRIBERS, FANOUT_EVENTS = 8, 20000
MANY_PUBLISHERS, MANY_SUBSCRIBERS, MANY_EVENTS = 4, 4, 5000
RPC_CALLERS, RPC_CALLS = 4, 3000
RETAINED_EXACT_TOPICS = 500
RETAINED_PREFIX_TOPICS = 100_000
MQTT_SUBSCRIBERS, MQTT_MESSAGES, MQTT_RETAINED = 4, 10_000, 10_000
MQTT_MAX_INFLIGHT = 100  # our router's receive maximum towards MQTT clients
IDLE_TIMEOUT = 20.0  # a scenario gives up after this long without a delivery


# --- installing and running the brokers --------------------------------------------------

def ensure_crossbar() -> tuple[Path | None, str]:
    """(crossbar executable, "") or (None, why not): installs it into its own venv if missing."""
    executable = CROSSBAR_VENV / "bin" / "crossbar"
    if not executable.exists():
        print(f"installing Crossbar.io into {CROSSBAR_VENV} ...", flush=True)
        try:
            subprocess.run(["python3", "-m", "venv", str(CROSSBAR_VENV)], check=True,
                           timeout=120)
            subprocess.run([str(CROSSBAR_VENV / "bin" / "pip"), "install", "-q", "crossbar"],
                           check=True, timeout=900, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True)
        except (subprocess.SubprocessError, OSError) as error:
            detail = getattr(error, "stderr", "") or ""
            return None, f"pip install crossbar failed: {error} {detail[-500:]}"
    return executable, ""


def ensure_mosquitto() -> tuple[str | None, str]:
    """(mosquitto executable, "") or (None, why not): apt-get installs it if missing."""
    found = shutil.which("mosquitto") or shutil.which("/usr/sbin/mosquitto")
    if found:
        return found, ""
    sudo = [shutil.which("sudo")] if shutil.which("sudo") and os.geteuid() != 0 else []
    print("installing mosquitto from Debian ...", flush=True)
    try:
        subprocess.run(sudo + ["apt-get", "update", "-q"], timeout=300, check=False,
                       stdout=subprocess.DEVNULL)
        subprocess.run(sudo + ["apt-get", "install", "-y", "-q", "mosquitto"], timeout=600,
                       check=True, stdout=subprocess.DEVNULL)
    except (subprocess.SubprocessError, OSError) as error:
        return None, f"apt-get install mosquitto failed: {error}"
    found = shutil.which("mosquitto") or shutil.which("/usr/sbin/mosquitto")
    return (found, "") if found else (None, "mosquitto not found after apt-get install")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for_ports(proc: subprocess.Popen, ports: list[int], timeout: float) -> None:
    """Block until every port accepts TCP connections (or the process died / timed out)."""
    deadline = time.monotonic() + timeout
    for port in ports:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"exited with {proc.returncode} before listening on {port}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"not listening on {port} after {timeout:.0f} s")
                time.sleep(0.2)


class ExternalBroker:
    """A broker run as its own process group, stopped with SIGTERM then SIGKILL."""

    name = "broker"

    def __init__(self, command: list[str], cwd: Path, ports: dict[str, tuple[int, str]],
                 startup_timeout: float = 60.0) -> None:
        self.ports = ports
        self.log = open(cwd / "broker.log", "w")
        self.proc = subprocess.Popen(command, cwd=cwd, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        try:
            wait_for_ports(self.proc, [port for port, _ in ports.values()], startup_timeout)
        except RuntimeError as error:
            self.stop()
            tail = (cwd / "broker.log").read_text()[-1500:]
            raise RuntimeError(f"{self.name} did not start: {error}\n{tail}") from None
        self.pid = self.proc.pid

    def address(self, transport: str) -> tuple[str, int, str]:
        port, path = self.ports[transport]
        return "127.0.0.1", port, path

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self.log.close()


class CrossbarNode(ExternalBroker):
    """Crossbar.io with realm1 open to anonymous, WebSocket (JSON, MsgPack) and RawSocket;
    ``web_paths`` adds services beside ``/ws`` on the web transport (e.g. the HTTP bridge's
    ``publisher``)."""

    name = "crossbar"

    def __init__(self, executable: Path, workdir: Path, web_paths: dict | None = None) -> None:
        websocket, rawsocket = free_port(), free_port()
        serializers = ["json", "msgpack"]
        config = {
            "version": 2,
            "controller": {},
            "workers": [{
                "type": "router",
                "realms": [{"name": "realm1", "roles": [{"name": "anonymous", "permissions": [{
                    "uri": "", "match": "prefix",
                    "allow": {"call": True, "register": True, "publish": True,
                              "subscribe": True},
                    "disclose": {"caller": False, "publisher": False}, "cache": True}]}]}],
                "transports": [
                    {"type": "web",
                     "endpoint": {"type": "tcp", "interface": "127.0.0.1", "port": websocket},
                     "paths": {"ws": {"type": "websocket", "serializers": serializers},
                               **(web_paths or {})}},
                    {"type": "rawsocket", "serializers": serializers,
                     "endpoint": {"type": "tcp", "interface": "127.0.0.1", "port": rawsocket}},
                ]}]}
        cbdir = workdir / ".crossbar"
        cbdir.mkdir(parents=True)
        (cbdir / "config.json").write_text(json.dumps(config, indent=2))
        super().__init__([str(executable), "start", "--cbdir", str(cbdir)], workdir,
                         {"websocket": (websocket, "/ws"), "rawsocket": (rawsocket, "/")})


class MosquittoBroker(ExternalBroker):
    """Mosquitto on one loopback port; unlimited queue and our inflight window, so QoS 1/2
    messages are queued, never dropped, under load."""

    name = "mosquitto"
    CONFIG = ("listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n"
              "max_queued_messages 0\nmax_inflight_messages {inflight}\n")

    def __init__(self, executable: str, workdir: Path) -> None:
        port = free_port()
        workdir.mkdir(parents=True)
        (workdir / "mosquitto.conf").write_text(
            self.CONFIG.format(port=port, inflight=MQTT_MAX_INFLIGHT))
        super().__init__([executable, "-c", str(workdir / "mosquitto.conf")], workdir,
                         {"mqtt": (port, "/")})


class OurRouter:
    """Our router from this checkout (tests/harness.RouterProcess), event log off."""

    name = "ours"

    def __init__(self, workdir: Path, mqtt: bool) -> None:
        listeners = ([{"type": "mqtt", "host": "127.0.0.1", "port": 0, "realm": "realm1"}]
                     if mqtt else None)
        realm = realm_file("realm1", retention={"max_topics": 2 * RETAINED_PREFIX_TOPICS})
        self.router = RouterProcess(workdir, [realm], listeners=listeners,
                                    extra_config={"eventlog": {"enabled": False}}).start()
        self.pid = self.router.proc.pid

    def address(self, transport: str) -> tuple[str, int, str]:
        return self.router.address(transport)

    def stop(self) -> None:
        self.router.stop()


# --- scenarios: each returns {metric: value} -------------------------------------------

def endpoint(broker, transport: str) -> Endpoint:
    return Endpoint(transport, *broker.address(transport))


def delivery_metrics(report: dict, rate_key: str, cpu_key: str) -> dict:
    """The table's metrics from one bench report."""
    metrics = {"delivered/s": report[rate_key], "lost": report.get("lost", 0),
               "p50 ms": report["p50_ms"], "p99 ms": report["p99_ms"]}
    if cpu_key in report:
        metrics["CPU us/delivery"] = report[cpu_key]
        metrics["peak RSS MB"] = report["peak_rss_mb"]
    return metrics


def fanout_scenario(transport, serializer, publishers, subscribers, events, match=None):
    def scenario(broker) -> dict:
        report = run_scenario(endpoint(broker, transport), transport, serializer, subscribers,
                              events, None, broker.pid, publishers, match, IDLE_TIMEOUT)
        return delivery_metrics(report, "events_per_s", "cpu_us_per_event")
    return scenario


def rpc_scenario(transport, serializer):
    def scenario(broker) -> dict:
        report = run_rpc(endpoint(broker, transport), transport, serializer, RPC_CALLERS,
                         RPC_CALLS, broker.pid, timeout=60.0)
        metrics = delivery_metrics(dict(report, lost=report["failed"]), "calls_per_s",
                                   "cpu_us_per_call")
        # the same clients for both brokers: what they cost shows how much of the 2 cores
        # was left for the broker
        metrics["clients' CPU us/call"] = report["client_cpu_us_per_call"]
        return metrics
    return scenario


def retained_exact_scenario(transport, serializer):
    """Retain RETAINED_EXACT_TOPICS topics, then subscribe to each with get_retained."""
    def scenario(broker) -> dict:
        target = endpoint(broker, transport)
        prefix = f"bench.exact.{transport}"
        asyncio.run(retain_topics(target, RETAINED_EXACT_TOPICS, prefix, transport, serializer))
        meter = BrokerMeter(broker.pid)
        elapsed, latencies = asyncio.run(subscribe_exact(
            target, RETAINED_EXACT_TOPICS, prefix, transport, serializer, timeout=2.0))
        report = {"rate": len(latencies) / elapsed,
                  "lost": RETAINED_EXACT_TOPICS - len(latencies), **latency_report(latencies)}
        report.update(meter.report(len(latencies)))
        return delivery_metrics(report, "rate", "cpu_us_per_event")
    return scenario


def retained_prefix_scenario(state: dict):
    """Retain RETAINED_PREFIX_TOPICS topics (once per broker; RSS growth per 10,000 topics),
    then one prefix subscription with get_retained over all of them, on every pair."""
    def retain(broker) -> dict:
        target = endpoint(broker, "rawsocket")
        prefix = "bench.prefix"
        rss_before = current_rss(broker.pid)
        seconds = asyncio.run(retain_topics(target, RETAINED_PREFIX_TOPICS, prefix))
        time.sleep(1)  # let background writes settle before reading RSS
        state[broker.name] = prefix
        grown = current_rss(broker.pid) - rss_before
        return {"retain publishes/s": RETAINED_PREFIX_TOPICS / seconds,
                "RSS MB per 10k topics": grown / 2**20 / (RETAINED_PREFIX_TOPICS / 10_000)}

    def subscribe(transport, serializer):
        def scenario(broker) -> dict:
            meter = BrokerMeter(broker.pid)
            to_last, arrivals = asyncio.run(subscribe_retained(
                endpoint(broker, transport), RETAINED_PREFIX_TOPICS, state[broker.name],
                transport, serializer, idle_timeout=5.0))
            report = {"delivered": len(arrivals), "seconds to last": to_last,
                      **latency_report(arrivals)}
            report.update(meter.report(len(arrivals)))
            return {"delivered": report["delivered"], "seconds to last": to_last,
                    "p50 ms": report["p50_ms"], "p99 ms": report["p99_ms"],
                    "peak RSS MB": report.get("peak_rss_mb", 0.0)}
        return scenario

    return retain, subscribe


def mqtt_qos_scenario(qos):
    def scenario(broker) -> dict:
        host, port, _ = broker.address("mqtt")
        report = run_qos(host, port, qos, MQTT_SUBSCRIBERS, MQTT_MESSAGES, broker.pid,
                         timeout=60.0)
        metrics = delivery_metrics(report, "msgs_per_s", "cpu_us_per_msg")
        metrics["duplicates"] = report["duplicates"]
        return metrics
    return scenario


def mqtt_retained_scenario(broker) -> dict:
    host, port, _ = broker.address("mqtt")
    report = run_retained_wildcard(host, port, MQTT_RETAINED, broker.pid, idle_timeout=5.0)
    metrics = delivery_metrics(report, "msgs_per_s", "cpu_us_per_msg")
    metrics["seconds to last"] = report["seconds_to_last"]
    return metrics


def wamp_scenarios() -> list[tuple[str, object]]:
    """(name, function(broker) -> metrics) for the WAMP comparison, in running order."""
    scenarios = []
    for transport, serializer in PAIRS:
        pair = f"{transport}+{serializer}"
        scenarios += [
            (f"fan-out 1->{FANOUT_SUBSCRIBERS} {pair}",
             fanout_scenario(transport, serializer, 1, FANOUT_SUBSCRIBERS, FANOUT_EVENTS)),
            (f"many-to-many {MANY_PUBLISHERS}->{MANY_SUBSCRIBERS} {pair}",
             fanout_scenario(transport, serializer, MANY_PUBLISHERS, MANY_SUBSCRIBERS,
                             MANY_EVENTS)),
            (f"prefix-subscription fan-out 1->{FANOUT_SUBSCRIBERS} {pair}",
             fanout_scenario(transport, serializer, 1, FANOUT_SUBSCRIBERS, FANOUT_EVENTS,
                             "prefix")),
            (f"rpc {RPC_CALLERS} callers {pair}", rpc_scenario(transport, serializer)),
            (f"retained exact subscribe x{RETAINED_EXACT_TOPICS} {pair}",
             retained_exact_scenario(transport, serializer)),
        ]
    retain, subscribe = retained_prefix_scenario({})
    scenarios.append((f"retain {RETAINED_PREFIX_TOPICS:,} topics", retain))
    for transport, serializer in PAIRS:
        scenarios.append((f"retained prefix subscribe over {RETAINED_PREFIX_TOPICS:,} "
                          f"{transport}+{serializer}", subscribe(transport, serializer)))
    return scenarios


def mqtt_scenarios() -> list[tuple[str, object]]:
    return ([(f"mqtt QoS {qos} fan-out 1->{MQTT_SUBSCRIBERS}", mqtt_qos_scenario(qos))
             for qos in (0, 1, 2)]
            + [(f"mqtt '#' over {MQTT_RETAINED:,} retained", mqtt_retained_scenario)])


# --- running, reporting ------------------------------------------------------------------

class Run:
    """Results per (scenario, broker role) and notes, within an overall time budget."""

    def __init__(self, budget: float, only: list[str]) -> None:
        self.deadline = time.monotonic() + budget
        self.only = only
        self.results: dict[str, dict[str, list[dict]]] = {}  # one metrics dict per round
        self.theirs: dict[str, str] = {}
        self.notes: list[str] = []

    def note(self, text: str) -> None:
        print(f"NOTE: {text}", flush=True)
        self.notes.append(text)

    def selected(self, scenarios):
        return [(name, fn) for name, fn in scenarios
                if not self.only or any(word in name for word in self.only)]

    def run_against(self, role: str, label: str, start, scenarios) -> None:
        """Start a broker with ``start()`` (``role`` "ours" or "theirs", ``label`` its name),
        run the scenarios, stop it whatever happens."""
        scenarios = self.selected(scenarios)
        if not scenarios:
            return
        if role == "theirs":
            self.theirs.update((name, label) for name, _ in scenarios)
        try:
            broker = start()
        except Exception as error:  # noqa: BLE001 - reported in the table's notes
            self.note(f"{label}: could not start, its column is empty: {error}")
            return
        try:
            for name, scenario in scenarios:
                if time.monotonic() > self.deadline:
                    self.note(f"{name} ({broker.name}): skipped, time budget used up")
                    continue
                print(f"[{broker.name}] {name} ...", flush=True)
                try:
                    metrics = scenario(broker)
                except Exception as error:  # noqa: BLE001 - one failure must not stop the rest
                    self.note(f"{name} ({broker.name}): failed: {type(error).__name__}: "
                              f"{str(error)[:300]}")
                    continue
                self.results.setdefault(name, {}).setdefault(role, []).append(metrics)
                print("    " + ", ".join(f"{k}={v:,.2f}" for k, v in metrics.items()),
                      flush=True)
        finally:
            broker.stop()

    def table(self) -> str:
        lines = ["| scenario | vs | metric | ours | theirs | ours/theirs |",
                 "|---|---|---|---:|---:|---:|"]
        ordered = list(dict.fromkeys(list(self.results) + list(self.theirs)))
        for name in ordered:
            ours = _combined(self.results.get(name, {}).get("ours", []))
            theirs = _combined(self.results.get(name, {}).get("theirs", []))
            for metric in dict.fromkeys(list(ours) + list(theirs)):
                mine, other = ours.get(metric), theirs.get(metric)
                ratio = (f"{mine / other:.2f}" if mine is not None and other not in (None, 0)
                         else "-")
                lines.append(f"| {name} | {self.theirs.get(name, '-')} | {metric} | "
                             f"{_number(mine)} | {_number(other)} | {ratio} |")
        return "\n".join(lines)


def _combined(rounds: list[dict]) -> dict:
    """One value per metric over the rounds: the worst for losses and duplicates (one lost
    message in any round counts), the median for everything else."""
    combined = {}
    for metric in dict.fromkeys(key for metrics in rounds for key in metrics):
        values = [metrics[metric] for metrics in rounds if metric in metrics]
        combined[metric] = (max(values) if metric in ("lost", "duplicates")
                            else statistics.median(values))
    return combined


def _number(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, int) or abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.2f}"


def machine_and_versions(crossbar: Path | None, mosquitto: str | None) -> list[str]:
    memory = next(line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                  if line.startswith("MemTotal:"))
    lines = [f"- machine: {os.cpu_count()} cores, {int(memory) / 2**20:.1f} GiB memory, "
             f"kernel {platform.release()}, Python {platform.python_version()}",
             f"- our router: git HEAD {git_head()} (read from .git, event log off)"]
    if crossbar:
        probe = ("import crossbar, autobahn, twisted; print(f'crossbar {crossbar.__version__}, "
                 "autobahn {autobahn.__version__}, twisted {twisted.__version__}')")
        found = subprocess.run([str(crossbar.parent / "python"), "-c", probe],
                               capture_output=True, text=True, timeout=60)
        lines.append(f"- Crossbar.io: {found.stdout.strip() or found.stderr.strip()[-200:]} "
                     f"(CPython, {CROSSBAR_VENV.name})")
    if mosquitto:
        found = subprocess.run([mosquitto, "-h"], capture_output=True, text=True, timeout=10)
        lines.append(f"- {(found.stdout or found.stderr).splitlines()[0].strip()}")
    return lines


def git_head() -> str:
    """The checked-out commit, read from .git without running git (in a worktree, ``.git``
    is a file naming the worktree's own folder, whose refs live in the main repository's)."""
    git = ROOT / ".git"
    if git.is_file():
        git = (ROOT / git.read_text().strip().removeprefix("gitdir: ")).resolve()
    common = git / "commondir"
    shared = (git / common.read_text().strip()).resolve() if common.exists() else git
    head = (git / "HEAD").read_text().strip()
    if not head.startswith("ref: "):
        return head[:12]
    ref = head[5:]
    for folder in (git, shared):
        if (folder / ref).exists():
            return (folder / ref).read_text().strip()[:12]
    packed = shared / "packed-refs"
    for line in packed.read_text().splitlines() if packed.exists() else []:
        if line.endswith(" " + ref):
            return line.split()[0][:12]
    return "unknown"


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="",
                        help="comma-separated words; run only scenarios whose name has one")
    parser.add_argument("--budget", type=float, default=14 * 60,
                        help="seconds; scenarios after that are skipped")
    parser.add_argument("--rounds", type=int, default=3,
                        help="run every scenario this many times, brokers alternating; the "
                             "table shows medians (and the worst loss)")
    parser.add_argument("--output", default=str(BENCH / "RESULTS.md"))
    args = parser.parse_args()
    started = time.monotonic()
    run = Run(args.budget, [word for word in args.only.split(",") if word])
    load_before = loadavg()
    crossbar, why = ensure_crossbar()
    if crossbar is None:
        run.note(f"Crossbar.io column skipped: {why}")
    mosquitto, why = ensure_mosquitto()
    if mosquitto is None:
        run.note(f"Mosquitto column skipped: {why}")
    workdir = Path(tempfile.mkdtemp(prefix="bench-compare-"))
    for number in range(1, args.rounds + 1):
        print(f"=== round {number} of {args.rounds}", flush=True)
        here = workdir / f"round{number}"
        run.run_against("ours", "ours", lambda: OurRouter(here / "ours-wamp", mqtt=False),
                        wamp_scenarios())
        if crossbar:
            run.run_against("theirs", "crossbar",
                            lambda: CrossbarNode(crossbar, here / "crossbar"),
                            wamp_scenarios())
        run.run_against("ours", "ours", lambda: OurRouter(here / "ours-mqtt", mqtt=True),
                        mqtt_scenarios())
        if mosquitto:
            run.run_against("theirs", "mosquitto",
                            lambda: MosquittoBroker(mosquitto, here / "mosquitto"),
                            mqtt_scenarios())
    load_after = loadavg()
    shutil.rmtree(workdir, ignore_errors=True)
    table = run.table()
    print("\n" + table, flush=True)
    header = ["# Benchmark comparison: ours vs Crossbar.io / Mosquitto", "",
              f"- date: {datetime.datetime.now().isoformat(timespec='seconds')}",
              *machine_and_versions(crossbar, mosquitto),
              f"- load average (1/5/15 min) before: {load_before}, after: {load_after}",
              f"- wall time of the comparison: {time.monotonic() - started:.0f} s, "
              f"{args.rounds} round(s), brokers alternating; each figure is the median over "
              f"the rounds (lost and duplicates: the worst round)",
              f"- command: `.venv/bin/python bench/compare.py"
              f"{' --only ' + args.only if args.only else ''}"
              f"{f' --rounds {args.rounds}' if args.rounds != 3 else ''}`", ""]
    notes = ["", "Notes:", ""] + [f"- {note}" for note in run.notes] if run.notes else []
    Path(args.output).write_text("\n".join(header) + "\n" + table + "\n"
                                 + "\n".join(notes) + "\n")
    print(f"\nwritten to {args.output}", flush=True)


if __name__ == "__main__":
    main()
