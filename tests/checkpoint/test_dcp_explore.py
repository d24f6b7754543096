"""Exploring property tests for silent wrong results in distributed checkpoints (4 gloo ranks, one
RankPool): a DTensor weight, its Adam moments, a replicated bias and plain values saved under one
mesh and placements load under another bitwise (``dcp_explore_rank_fns``); loads that do not match
the checkpoint raise naming the key; a state dict whose paths collide as dotted keys is refused.
Pinned ``@example`` s are the cases that once failed (see each test's docstring).
"""

import itertools

import dcp_explore_rank_fns as fns
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import neural_arch.distributed.checkpoint as dcp
from neural_arch.distributed.testing import RankPool

pytestmark = pytest.mark.timeout(300)

MESHES = [(4,), (2, 2)]
_COUNTER = itertools.count()


@pytest.fixture(scope="module")
def pool():
    with RankPool(4, backend="gloo", timeout=120.0) as p:
        yield p


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("dcp_explore")


@st.composite
def placements(draw, mesh, ndim: int):
    out, used = [], set()
    for _ in mesh:
        code = draw(st.sampled_from(["R"] + [f"S{d}" for d in range(ndim) if d not in used]))
        if code != "R":
            used.add(int(code[1:]))
        out.append(code)
    return out


@st.composite
def reshard_case(draw):
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.sampled_from([0, 1, 2, 3, 5])) for _ in range(ndim))
    save_mesh, load_mesh = draw(st.sampled_from(MESHES)), draw(st.sampled_from(MESHES))
    return {"save_mesh": save_mesh, "save": draw(placements(save_mesh, ndim)), "load_mesh": load_mesh,
            "load": draw(placements(load_mesh, ndim)), "shape": shape,
            "dtype": draw(st.sampled_from(["float32", "float64"])), "seed": draw(st.integers(0, 2**16))}


def _save_and_load(pool, root, case):
    directory = str(root / f"c{next(_COUNTER)}")
    assert all(pool.run(fns.save_case, case, directory))
    for rank, bad in enumerate(pool.run(fns.load_case, case, directory)):
        assert bad == [], f"rank {rank}: {bad[:3]}"
    return directory


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=reshard_case())
# an empty DTensor shard (or an empty global array) made save crash in the replica check:
# memoryview.cast refuses a zero in the shape (TypeError instead of a checkpoint)
@example(case={"save_mesh": (4,), "save": ["S1"], "load_mesh": (2, 2), "load": ["R", "S0"], "shape": (0, 1),
               "dtype": "float64", "seed": 24})
@example(case={"save_mesh": (2, 2), "save": ["S0", "R"], "load_mesh": (4,), "load": ["S1"], "shape": (3, 5),
               "dtype": "float32", "seed": 1})  # uneven both ways: ranks hold 2, 1, 0 rows
def test_dtensor_state_saved_under_one_layout_loads_under_another_bitwise(pool, root, case):
    _save_and_load(pool, root, case)


def test_mismatched_loads_raise_naming_the_key(pool, root):
    """Shape, missing key and dtype raise naming the key; strict=False skips a missing key only.
    An array (a model's parameter, a DTensor piece) where the checkpoint has a plain number was
    silently *replaced* in the dict, leaving the caller's array unloaded: now it raises."""
    case = {"save_mesh": (2, 2), "save": ["S0", "S1"], "load_mesh": (4,), "load": ["S0"], "shape": (5, 3),
            "dtype": "float32", "seed": 3}
    directory = _save_and_load(pool, root, case)
    out = pool.run(fns.load_mismatch, case, directory)
    assert all(o == out[0] for o in out)
    out = out[0]
    assert "'model.w'" in out["shape"] and "(5, 3)" in out["shape"] and "(6, 3)" in out["shape"], out
    assert out["missing"].startswith("CheckpointMismatchError") and "'model.extra'" in out["missing"], out
    assert "'model.bias'" in out["dtype"] and "float16" in out["dtype"], out
    assert out["array_for_number"].startswith("CheckpointMismatchError") and "'epoch'" in out["array_for_number"], out
    assert out["non_strict_extra_untouched"] == "[0.0, 0.0]" and out["non_strict_bias_loaded"] == "True", out


