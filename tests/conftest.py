"""Suite-wide test settings.

* hypothesis: the "ci" profile (default) is deterministic (``derandomize``) with no deadline,
  so a run on a loaded 2-core machine neither flakes nor times out; ``HYPOTHESIS_PROFILE=dev``
  explores more and randomly.
* markers ``mpi`` and ``gpu`` skip cleanly, with the reason, where mpiexec or a GPU is missing
  (the one owner of that skip: tests that start a script under mpiexec use ``run_mpiexec`` and the marker).
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", deadline=None, derandomize=True, max_examples=25, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.register_profile(
    "dev", deadline=None, max_examples=200,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def _mpi_skip_reason():
    from neural_arch.distributed.testing import MPI_MISSING, mpiexec_path

    return None if mpiexec_path() else MPI_MISSING


def _gpu_skip_reason():
    from neural_arch.backend import gpu_unavailable_reason

    return gpu_unavailable_reason()


def pytest_collection_modifyitems(config, items):
    reasons = {}
    for item in items:
        for marker, probe in (("mpi", _mpi_skip_reason), ("gpu", _gpu_skip_reason)):
            # get_closest_marker, not item.keywords: directory names (tests/gpu) are keywords too
            if item.get_closest_marker(marker) is not None:
                if marker not in reasons:
                    reasons[marker] = probe()
                if reasons[marker]:
                    item.add_marker(pytest.mark.skip(reason=reasons[marker]))
