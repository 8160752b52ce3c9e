"""RPC round trip on the Redis engine: callee on the caller's node vs on another node.

Starts its own redis-server (free port, nothing saved) and two router nodes from this
checkout (and one embedded node for reference). One caller on node 1 makes sequential
calls; the callee is on node 1 or on node 2. Prints call latency p50/p99 and the CPU of
node 1 per call (the other node's and Redis's work is not in it).

    .venv/bin/python bench/cluster_rpc.py --calls 3000
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.cluster import SERIALIZER, TRANSPORT, endpoint, run_setups  # noqa: E402
from bench.rpc import run_rpc  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000)
    args = parser.parse_args()
    run_setups("bench-cluster-rpc-", (("embedded, callee on the node", 1, False),
                                      ("redis, callee on the caller's node", 1, True),
                                      ("redis, callee on another node", 2, True)),
               lambda name, nodes, redis_pid: {"setup": name, **run_rpc(
                   endpoint(nodes[0]), TRANSPORT, SERIALIZER, 1, args.calls, nodes[0].proc.pid,
                   callee_endpoint=endpoint(nodes[-1]))})


if __name__ == "__main__":
    main()
