"""Single-process checkpoint tests: round trips, overlap arithmetic, verification, the manager,
and SIGKILL at random moments during save/async_save (the previous checkpoint always loads)."""

import json
import os
import pathlib
import random
import subprocess
import sys
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from polling import wait_for

from neural_arch.distributed import checkpoint as dcp
from neural_arch.distributed.checkpoint import CheckpointError, CheckpointManager, ShardedArray
from neural_arch.distributed.checkpoint.sharded import Region, copy_overlap

HERE = os.path.dirname(__file__)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(HERE)))


@st.composite
def _piece(draw, shape):
    """A random box or flat piece of an array of ``shape``."""
    if draw(st.booleans()):
        total = int(np.prod(shape))
        a = draw(st.integers(0, total))
        b = draw(st.integers(a, total))
        return Region(shape, flat_offset=a, flat_size=b - a)
    offs, sizes = [], []
    for n in shape:
        a = draw(st.integers(0, n))
        b = draw(st.integers(a, n))
        offs.append(a)
        sizes.append(b - a)
    return Region(shape, tuple(offs), tuple(sizes))


def _extract(full, region):
    if region.is_flat:
        return full.reshape(-1)[region.flat_offset:region.flat_offset + region.flat_size].copy()
    return np.array(full[tuple(slice(o, o + n) for o, n in zip(region.offsets, region.sizes))])


@given(st.lists(st.integers(1, 5), min_size=0, max_size=3).flatmap(
    lambda shape: st.tuples(st.just(tuple(shape)), _piece(tuple(shape)), _piece(tuple(shape)))))
def test_copy_overlap_matches_numpy_indexing(case):
    shape, src, dst = case
    full = np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape) + 1
    marker = np.zeros_like(full) - 1
    out = _extract(marker, dst)
    n = copy_overlap(src, _extract(full, src), dst, out)
    # oracle: positions of dst whose global index lies in src receive full's value
    inside = np.zeros(full.shape, dtype=bool)
    if src.is_flat:
        inside.reshape(-1)[src.flat_offset:src.flat_offset + src.flat_size] = True
    else:
        inside[tuple(slice(o, o + k) for o, k in zip(src.offsets, src.sizes))] = True
    expected = _extract(np.where(inside, full, marker), dst)
    assert np.array_equal(out, expected)
    assert n == int(_extract(inside, dst).sum())


@settings(deadline=None, max_examples=60)
@given(st.integers(1, 5), st.lists(st.tuples(st.integers(1, 40), st.integers(1, 300), st.integers(0, 31)),
                                   min_size=1, max_size=8))
def test_save_plan_writes_each_element_once_balanced_over_holders(world, arrays):
    """make_plan: every chunk is written by a rank that holds it, the chunks of each key tile it
    exactly, big replicated arrays are split into row blocks, and replicated bytes are balanced."""
    from neural_arch.distributed.checkpoint import plan as P

    plans = [{"arrays": [], "objects": {}} for _ in range(world)]
    holders = {}
    for i, (rows, cols, mask) in enumerate(arrays):
        ranks = [r for r in range(world) if mask >> r & 1] or [i % world]  # replicated over a random subset
        holders[f"a{i}"] = ranks
        for r in ranks:
            plans[r]["arrays"].append((f"a{i}", [f"a{i}"], [rows, cols], "<f8", {"offsets": [0, 0], "sizes": [rows, cols]}))
    entries, owners, _ = P.make_plan(plans)
    named = {c["name"]: c["rank"] for e in entries.values() for c in e["chunks"]}
    assert {name: w for pieces in owners.values() for w, name, _ in pieces} == named  # one story
    load = dict.fromkeys(range(world), 0)
    for i, (rows, cols, _) in enumerate(arrays):
        chunks = entries[f"a{i}"]["chunks"]
        covered = np.zeros((rows, cols), int)
        for c in chunks:
            assert c["rank"] in holders[f"a{i}"]
            covered[c["offsets"][0]:c["offsets"][0] + c["sizes"][0], :] += 1
            load[c["rank"]] += c["sizes"][0] * cols * 8
        assert (covered == 1).all()
        n = len(holders[f"a{i}"])
        big = rows * cols * 8 >= P.SPLIT_MIN_BYTES
        assert len(chunks) == (min(n, rows) if big and n > 1 else 1)
    everyone = [k for k, h in holders.items() if len(h) == world]
    if world > 1 and len(everyone) == len(arrays):  # all replicated everywhere: LPT's bound
        largest = max(c["sizes"][0] * c["sizes"][1] * 8 for e in entries.values() for c in e["chunks"])
        assert max(load.values()) - min(load.values()) <= largest


