"""Rank-pool fixtures for the distributed tests.

``pool`` is module-scoped and parametrised over (backend variant, world size): the ranks
start once per configuration per test module and every hypothesis example of that module
runs through them (a process start costs about a second on these machines).

Backend variants: ``gloo-tcp`` and ``gloo-shm`` (the gloo backend with its transport forced),
``gloo-pipe-tcp`` / ``gloo-pipe-shm`` (ring / chain algorithms forced, 64-byte pipeline segments),
``mpi`` (ranks under a real ``mpiexec``, marked ``mpi``: skipped where mpi4py/mpiexec is missing).
Select fewer with ``-k`` (e.g. ``-k "mpi"``) or the env var NEURAL_ARCH_TEST_BACKENDS=gloo-tcp,mpi.
"""

from __future__ import annotations

import os

import pytest

from neural_arch.distributed.testing import RankPool

# The bandwidth algorithms (ring all_reduce / reduce, pipelined chain broadcast) only switch on
# from hundreds of KiB, far above the shapes hypothesis draws: the "pipe" variants force them and
# stream in 64-byte segments, so the oracle also checks the ring and pipelined code paths.
_PIPELINED = {"NEURAL_ARCH_GLOO_ALGO": "ring,chain", "NEURAL_ARCH_GLOO_SEGMENT_BYTES": "64"}
VARIANTS = {
    "gloo-tcp": ("gloo", {"NEURAL_ARCH_GLOO_TRANSPORT": "tcp"}),
    "gloo-shm": ("gloo", {"NEURAL_ARCH_GLOO_TRANSPORT": "shm"}),
    "gloo-pipe-tcp": ("gloo", dict(_PIPELINED, NEURAL_ARCH_GLOO_TRANSPORT="tcp")),
    "gloo-pipe-shm": ("gloo", dict(_PIPELINED, NEURAL_ARCH_GLOO_TRANSPORT="shm")),
    "mpi": ("mpi", {}),
}
SIZES = {"gloo-tcp": (1, 2, 3, 4, 5), "gloo-shm": (2, 3, 4, 5), "gloo-pipe-tcp": (3,), "gloo-pipe-shm": (4,),
         "mpi": (1, 2, 3, 4, 5)}


def _configs():
    chosen = os.environ.get("NEURAL_ARCH_TEST_BACKENDS", "").strip()
    names = [n.strip() for n in chosen.split(",") if n.strip()] or list(VARIANTS)
    params = []
    for name in names:
        for n in SIZES[name]:
            marks = [pytest.mark.mpi] if name == "mpi" else []
            params.append(pytest.param((name, n), id=f"{name}-{n}", marks=marks))
    return params


CONFIGS = _configs()


@pytest.fixture(scope="module", params=CONFIGS)
def pool(request):
    """A started RankPool for one (variant, world size); ``pool.variant`` names the variant."""
    name, n = request.param
    backend, env = VARIANTS[name]
    with RankPool(n, backend=backend, env=env, timeout=60.0) as p:
        p.variant = name
        yield p


def _job_vars() -> list:
    """Variables by which a launcher, mpiexec or SLURM describe a job (the harness's one list, plus
    the MPI identity variables set right now): in-process tests of init_process_group() must not
    inherit them from whatever started pytest."""
    from neural_arch.distributed.launch_env import MPI_ENV_PREFIXES
    from neural_arch.distributed.testing import LAUNCHER_VARS

    return [*LAUNCHER_VARS, *(k for k in os.environ if k.startswith(MPI_ENV_PREFIXES))]


@pytest.fixture
def clean_job_env(monkeypatch):
    """No job variables, and no process group left behind by a test (use with ``usefixtures``)."""
    import neural_arch.distributed as dist

    for var in _job_vars():
        monkeypatch.delenv(var, raising=False)
    if dist.is_initialized():
        dist.destroy_process_group()
    yield
    if dist.is_initialized():
        dist.destroy_process_group()
