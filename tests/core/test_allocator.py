"""neural_arch/allocator.py: importing neural_arch keeps a step's temporaries in the heap on glibc (a
freed activation-sized array is not page-faulted in again on the next step), and NEURAL_ARCH_MALLOC_TUNE=0
leaves glibc's thresholds alone."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc thresholds only")

# Page faults of a step-like pattern after neural_arch's import: ten 4 MiB activations alive at once,
# then all freed (the heap's top above glibc's default trim threshold), ten times.
PROBE = """
import resource, numpy as np, neural_arch, neural_arch.allocator as allocator
def step():
    held = [np.ones(1 << 19) for _ in range(10)]   # 40 MiB, touched
    return sum(float(a[0]) for a in held)          # then all freed
step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    step()
print(allocator.TUNED, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _probe(**env) -> tuple[str, int]:
    from neural_arch.distributed.testing import script_env

    out = subprocess.run([sys.executable, "-c", PROBE], check=True, capture_output=True, text=True, timeout=60,
                         env=script_env(env)).stdout.split()
    return out[0], int(out[1])


def test_import_keeps_freed_arrays_in_the_heap_unless_turned_off():
    tuned, faults = _probe()
    untuned, untuned_faults = _probe(NEURAL_ARCH_MALLOC_TUNE="0")
    assert (tuned, untuned) == ("True", "False")
    # untuned, glibc gives the freed top of the heap back and faults it in again every step (10 x 10 x 1024
    # pages); tuned, the pages stay
    print(f"minor page faults over 10 steps: tuned {faults}, untuned {untuned_faults}")
    assert untuned_faults > 10 * faults and untuned_faults > 10_000, (faults, untuned_faults)
