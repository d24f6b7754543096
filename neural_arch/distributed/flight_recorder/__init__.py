"""The flight recorder: every rank's last N collective and point-to-point ops, dumped when a job
fails or hangs, and an analyzer that names where the ranks' histories split (PyTorch's NCCL Flight
Recorder and its ``fr_trace`` analyzer).

* :mod:`~neural_arch.distributed.flight_recorder.buffer`: the ring (always on,
  ``NEURAL_ARCH_FLIGHT_RECORDER_SIZE`` records, 0 = off), filled by every backend's op runner; each
  record names its group by members and id (``group_id``, torch's ``pg_name``: ``"pg1/WORLD"``,
  ``"pg1/group2"``), so groups with the same members are told apart;
* :mod:`~neural_arch.distributed.flight_recorder.writer`: one JSON file per rank, written atomically
  on a timeout, poisoning, a peer's failure or ``SIGUSR1`` (to ``NEURAL_ARCH_FLIGHT_RECORDER_DIR``
  or the rendezvous store);
* :mod:`~neural_arch.distributed.flight_recorder.analyzer`: the verdict
  (``python -m neural_arch.distributed.flight_recorder DIR``).

Example::

    # NEURAL_ARCH_FLIGHT_RECORDER_DIR=/tmp/fr python -m neural_arch.distributed.launcher ... train.py
    # ... a rank hangs; every other rank times out and dumps; kill -USR1 <pid of the hung rank>
    # python -m neural_arch.distributed.flight_recorder /tmp/fr
    from neural_arch.distributed.flight_recorder import analyze, load_dumps
    print(analyze(load_dumps("/tmp/fr")).report())
"""

from neural_arch.distributed.flight_recorder.analyzer import Divergence, Verdict, analyze, load_dumps
from neural_arch.distributed.flight_recorder.buffer import RECORDER, FlightRecorder
from neural_arch.distributed.flight_recorder.writer import dump, fetch_from_store

__all__ = ["RECORDER", "Divergence", "FlightRecorder", "Verdict", "analyze", "dump", "fetch_from_store",
           "load_dumps"]
