"""The direct shared-memory collectives (comm/gloo/shm_direct.py) over real processes.

Oracle checks with tiny chunks (many pipelined chunks per op, every buffer reuse pattern), the same
bits on every rank, mismatched collectives as errors on every rank, and dead / stopped peers as
errors naming the op, its number and the missing rank within the timeout.
"""

import os
import re

import gloo_checks as C
import gloo_procs
import pytest
import shm_direct_procs as D

from neural_arch.distributed.comm.gloo import shm_direct
from neural_arch.distributed.comm.gloo.transport.shm_segment import direct_supported
from neural_arch.distributed.testing import RankPool

pytestmark = [pytest.mark.latency_bound, pytest.mark.timeout(90),
              pytest.mark.skipif(not direct_supported(), reason="direct shm collectives need Linux on x86-64")]

# 4 KiB chunks: a 40000-element float64 buffer runs ~80 pipelined chunks
_ENV = {"GLOO_TEST_TRANSPORT": "shm", "GLOO_TEST_TIMEOUT": "20", "NEURAL_ARCH_SHM_CHUNK_BYTES": "4096"}


@pytest.fixture(scope="module", params=[2, 3, 5], ids=lambda s: f"shm-direct-{s}")
def pool(request):
    with RankPool(request.param, backend="gloo", init=False, timeout=60, env=_ENV) as p:
        yield p


def test_direct_path_is_active_and_segment_unlinked(pool):
    assert pool.run(D.uses_direct) == [True] * pool.world_size
    assert pool.run(D.segment_files) == [[]] * pool.world_size, "a segment file was left in /dev/shm"


def test_mixed_sequence_matches_numpy_and_every_rank_gets_the_same_bits(pool):
    out = pool.run(D.mixed_sequence, 3, 60)
    assert all(o == out[0] for o in out), "ranks got different bytes"


def test_every_op_and_dtype_across_chunk_boundaries(pool):
    calls = []
    for i, dtype in enumerate(C.DTYPES):
        for op in C.ops_for(dtype):
            for shape in [(), (1,), (1023,), (1024,), (1025,), (3, 700), (20001,)]:
                calls.append(("check_allreduce", (i, shape, dtype, op, "direct")))
        for shape in [(1,), (513,), (4000,)]:
            calls.append(("check_reduce_scatter", (i, shape, dtype, "sum")))
            calls.append(("check_allgather", (i, shape, dtype)))
            calls.append(("check_broadcast", (i, shape, dtype, pool.world_size - 1)))
    calls.append(("check_bool", (3,)))
    assert pool.run(gloo_procs.run_checks, calls) == [["ok"] * len(calls)] * pool.world_size


def test_subgroups_map_their_own_segment_at_their_first_direct_collective(pool):
    """A same-host sub-group (every rank but rank 0; both on 2 ranks) runs the direct path like the
    world -- lazily: nothing mapped at new_group -- equal to NumPy, and bitwise equal to the ring plan
    for integers, a nested sub-group too; its segment leaves no file behind."""
    calls = [("check_allreduce", (11, (20001,), "float64", "sum", None)),
             ("check_allreduce", (12, (3,), "int32", "max", None)),
             ("check_reduce_scatter", (13, (4000,), "float32", "sum")),
             ("check_allgather", (14, (513,), "int64")),
             ("check_broadcast", (15, (4000,), "float16", 1))]
    out = pool.run(D.subgroup_checks, calls)
    members = [o for o in out if o is not None]
    assert len(members) == (pool.world_size - 1 if pool.world_size > 2 else 2)
    assert members == [(False, "direct", True, ["ok"] * len(calls))] * len(members)
    for rows in filter(None, pool.run(D.subgroup_direct_equals_ring, 5)):
        assert rows[0] == (len(members), True, True)
        assert all(equal for _, _, equal in rows), rows
    assert pool.run(D.segment_files) == [[]] * pool.world_size, "a segment file was left in /dev/shm"


def test_float_sum_is_bitwise_identical_on_every_rank(pool):
    for n in (100, 30000):
        out = pool.run(D.float_sum_bits, n)
        assert all(o == out[0] for o in out)


