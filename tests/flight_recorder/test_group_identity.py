"""Group identity: every group's records carry an id that is the same on each member and differs
between groups with the same members (torch's ``pg_name``), so the analyzer gives the verdict where
records without ids could only say "not compared" or "may be the old group's", and the stall
inspector's keys of two such groups never meet.

Three real gloo ranks (one pool): a sub-group [1, 2] made first (rank 0 is outside it: the names must
still agree on the members), then two groups [0, 1]; rank 1 skips an all_reduce on the second one.
The generated cases (restarts, twin groups, with and without ids) are ``test_analyzer_explore.py``'s.
"""

from __future__ import annotations

import copy

import group_identity_fns as fns
import numpy as np
import pytest

from neural_arch.distributed.flight_recorder import analyze, buffer, load_dumps
from neural_arch.distributed.testing import RankPool

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def pool():
    with RankPool(3, backend="gloo", timeout=60.0, env={"NEURAL_ARCH_GLOO_TRANSPORT": "tcp"}) as p:
        yield p


def test_the_analyzer_names_which_of_two_same_member_groups_split(pool, tmp_path):
    ids = pool.run(fns.twin_pairs, str(tmp_path))
    # the same id on every member, another for every group (rank 0 is outside [1, 2], made first)
    assert ids[0]["first"] == ids[1]["first"] and ids[0]["second"] == ids[1]["second"], ids
    assert ids[1]["odd"] == ids[2]["odd"] and ids[0]["odd"] is None and ids[2]["first"] is None, ids
    assert len({ids[0]["world"], ids[1]["odd"], ids[0]["first"], ids[0]["second"]}) == 4, ids
    assert len({i["world"] for i in ids}) == 1, ids
    dumps = load_dumps(str(tmp_path))
    assert sorted(d["rank"] for d in dumps) == [0, 1, 2]
    v = analyze(dumps, world_size=3)
    report = v.report()
    second = ids[0]["second"]
    assert v.mixed == {} and v.maybe_old == {} and len(v.divergences) == 1, report
    d = v.first
    assert (d.group, d.group_id, d.seq, d.kind, d.behind, d.expected_ranks) == ((0, 1), second, 2, "behind", {1: 1},
                                                                                 [0]), report
    assert (d.expected["op"], d.expected["group_id"]) == ("all_reduce", second), report
    assert f"group [0, 1] ({second}): histories differ first at #2: ranks [0] called all_reduce #2" in report, report
    # both groups [0, 1] completed their #1; the first its #2 too (keyed by members and id: they share members)
    assert v.last_completed[((0, 1), second)][0] == 1 and v.last_completed[((0, 1), ids[0]["first"])][0] == 2, report
    assert v.last_completed[(0, 1, 2)][0] >= 1, report      # the world's key is its members (no other group has them)
    # the same dumps without ids (as written before records had them): the two groups cannot be told apart
    bare = copy.deepcopy(dumps)
    for dump in bare:
        for e in dump["entries"]:
            e.pop("group_id")
    old = analyze(bare, world_size=3)
    assert old.mixed == {(0, 1): [0]} and old.divergences == [], old.report()


def test_the_stall_inspector_keys_groups_by_their_id():
    from neural_arch.distributed.comm.local import LocalBackend
    from neural_arch.distributed.comm.work import OpInfo
    from neural_arch.distributed.stall import StallInspector

    class Store(dict):
        def set(self, key, value):
            self[key] = value.encode()

        def check(self, keys):
            return all(k in self for k in keys)

        def get(self, key):
            return self[key]

    store, group = Store(), [0, 1]
    ins = StallInspector(warning_s=1.0, store=store, rank=0, namespace="t", interval=10)
    assert ins._key(group, 1, "pg1/group2") != ins._key(group, 1, "pg1/group3") != ins._key(group, 1)
    # rank 1 waits at #4 of the *other* group with these members: it has not arrived in this one
    store.set(ins._key(group, 1, "pg1/group3"), "4 all_reduce")
    runner = LocalBackend()
    runner.group_id = "pg1/group2"
    report = ins._report(OpInfo("all_reduce", 4, group, 0), 2.0, runner)
    assert report.missing == [1] and report.waiting == [0], report.message
    assert store.check([ins._key(group, 0, "pg1/group2")])     # what this rank published carries its id
    store.set(ins._key(group, 1, "pg1/group2"), "4 all_reduce")
    assert ins._report(OpInfo("all_reduce", 4, group, 0), 2.0, runner).missing == [], report.message


def test_a_fault_tolerant_replica_group_is_named_by_its_quorum(tmp_path):
    from neural_arch.distributed.ft.replica_group import ProcessGroupGloo
    from neural_arch.distributed.rendezvous.file_store import FileStore

    store = FileStore(str(tmp_path / "store"), 1)
    pg = ProcessGroupGloo(timeout=5.0, transport="tcp")
    try:
        for quorum in (3, 4):                       # a new quorum of the same replicas: another group
            pg.configure(store, f"ft/pg/{quorum}/", rank=0, world_size=1)
            assert pg.backend.group_id == f"ft/pg/{quorum}"
    finally:
        pg.shutdown()


def test_a_sub_communicator_is_named_after_its_parent_and_a_record_carries_the_id():
    from neural_arch.distributed.comm.local import LocalBackend

    parent = LocalBackend()
    parent.group_id = "pg1/WORLD"
    assert [parent.new_group([0]).group_id for _ in range(2)] == ["pg1/WORLD.1", "pg1/WORLD.2"]
    assert LocalBackend().new_group([0]).group_id is None      # an unnamed parent names nothing
    rec = buffer.FlightRecorder(size=4)
    rec.ring.append(rec.record(parent._fr_group, 1, "all_reduce", (2,), "float64", "sum", None))
    assert rec.snapshot()[0]["group_id"] == "pg1/WORLD"
    parent.allreduce(np.ones(2))                    # the backend's own record (the recorder is on by default)
    assert buffer.RECORDER.snapshot()[-1]["group_id"] == "pg1/WORLD"


def test_an_op_says_which_of_two_same_member_groups_it_waits_in(pool):
    """MPI jobs have no store: a stalled rank asks its peers what they wait in and compares the
    answers (``progress.where``) with its own op. Two groups with the same members and the same
    sequence number read as one place unless the op carries the group's id: every op's ``OpInfo``
    holds the backend's ``GroupIdentity`` (the general path and the fused all_reduce alike)."""
    out = pool.run(fns.where_in_twins)
    assert out[2] is None and out[0] is not None
    (first, first_fast, first_other), (second, second_fast, second_other) = out[0]
    assert first != second and out[0] == out[1], out          # one id per group, the same on both members
    assert f"on group {first} [0, 1]" in first_fast and f"on group {first} [0, 1]" in first_other, out
    assert f"on group {second} [0, 1]" in second_fast and f"on group {second} [0, 1]" in second_other, out
    # the same op at the same number in the other group is another place (before: equal strings)
    assert first_other.replace(first, second) == second_other and first_other != second_other, out
