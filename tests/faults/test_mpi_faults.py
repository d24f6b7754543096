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
    from neural_arch.distributed.comm.mpi.failure import _mpi
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


_KILLED = textwrap.dedent("""
    import os, signal, time
    import numpy as np
    import neural_arch.distributed as dist
    dist.init_process_group("mpi")
    rank = dist.get_rank()
    a = np.ones(1 << 16)
    dist.all_reduce(a)                       # a working job first
    print(f"first all_reduce {rank} {a[0]}", flush=True)   # one string: two ranks' words never mix
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.all_reduce(np.ones(1 << 16))        # rank 0 waits for a peer that is gone
    print(f"returned {rank}", flush=True)
""")


def test_a_sigkilled_rank_ends_the_whole_job_promptly(tmp_path):
    """MPI has no survivors to ask: mpiexec must end the job (non-zero) long before the 300 s
    collective timeout, and no rank may return from the all_reduce its peer never joined."""
    script = tmp_path / "killed.py"
    script.write_text(_KILLED)
    proc = run_mpiexec(script, 2, env={"NEURAL_ARCH_TIMEOUT": "300"}, timeout=50)
    out = proc.output
    assert proc.returncode != 0, out
    assert "first all_reduce 0 2.0" in out and "first all_reduce 1 2.0" in out, out
    assert "returned" not in out, out
    assert proc.elapsed < 20, (proc.elapsed, out)
