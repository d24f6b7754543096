"""``benchmarks/bench_flight_recorder.py``: the paired statistics decide a shift the noise hides in a
plain comparison of medians, and a tiny run writes what the ``flight-recorder`` goal reads."""

from __future__ import annotations

import json

import numpy as np
import pytest

from benchmarks import bench_flight_recorder as bench
from benchmarks import goals


def _noisy_pairs(shift_pct: float, pairs: int = 400, seed: int = 1):
    """Steps around 10 ms that drift by +-10% over the run (a shared, slowly busy machine) with
    2% noise per block; "on" is "off"'s neighbour in time, ``shift_pct`` dearer."""
    rng = np.random.default_rng(seed)
    drift = 0.010 * (1 + 0.1 * np.sin(np.linspace(0, 6, pairs)))
    off = drift * (1 + 0.02 * rng.standard_normal(pairs))
    on = drift * (1 + shift_pct / 100) * (1 + 0.02 * rng.standard_normal(pairs))
    return off.tolist(), on.tolist()


def test_paired_interval_separates_a_two_percent_cost_from_none():
    costly = bench.paired_overhead(*_noisy_pairs(2.0))
    assert costly["ci_pct"][0] > 1.0 and costly["pairs"] == 400     # shown above the 1% line
    free = bench.paired_overhead(*_noisy_pairs(0.0))
    assert free["ci_pct"][0] < 0 < free["ci_pct"][1] < 1.0            # shown below it
    assert costly["ci_pct"][0] <= costly["median_pct"] <= costly["ci_pct"][1]


def test_paired_overhead_needs_pairs():
    with pytest.raises(ValueError):
        bench.paired_overhead([1.0, 2.0], [1.0])


def test_a_tiny_run_is_what_the_goal_reads(tmp_path):
    from neural_arch.distributed.comm.local import LocalBackend
    from neural_arch.distributed.flight_recorder import buffer

    out = tmp_path / "fr.json"
    ring, backend = buffer.RECORDER.ring, LocalBackend()
    before = (backend._fr, backend._fr_caller)
    bench.main(["--rounds", "1", "--calls", "20", "--cycles", "3", "--steps", "1", "--probe-steps", "2",
                "--out", str(out)])
    after = (backend._fr, backend._fr_caller)
    backend.shutdown()
    assert buffer.RECORDER.ring is ring and after == before      # the test process is left as found
    data = json.loads(out.read_text())
    assert set(data["paired"]) == {f"{c} | {m}" for c in bench.CLOCKS for m in bench.STEP_MODES[1:]}
    assert len(data["paired_per_rank"]) == 2 and data["paired"]["CPU | on"]["pairs"] == 3
    # every step all-reduces the gradients: the ring counts ops in the "on" modes
    assert all(e["ops_per_step"] >= 1 for e in data["per_op_estimate"].values())
    assert all(r["caller_cpu_per_op_s"] > 0 for r in data["per_rank_s"])    # the probe saw the ops' caller
    assert all(len(r["training step"]["wall"]["off"]) == 3 for r in data["per_rank_s"])
    (label, value), = goals.flight_recorder(data).items()
    assert value == data["paired"][bench.JUDGED]["ci_pct"][1] and "upper bound" in label