def test_plan_cache_reuses_the_plan_while_the_layout_holds(tmp_path):
    from neural_arch.distributed.checkpoint import api

    hits = api._plans.hits
    dcp.save({"w": np.ones(3), "step": 1}, tmp_path / "a")
    dcp.save({"w": np.zeros(3), "step": 2}, tmp_path / "b")   # same layout: cached plan
    dcp.save({"w": np.ones(4), "step": 3}, tmp_path / "c")    # new shape: planned again
    dcp.save({"w": np.ones(4), "epoch": 3}, tmp_path / "d")   # new plain key: planned again
    assert api._plans.hits - hits == 1
    for sub, want in (("a", (np.ones(3), 1)), ("b", (np.zeros(3), 2)), ("c", (np.ones(4), 3))):
        out = {"w": np.full_like(want[0], 7.0), "step": 0}
        dcp.load(out, tmp_path / sub)
        assert np.array_equal(out["w"], want[0]) and out["step"] == want[1]
    out = {"w": np.zeros(4), "epoch": 0}
    assert dcp.load(out, tmp_path / "d")["epoch"] == 3


def test_layout_digest_follows_every_layout_change():
    """The memoized digest (async_save's hot path) equals a fresh hash of each layout in turn,
    and describe hands out fresh JSON (a caller changing it cannot change the next plan)."""
    import hashlib

    from neural_arch.distributed.checkpoint import plan as plan_mod

    def fresh(plan):
        text = json.dumps([plan["arrays"], sorted(plan["objects"])], separators=(",", ":"), default=str)
        return hashlib.blake2b(text.encode(), digest_size=16).digest()

    layouts = [{"w": np.ones((4, 3)), "b": np.ones(3), "step": 1},
               {"w": np.ones((4, 3)), "b": np.ones(3), "step": 2},            # values only: same digest
               {"w": np.ones((4, 3), np.float32), "b": np.ones(3), "step": 1},  # dtype
               {"w": np.ones((3, 4)), "b": np.ones(3), "step": 1},            # shape
               {"w": ShardedArray(np.ones((2, 3)), (4, 3), offsets=(2, 0)), "b": np.ones(3), "step": 1},
               {"w": ShardedArray(np.ones((2, 3)), (4, 3), offsets=(0, 0)), "b": np.ones(3), "step": 1},
               {"w": np.ones((4, 3)), "b": np.ones(3), "epoch": 1},           # plain key
               {"w": np.ones((4, 3)), "b": np.ones(3), "step": 1}]            # back to the first
    digests = []
    for state in layouts:
        plan = plan_mod.describe(state)[2]
        digests.append(plan_mod._layout_digest(plan))
        assert digests[-1] == fresh(plan)
        plan["arrays"][0][4]["sizes"].append(99)  # the caller's copy only
    assert digests[0] == digests[1] == digests[-1] and len(set(digests)) == 6


def test_round_trip_nested_state(tmp_path):
    state = {"m": {"a.w": np.arange(6.0).reshape(2, 3), "i": np.arange(4, dtype=np.int32), "s": np.float32(2.5)},
             "o": {"state": {0: {"step": 4, "v": np.ones((2, 2))}}, "groups": [{"lr": 0.1, "betas": (0.9, 0.99)}]},
             "name": "run-1", "none": None}
    dcp.save(state, tmp_path)
    target = {"m": {"a.w": np.zeros((2, 3)), "i": np.zeros(4, np.int32), "s": np.float32(0)},
              "o": {"state": {}, "groups": [{"lr": 0.0, "betas": None}]}, "name": "", "none": 1}
    dcp.load(target, tmp_path)
    assert np.array_equal(target["m"]["a.w"], state["m"]["a.w"]) and target["m"]["i"].dtype == np.int32
    assert target["m"]["s"] == np.float32(2.5)
    assert target["o"]["state"][0]["step"] == 4 and np.array_equal(target["o"]["state"][0]["v"], np.ones((2, 2)))
    assert target["o"]["groups"][0] == {"lr": 0.1, "betas": (0.9, 0.99)}
    assert target["name"] == "run-1" and target["none"] is None


def test_load_errors_name_the_key(tmp_path):
    dcp.save({"w": np.ones(3)}, tmp_path)
    with pytest.raises(CheckpointError, match="'x' is not in the checkpoint"):
        dcp.load({"x": np.ones(3)}, tmp_path)
    with pytest.raises(CheckpointError, match="shape"):
        dcp.load({"w": np.ones(4)}, tmp_path)
    with pytest.raises(CheckpointError, match="float32"):
        dcp.load({"w": np.ones(3, np.float32)}, tmp_path)
    with pytest.raises(CheckpointError, match="metadata is missing"):
        dcp.load({"w": np.ones(3)}, tmp_path / "nothing")


def test_save_rejects_pieces_that_do_not_tile(tmp_path):
    with pytest.raises(CheckpointError, match="tile"):
        dcp.save({"w": ShardedArray(np.ones((2, 3)), (4, 3), offsets=(0, 0))}, tmp_path)
    with pytest.raises(ValueError, match="exactly one of"):
        ShardedArray(np.ones(3), (3,))


