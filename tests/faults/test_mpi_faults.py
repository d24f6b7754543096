"""MPI-specific faults under a real ``mpiexec``: a rank that starts late cannot hold the others in
MPI_Init past the rendezvous timeout, and the ranks that wait say why in one line first."""

from __future__ import annotations

import textwrap

import pytest

from neural_arch.distributed.testing import run_mpiexec

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
    proc = run_mpiexec(script, 2, env={"NEURAL_ARCH_RENDEZVOUS_TIMEOUT": "5"}, timeout=50)
    elapsed, out = proc.elapsed, proc.output
    assert proc.returncode != 0, out
    assert "initialised" not in out, out
    assert "MPI_Init_did_not_finish_within_the_rendezvous_timeout" in out, out
    # the cause in one line, before faulthandler's dump
    cause = "MPI_Init did not finish within 5 s on rank 0 (NEURAL_ARCH_RENDEZVOUS_TIMEOUT): another rank"
    assert cause in out and out.index(cause) < out.index("Timeout ("), out
    assert elapsed < 25, (elapsed, out)
