"""Under mpiexec, MPI decides rank and world size. As in torch (whose MPI tutorial passes
``rank=0, world_size=0``), an explicit rank or world_size given to ``init_process_group("mpi")`` is
ignored with a warning that says so, and the world is MPI's."""
import pytest

from neural_arch.distributed.testing import run_mpiexec

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(90)]

SCRIPT = """
import warnings
import neural_arch.distributed as dist
for kwargs in ({"world_size": 3}, {"rank": 0, "world_size": 0}):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist.init_process_group("mpi", **kwargs)
    said = [str(w.message) for w in caught if "are ignored" in str(w.message)]
    print(f"KW{sorted(kwargs.items())} world={dist.get_world_size()} rank={dist.get_rank()} warned={len(said)}",
          said[0] if said else "", flush=True)
    dist.destroy_process_group()
"""


def test_explicit_rank_and_world_size_are_ignored_under_mpi_with_a_warning(tmp_path):
    script = tmp_path / "ws.py"
    script.write_text(SCRIPT)
    done = run_mpiexec(script, 2, timeout=80)
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout  # two ranks print at once: count messages, lines may be joined
    assert out.count("world=2") == 4 and out.count("warned=1") == 4, out
    assert out.count("rank=None and world_size=3 are ignored; the MPI runtime assigns them") == 2, out
    assert out.count("rank=0 and world_size=0 are ignored") == 2, out
    assert "rank=0 warned" in out and "rank=1 warned" in out, out