def test_corruption_is_detected(tmp_path):
    dcp.save({"w": np.arange(1000.0)}, tmp_path)
    meta = json.loads(pathlib.Path(tmp_path / ".metadata").read_text())
    (fname,) = meta["files"]
    path = tmp_path / fname
    blob = bytearray(path.read_bytes())
    blob[-8] ^= 0xFF  # flip bits inside the array data (the file keeps its size)
    path.write_bytes(bytes(blob))
    with pytest.raises(CheckpointError, match="checksum"):
        dcp.load({"w": np.zeros(1000)}, tmp_path)
    with pytest.raises(CheckpointError, match="checksum"):
        dcp.verify(tmp_path)
    dcp.load({"w": np.zeros(1000)}, tmp_path, verify=False)  # opt-out works
    path.write_bytes(bytes(blob[:-100]))
    with pytest.raises(CheckpointError, match="truncated"):
        dcp.load({"w": np.zeros(1000)}, tmp_path)


def test_overwriting_a_checkpoint_keeps_only_the_new_files(tmp_path):
    dcp.save({"w": np.ones(3)}, tmp_path)
    dcp.save({"w": np.full(3, 2.0)}, tmp_path)
    names = [n for n in os.listdir(tmp_path) if n.startswith("__")]
    assert len(names) == 1
    out = {"w": np.zeros(3)}
    dcp.load(out, tmp_path)
    assert out["w"].tolist() == [2.0] * 3


def test_async_save_copies_before_returning(tmp_path):
    w = np.ones(100_000)
    fut = dcp.async_save({"w": w}, tmp_path / "a")
    w[...] = 5.0  # training goes on and changes the array
    fut.result()
    out = {"w": np.zeros_like(w)}
    dcp.load(out, tmp_path / "a")
    assert (out["w"] == 1.0).all()
    # a second save waits for the first; both end up committed
    f1 = dcp.async_save({"w": w}, tmp_path / "b")
    f2 = dcp.async_save({"w": w * 2}, tmp_path / "c")
    assert f1.done()
    f2.result()
    dcp.verify(tmp_path / "b"), dcp.verify(tmp_path / "c")


def test_manager_keeps_last_k_and_the_best(tmp_path):
    mgr = CheckpointManager(tmp_path, keep_last=2, best_metric="val_loss", mode="min")
    losses = [5.0, 1.0, 3.0, 4.0, 2.5]
    for step, loss in enumerate(losses, start=1):
        mgr.save({"w": np.full(2, float(step))}, step=step, metrics={"val_loss": loss})
    assert [c[0] for c in mgr.checkpoints()] == [2, 4, 5]  # last two + the best (step 2)
    assert mgr.best()[0] == 2 and mgr.best()[2] == {"val_loss": 1.0}
    out = {"w": np.zeros(2)}
    assert mgr.load_latest(out) == 5 and out["w"][0] == 5.0
    assert mgr.load_best(out) == 2 and out["w"][0] == 2.0
    os.makedirs(mgr.path(9))  # a crashed save: no metadata, so never latest
    assert mgr.latest()[0] == 5
    mx = CheckpointManager(tmp_path, keep_last=None, best_metric="val_loss", mode="max")
    assert mx.best()[0] == 4  # kept: 2 (1.0), 4 (4.0), 5 (2.5)
    with pytest.raises(ValueError, match="keep_last"):
        CheckpointManager(tmp_path, keep_last=0)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_sigkill_during_save_leaves_a_loadable_latest(tmp_path, mode):
    """SIGKILL the writer at random moments; the latest listed checkpoint always loads, verifies
    and holds exactly its step's data (a few trials, each at a random moment)."""
    sys.path.insert(0, HERE)
    from crash_writer import state_for

    rng = random.Random(1234 if mode == "sync" else 4321)
    # the child imports this checkout even where the package is not installed (or installed elsewhere)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    seen_steps = 0
    for trial in range(3):
        directory = tmp_path / f"t{trial}"
        proc = subprocess.Popen([sys.executable, os.path.join(HERE, "crash_writer.py"), str(directory), mode],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        try:
            # Wait for a first commit (import time varies a lot on a loaded machine), then kill at
            # a random moment among the saves that follow.
            wait_for(lambda d=directory, p=proc: CheckpointManager(d).latest() is not None or p.poll() is not None,
                     60, interval=0.02)
            time.sleep(rng.random() * 1.5)  # the random kill moment is the test, not synchronisation
            proc.kill()
        finally:
            proc.wait(10)
        mgr = CheckpointManager(directory, keep_last=2)
        latest = mgr.latest()
        if latest is None:
            continue
        seen_steps += 1
        step, path, _ = latest
        dcp.verify(path)
        want = state_for(step)
        got = {"w": np.zeros_like(want["w"]), "b": np.zeros_like(want["b"]), "step": -1}
        assert mgr.load_latest(got) == step
        assert np.array_equal(got["w"], want["w"]) and np.array_equal(got["b"], want["b"]) and got["step"] == step
    assert seen_steps >= 1, "the writer never committed a checkpoint: raise the kill delay"