@pytest.mark.parametrize("kind", ["op", "dtype", "size", "size_large", "root", "reduce_op", "order"])
def test_mismatch_is_an_error_on_every_rank(kind):
    with RankPool(3, backend="gloo", init=False, timeout=60, env=dict(_ENV, GLOO_TEST_TIMEOUT="10")) as p:
        results = p.run_detailed(D.mismatch, kind)
    outcomes = [r.value if r.ok else (r.exc_type, r.error) for r in results]
    for rank, (kind_name, msg) in enumerate(outcomes):
        assert kind_name in ("CollectiveMismatchError", "GroupPoisonedError"), (rank, outcomes)
    # the ranks that saw the table name the op, its sequence number and both sides
    direct = [msg for kind_name, msg in outcomes if kind_name == "CollectiveMismatchError"]
    assert direct, outcomes
    assert all("#2" in m and "rank 0:" in m and "rank 1:" in m for m in direct), direct


@pytest.mark.parametrize("how,nbytes", [("kill", 1 << 10), ("kill", 1 << 20), ("stop", 1 << 20)])
def test_dead_or_stopped_peer_is_an_error_on_every_rank(how, nbytes, tmp_path):
    timeout = 2    # a stopped peer is only seen by the timeout: the test waits it out once
    with RankPool(3, backend="gloo", init=False, timeout=60,
                  env=dict(_ENV, GLOO_TEST_TIMEOUT=str(timeout))) as p:
        results = p.run_detailed(D.kill_or_stop_last, how, nbytes, timeout + 8.0, str(tmp_path))
    for r in results[:2]:
        assert r.ok, results
        kind, msg, waited = r.value
        assert "all_reduce #2" in msg and re.search(r"ranks? \[?2\b", msg), msg
        if how == "kill":
            assert kind in ("PeerFailureError", "GroupPoisonedError"), (kind, msg)
            assert waited < 2.5, (kind, msg, waited)
        else:
            assert kind in ("CollectiveTimeoutError", "GroupPoisonedError"), (kind, msg)
            assert timeout - 0.5 < waited < timeout + 5, (kind, msg, waited)
    assert any(r.value[0] in ("PeerFailureError", "CollectiveTimeoutError") for r in results[:2]), results


def test_a_failure_wakes_a_rank_waiting_in_a_subgroup_barrier():
    """Rank 0 fails (rank 2 died) in a world op while rank 1 waits for it in the sub-group [0, 1]'s
    shared-memory barrier: rank 0 poisons every segment of its process, so rank 1 fails at once naming
    its op and the first failure, not after the 10 s timeout."""
    with RankPool(3, backend="gloo", init=False, timeout=60, env=dict(_ENV, GLOO_TEST_TIMEOUT="10")) as p:
        results = p.run_detailed(D.kill_while_peer_waits_in_subgroup)
    assert results[0].ok and results[1].ok, results
    kind0, msg0, waited0 = results[0].value
    assert kind0 == "PeerFailureError" and "all_reduce #2" in msg0 and waited0 < 2.5, results[0].value
    kind1, msg1, waited1 = results[1].value
    assert kind1 == "GroupPoisonedError" and waited1 < 2.5, results[1].value
    assert "all_reduce #3" in msg1 and "rank 2" in msg1, msg1   # its own op, and the root cause


def test_selection_table_is_printable_and_total():
    text = shm_direct.format_table()
    assert "world size" in text and "direct" in text
    for world in (2, 3, 4, 8, 16):
        for nbytes in (0, 1, 4096, 1 << 20, 1 << 30):
            assert shm_direct.choose(world, nbytes) in ("direct", "plans")


def test_direct_off_runs_the_plans_over_the_rings():
    """NEURAL_ARCH_GLOO_DIRECT=0 keeps the ring/tree plans over the shm rings (still correct)."""
    env = dict(_ENV, NEURAL_ARCH_GLOO_DIRECT="0")
    calls = [("check_allreduce", (1, (5000,), "float32", "sum", None)),
             ("check_broadcast", (2, (3000,), "int64", 1)),
             ("check_allgather", (3, (700,), "float64")),
             ("check_reduce_scatter", (4, (900,), "int32", "max"))]
    with RankPool(3, backend="gloo", init=False, timeout=60, env=env) as p:
        assert p.run(D.uses_direct) == [False] * 3
        assert p.run(gloo_procs.run_checks, calls) == [["ok"] * len(calls)] * 3


