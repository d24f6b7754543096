"""MPI-specific faults under a real ``mpiexec``: a rank that starts late cannot hold the others in
MPI_Init past the rendezvous timeout."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

from neural_arch.distributed.testing import mpiexec_path

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(60)]

_LATE = textwrap.dedent("""
    import os, sys, time
    rank = int(os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
    if rank == 1:
        time.sleep(30)            # a rank that starts (far too) late
    from neural_arch.distributed.comm.mpi import _mpi
    _mpi()
    print("initialised", rank, flush=True)
""")


def test_a_late_rank_cannot_hold_mpi_init_past_the_rendezvous_timeout(tmp_path):
    script = tmp_path / "late.py"
    script.write_text(_LATE)
    # 5 s, not less: the watchdog also times loading libmpi, and a rank that gives up before it
    # reaches the process manager (a cold page cache on a fresh install took > 2 s) exits as a
    # plain process, which mpiexec does not treat as a failed MPI job -- the test would then wait
    # for the late rank instead of checking our watchdog
    env = dict(os.environ, NEURAL_ARCH_RENDEZVOUS_TIMEOUT="5",
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    t0 = time.monotonic()
    proc = subprocess.run([mpiexec_path(), "-n", "2", sys.executable, str(script)], env=env,
                          capture_output=True, text=True, timeout=50, check=False)
    elapsed = time.monotonic() - t0
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "initialised" not in out, out
    assert "MPI_Init_did_not_finish_within_the_rendezvous_timeout" in out, out
    assert elapsed < 25, (elapsed, out)
