"""FSDP's releasable host buffers (fsdp/storage.py): memory given back under live views is
reported to tracemalloc only while in use, the views stay valid, and rewritten values read back."""

import mmap
import tracemalloc

import numpy as np
import pytest

from neural_arch.distributed.fsdp import storage

pytestmark = pytest.mark.skipif(not storage._CAN_RELEASE, reason="no mmap.madvise(MADV_DONTNEED) here")


@pytest.fixture
def traced():
    was = tracemalloc.is_tracing()
    tracemalloc.start()
    yield lambda: tracemalloc.get_traced_memory()[0]
    if not was:
        tracemalloc.stop()


def test_release_under_a_view_then_restore(traced):
    base = traced()
    a = storage.empty(1 << 18, np.float32)            # 1 MiB
    assert storage.is_releasable(a) and traced() - base >= a.nbytes
    a[:] = 3.0
    view = a[1000:1010]                               # what a saved graph node would hold
    assert storage.release(a) and not storage.is_resident(a)
    assert traced() - base < a.nbytes // 8            # reported as given back
    assert view.shape == (10,) and view.base is a     # still a view of the (released) array
    storage.restore(a)
    a[:] = 5.0
    assert storage.is_resident(a) and traced() - base >= a.nbytes and (view == 5.0).all()


def test_release_range_gives_back_whole_pages_only(traced):
    a = storage.empty(1 << 16, np.float64)            # 512 KiB
    a[:] = 1.0
    per_page = mmap.PAGESIZE // a.itemsize
    start, stop = per_page // 2, 3 * per_page + 7     # two whole pages inside: [page 1, page 3)
    got = storage.release_range(a, start, stop)
    assert got == 2 * mmap.PAGESIZE and storage.resident_nbytes(a) == a.nbytes - got
    assert (a[:per_page] == 1.0).all() and (a[3 * per_page:] == 1.0).all()   # neighbours untouched
    storage.restore(a)
    a[per_page:3 * per_page] = 2.0
    assert storage.resident_nbytes(a) == a.nbytes and (a[per_page:3 * per_page] == 2.0).all()


def test_small_arrays_are_plain_and_mappings_untrack_when_gone(traced):
    small = storage.empty(10, np.float32)
    assert not storage.is_releasable(small) and not storage.release(small) and storage.is_resident(small)
    base = traced()
    a = storage.empty(1 << 18, np.float32)
    view = a[5:]
    del a
    assert traced() - base >= view.nbytes              # the view keeps the mapping alive
    del view
    assert traced() - base < 1 << 16                   # and then it is reported freed
    again = storage.empty(1 << 18, np.float32)         # its mapping is reused (no fresh page faults)
    assert storage.is_releasable(again) and traced() - base >= again.nbytes