@pytest.mark.parametrize("state", [
    {"a.b": np.ones(2), "a": {"b": np.zeros(2)}},         # a dotted name and a nested dict
    {"0": np.ones(2), 0: np.zeros(2)},                     # str and int keys of one dict
    {"a": [np.ones(2), np.zeros(2)], "a.1": np.full(2, 5.0)},  # a list index and a dotted name
], ids=["dotted-vs-nested", "str-vs-int", "list-vs-dotted"])
def test_colliding_dotted_keys_are_refused_not_merged(tmp_path, state):
    """Two paths joining to one dotted key shared one slot: save wrote one of them and load gave
    both that one's values, exit 0. Now save and load raise (torch's "duplicated flatten key")."""
    with pytest.raises(ValueError, match="duplicated flatten key"):
        dcp.save(state, checkpoint_id=str(tmp_path / "ck"))
    dcp.save({"a": {"b": np.ones(2)}}, checkpoint_id=str(tmp_path / "ok"))
    with pytest.raises(ValueError, match=r"duplicated flatten key 'a\.b'"):
        dcp.load({"a.b": np.zeros(2), "a": {"b": np.zeros(2)}}, checkpoint_id=str(tmp_path / "ok"))


def test_a_number_loads_into_a_0d_array_in_place(tmp_path):
    """A plain saved number still fills a 0-d array leaf (in place) and replaces a plain leaf."""
    dcp.save({"step": 7, "lr": 0.5}, checkpoint_id=str(tmp_path / "ck"))
    step = np.array(0)
    sd = {"step": step, "lr": 0.0}
    dcp.load(sd, checkpoint_id=str(tmp_path / "ck"))
    assert sd["step"] is step and int(step) == 7 and sd["lr"] == 0.5


@pytest.mark.parametrize("state", [
    {"w": np.zeros(3), "renamed": np.zeros(2)},   # a key the checkpoints lack
    {"w": np.zeros(4)},                           # a changed shape
    {"w": np.zeros(3, dtype=np.float32)},         # a changed dtype
], ids=["missing-key", "shape", "dtype"])
def test_load_latest_raises_on_a_state_dict_that_does_not_fit(tmp_path, state):
    """load_latest skipped every checkpoint on *any* CheckpointError: a state dict that did not fit
    fell back through the older checkpoints and returned None (resume from scratch, exit 0), with
    arrays left holding a mix of what each attempt had read. A mismatch now raises; corrupt
    checkpoints are still skipped."""
    mgr = dcp.CheckpointManager(str(tmp_path), keep_last=3)
    for step in (1, 2):
        mgr.save({"w": np.full(3, float(step))}, step=step)
    with pytest.raises(dcp.CheckpointMismatchError, match="'(w|renamed)'"):
        mgr.load_latest(state)
    (tmp_path / "step_00000002" / ".metadata").write_text("{ not json")   # corrupt: skipped, as before
    got = {"w": np.zeros(3)}
    assert mgr.load_latest(got) == 1 and got["w"].tolist() == [1.0, 1.0, 1.0]


def test_a_mismatch_raises_before_anything_is_loaded(tmp_path):
    """Every leaf is checked against the checkpoint before any is filled (torch plans the whole
    load first): keys sorted before the bad one were filled, then the load raised, leaving the
    state dict half old, half new."""
    dcp.save({"a": np.ones(2), "b": np.ones(3), "c": 5}, checkpoint_id=str(tmp_path / "ck"))
    for bad in ({"b": np.zeros(4)}, {"b": np.zeros(3, dtype=np.float32)}, {"z_missing": np.zeros(1)},
                {"c": np.zeros(2)}):
        sd = {"a": np.zeros(2), "b": np.zeros(3), "c": 0, **bad}
        with pytest.raises(dcp.CheckpointMismatchError):
            dcp.load(sd, checkpoint_id=str(tmp_path / "ck"))
        untouched_c = isinstance(sd["c"], np.ndarray) or sd["c"] == 0   # "c" is the bad leaf in one case
        assert sd["a"].tolist() == [0.0, 0.0] and untouched_c, sd
