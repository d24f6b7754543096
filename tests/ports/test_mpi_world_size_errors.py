"""Under mpiexec, MPI decides rank and world size: a contradicting world_size is a clear error at
init, and it never suggests an impossible `mpiexec -n 0`."""
import pytest

from neural_arch.distributed.testing import run_mpiexec

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(90)]

SCRIPT = """
import neural_arch.distributed as dist
for world_size in (3, 0):
    try:
        dist.init_process_group("mpi", world_size=world_size)
    except ValueError as exc:
        print(f"ERR{world_size}: {exc}", flush=True)
"""


def test_wrong_world_size_under_mpiexec_names_both_values(tmp_path):
    script = tmp_path / "ws.py"
    script.write_text(SCRIPT)
    done = run_mpiexec(script, 2, timeout=80)
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout  # two ranks print at once: count messages, lines may be joined
    assert out.count("world_size=3 but MPI started 2 processes") == 2, out
    assert out.count("or start with mpiexec -n 3") == 2, out
    assert out.count("world_size=0 but MPI started 2 processes") == 2, out
    assert "mpiexec -n 0" not in out