def test_stale_segment_of_a_dead_creator_is_removed(tmp_path):
    import subprocess
    import sys

    from neural_arch.distributed.comm.gloo.transport.shm import clean_stale_rings

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    pid = int(dead.stdout)
    stale = tmp_path / f"na-{pid}-deadbeef-coll"
    stale.write_bytes(b"\0" * 64)
    alive = tmp_path / f"na-{os.getpid()}-cafef00d-coll"
    alive.write_bytes(b"\0" * 64)
    removed = clean_stale_rings(str(tmp_path))
    assert str(stale) in removed and not stale.exists() and alive.exists()


def _two_segments():
    """Rank 0's and rank 1's ShmSegment over one anonymous mapping (one process, no waiting)."""
    import mmap

    from neural_arch.distributed.comm.gloo.transport import shm_segment as S

    nbytes = S.ShmSegment.nbytes_for(2, 4096, S.SMALL_BYTES)
    mm = mmap.mmap(-1, nbytes)
    hdr = memoryview(mm).cast("q")
    hdr[0], hdr[1], hdr[2], hdr[3] = S._MAGIC, 2, 4096, S.SMALL_BYTES
    hdr.release()
    return S.ShmSegment(mm, 0, 2, [3, 7]), S.ShmSegment(mm, 1, 2, [3, 7])


def test_sync_checks_words_names_both_sides_and_fails_on_poison():
    """ShmSegment.sync (words + barrier + check in one call: the small path) against a peer that has
    already arrived: equal words pass; a different byte count or root is a CollectiveMismatchError naming
    the op, each rank's side and the root; a poisoned group is a GroupPoisonedError naming the first failure."""
    import time

    from neural_arch.distributed.comm.debug import wire_word
    from neural_arch.distributed.comm.gloo.transport.shm_segment import pack_words
    from neural_arch.distributed.comm.work import OpInfo
    from neural_arch.distributed.errors import CollectiveMismatchError, GroupPoisonedError

    mine, peer = _two_segments()
    info = OpInfo("broadcast", 9, [3, 7], 3, (16,), "float32", 0, None, time.monotonic() + 5, wire=None)
    word = info.wire
    check = wire_word("debug check of broadcast", 9, None, None)   # >= 2**63: stored unsigned, as it is
    assert word == wire_word("broadcast", 9, "float32", None) and check >= 1 << 63
    peer.announce(0, check, 0, -1)
    peer.announce(1, word, 64, 1)
    peer._q[peer._my_arrive] = 2                         # the peer arrived at barriers 1 and 2
    mine.sync(0, check, pack_words(0, -1), info)         # same op, bytes and root: passes
    with pytest.raises(CollectiveMismatchError) as err:
        mine.sync(1, word, pack_words(64, 0), info)
    text = str(err.value)
    assert "broadcast #9" in text and "rank 3: broadcast #9 float32 (64 bytes) root 0" in text, text
    assert "rank 7: broadcast #9 float32 (64 bytes) root 1" in text, text
    peer.poison("rank 7 saw a bad frame")
    peer._q[peer._my_arrive] = 3
    with pytest.raises(GroupPoisonedError, match="rank 7 saw a bad frame"):
        mine.sync(0, word, pack_words(64, 0), info)
    mine.close(), peer.close()


def test_fused_all_reduce_builds_the_same_check_word_as_wire_word():
    """Backend.allreduce's fused path builds the OpInfo's wire word from a table; it must equal the
    word every other path computes (ranks on different paths compare them)."""
    from neural_arch.distributed.comm.backend import _FAST
    from neural_arch.distributed.comm.debug import _SEQ_MASK, wire_word

    for op, table in _FAST.items():
        for name, base in table.values():
            for seq in (1, 12345, (1 << 48) + 7):
                assert base | (seq & _SEQ_MASK) == wire_word("all_reduce", seq, name, op._value_)
