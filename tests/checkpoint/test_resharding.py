"""Resharding matrix with real processes (gloo): save under one layout, load into every other.

Layouts: a single process, 2 ranks replicated (DDP-like), 2 and 3 ranks row-sharded, 2 and 3
ranks flat-sharded (FSDP-like). Every parameter, Adam state array, step counter and
hyper-parameter must come back bitwise equal in the loading layout's own view.
"""

import ckpt_rank_fns as fns
import numpy as np
import pytest

from neural_arch.distributed import checkpoint as dcp
from neural_arch.distributed.testing import RankPool

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def pools():
    with RankPool(2, backend="gloo", timeout=60.0) as p2, RankPool(3, backend="gloo", timeout=60.0) as p3:
        yield {2: p2, 3: p3}


def _run(pools, fn, layout, *args):
    world = fns.LAYOUTS[layout]
    if world == 1:
        return [fn(layout, *args)]
    return pools[world].run(fn, layout, *args)


@pytest.fixture(scope="module")
def saved(pools, tmp_path_factory):
    root = tmp_path_factory.mktemp("reshard")
    dirs = {}
    for i, layout in enumerate(fns.LAYOUTS):
        dirs[layout] = str(root / layout)
        assert all(_run(pools, fns.save_layout, layout, dirs[layout], i % 2 == 1))  # half of them async
    return dirs


@pytest.mark.parametrize("src", list(fns.LAYOUTS))
@pytest.mark.parametrize("dst", list(fns.LAYOUTS))
def test_any_layout_loads_any_other_bitwise(pools, saved, src, dst):
    for rank, diffs in enumerate(_run(pools, fns.load_layout, dst, saved[src])):
        assert diffs == [], f"{src} -> {dst}, rank {rank}: differs at {diffs}"


@pytest.mark.parametrize("src", ["rows3", "flat2"])
def test_fresh_optimizer_state_is_filled_from_a_sharded_checkpoint(pools, saved, src):
    for diffs in _run(pools, fns.load_layout, "ddp2", saved[src], True):
        assert diffs == []


def test_replicated_arrays_are_written_once_spread_over_ranks(saved):
    import json
    import os
    import pathlib

    meta = json.loads(pathlib.Path(os.path.join(saved["ddp2"], ".metadata")).read_text())
    per_file: dict[str, int] = {}
    for key, entry in meta["tensors"].items():
        for c in entry["chunks"]:
            per_file[c["file"]] = per_file.get(c["file"], 0) + c["nbytes"]
        if key == "buffers.table":  # 256 KiB: one row block per rank, in each rank's file
            assert [(c["offsets"], c["sizes"]) for c in entry["chunks"]] == [([0, 0], [32, 512]), ([32, 0], [32, 512])]
            assert len({c["file"] for c in entry["chunks"]}) == 2
        else:
            assert len(entry["chunks"]) == 1, key
    assert len(per_file) == 2  # both ranks wrote some, balanced to within the largest small array
    small = max(c["nbytes"] for k, e in meta["tensors"].items() if k != "buffers.table" for c in e["chunks"])
    assert abs(per_file.popitem()[1] - per_file.popitem()[1]) <= small
    flat = json.loads(pathlib.Path(os.path.join(saved["flat3"], ".metadata")).read_text())
    assert any("flat_offset" in c for e in flat["tensors"].values() for c in e["chunks"])


@pytest.mark.parametrize("layout", ["ddp2", "rows3"])
def test_an_unchanged_layout_reuses_the_save_plan(pools, tmp_path, layout):
    """A second save of one layout reuses the plan; a layout change on one rank does not; all load
    bitwise."""
    hits = _run(pools, fns.save_again, layout, str(tmp_path))
    assert len(set(hits)) == 1 and hits[0][0] >= 1 and hits[0][1] == hits[0][0], hits  # same path everywhere
    for sub, epoch in (("a", 2), ("b", 5), ("c", 5)):
        got = fns.view(fns.reference_state(), "single", 0, zero=True)
        dcp.load(got, str(tmp_path / sub))
        want = fns.view(fns.reference_state(), "single", 0)
        want["epoch"] = epoch
        assert fns.compare(got, want) == [], sub
    extra = {"only_last": np.zeros(40_000)}
    dcp.load(extra, str(tmp_path / "c"))
    assert extra["only_last"].tolist() == list(range(40_000))
