"""Benchmark: 1 KiB ping-pong latency and 4 MiB bandwidth between two processes, shm vs tcp.

Not a test (pytest does not collect it). Run::

    PYTHONPATH=. python tests/transport/bench_transport.py            # both modes
    PYTHONPATH=. python tests/transport/bench_transport.py shm        # one mode

Prints, per mode: one-way latency of a 1 KiB message (half the round trip, median of 5 runs) and
the CPU time one rank spends per message (stable even on a busy machine, where wall time is not),
one-way streaming bandwidth of 4 MiB messages, and the bidirectional ``sendrecv`` rate.
Numbers depend heavily on how busy the cores are: report them with the machine's load.
"""

from __future__ import annotations

import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from transport_procs import run_ranks

from neural_arch.distributed.rendezvous.store import TCPStore

_BENCH = """
    from transport_rank import connect, info
    t, store = connect()
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
"""


def main(modes):
    for mode in modes:
        master = TCPStore("127.0.0.1", 0, is_master=True, timeout=60)
        try:
            res = run_ranks(_BENCH, 2, timeout=590, env={"PORT": str(master.port), "MODE": mode})[0][1][0]
        finally:
            master.close()
        med = {k: statistics.median(v) for k, v in res.items() if isinstance(v, list)}
        print(f"{mode:4s} ({res['kind']}): 1 KiB one-way latency {med['lat_us']:.1f} us (best {min(res['lat_us']):.1f}), "
              f"(CPU {med['cpu_us']:.1f} us per message per rank), 4 MiB stream {med['bw_GBps']:.2f} GB/s, 4 MiB sendrecv {med['sendrecv_GBps']:.2f} GB/s each way",
              flush=True)
    print(f"load average: {os.getloadavg()}")


if __name__ == "__main__":
    main(sys.argv[1:] or ["shm", "tcp"])
