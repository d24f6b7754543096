"""Benchmark: 1 KiB ping-pong latency and 4 MiB bandwidth between two processes, shm vs tcp links.

The gloo transport alone (``comm/gloo/transport/``: links, framing, the engine), no backend above it.
Run::

    python benchmarks/bench_transport.py            # both modes
    python benchmarks/bench_transport.py shm        # one mode

Prints a table per mode: one-way latency of a 1 KiB message (half the round trip, median of 5
runs), the CPU time one rank spends per message (stable even on a busy machine, where wall time is
not), one-way streaming bandwidth of 4 MiB messages, and the bidirectional ``sendrecv`` rate; writes
the raw runs to ``benchmarks/results/bench_transport.json``. Numbers depend heavily on how busy the
cores are: the JSON records the machine's load.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import textwrap

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import format_table, run_processes, write_json  # noqa: E402
from neural_arch.distributed.rendezvous.store import TCPStore  # noqa: E402

#: one rank: connect the transport through the store, then measure (prints one JSON line)
_RANK = textwrap.dedent("""
    import json, os, time
    import numpy as np
    from neural_arch.distributed.comm.gloo.transport.engine import connect_transport
    from neural_arch.distributed.comm.work import OpInfo
    from neural_arch.distributed.rendezvous.store import TCPStore

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = TCPStore("127.0.0.1", int(os.environ["PORT"]), timeout=60)
    t = connect_transport(store, rank, world, 60, mode=os.environ["MODE"])

    def info(seconds):
        return OpInfo("bench", 1, list(range(world)), rank, deadline=time.monotonic() + seconds)

    def report(value):
        print(json.dumps(value), flush=True)
""") + textwrap.dedent("""
    peer = 1 - rank
    op = info(600)
    small, sbuf = np.ones(256, np.float32), np.empty(256, np.float32)
    big, bbuf = np.ones(1 << 20, np.float32), np.empty(1 << 20, np.float32)

    def pingpong(n):
        for _ in range(n):
            if rank == 0:
                t.send(peer, small, 0, op); t.recv_into(peer, sbuf, 0, op)
            else:
                t.recv_into(peer, sbuf, 0, op); t.send(peer, sbuf, 0, op)

    def stream(n):
        for _ in range(n):
            if rank == 0:
                t.send(peer, big, 1, op)
            else:
                t.recv_into(peer, bbuf, 1, op)
        if rank == 0:   # wait until the receiver got everything
            t.recv_into(peer, sbuf, 2, op)
        else:
            t.send(peer, sbuf, 2, op)

    pingpong(200); stream(3)
    lat, cpu, bw, bidir = [], [], [], []
    for _ in range(5):
        t0, c0 = time.perf_counter(), time.process_time(); pingpong(1000)
        lat.append((time.perf_counter() - t0) / 2000 * 1e6)
        cpu.append((time.process_time() - c0) / 2000 * 1e6)
        t0 = time.perf_counter(); stream(20)
        bw.append(20 * big.nbytes / (time.perf_counter() - t0) / 1e9)
        t0 = time.perf_counter()
        for _ in range(20):
            t.sendrecv(peer, big, peer, bbuf, 3, op)
        bidir.append(20 * big.nbytes / (time.perf_counter() - t0) / 1e9)
    report({"kind": t.peer_kind(peer), "lat_us": lat, "cpu_us": cpu, "bw_GBps": bw, "sendrecv_GBps": bidir})
    store.set(f"done/{rank}", b"1"); store.wait([f"done/{peer}"])
    t.close()
""")


def run_mode(mode: str) -> dict:
    master = TCPStore("127.0.0.1", 0, is_master=True, timeout=60)
    try:
        env = {**os.environ, "PORT": str(master.port), "MODE": mode, "WORLD_SIZE": "2"}
        outs = run_processes([([sys.executable, "-c", _RANK], {**env, "RANK": str(r)}) for r in range(2)],
                             timeout=590, what=f"bench_transport {mode}")
    finally:
        master.close()
    return json.loads([line for line in outs[0][0].splitlines() if line.startswith("{")][-1])


def main(modes) -> None:
    runs = {mode: run_mode(mode) for mode in modes}
    rows = []
    for mode, res in runs.items():
        med = {k: statistics.median(v) for k, v in res.items() if isinstance(v, list)}
        rows.append([f"{mode} ({res['kind']})", med["lat_us"], min(res["lat_us"]), med["cpu_us"], med["bw_GBps"],
                     med["sendrecv_GBps"]])
    print(format_table(rows, ["link", "1 KiB one-way us (median)", "best", "CPU us/msg/rank",
                              "4 MiB stream GB/s", "4 MiB sendrecv GB/s each way"]))
    print(f"load average: {os.getloadavg()}")
    print("raw results:", write_json(os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "bench_transport.json"), {"runs": runs}))


if __name__ == "__main__":
    main(sys.argv[1:] or ["shm", "tcp"])
