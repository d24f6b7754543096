"""What the memory-estimate tests run on every rank of a RankPool: ``benchmarks/bench_memory.py``'s
measurement (one warm-up step per strategy on a tiny GPT, then one measured step per strategy)."""

from __future__ import annotations


def measure(strategies: list[str], cfg: dict) -> dict:
    """``{strategy: bench_memory.measure_step(strategy, cfg)}`` on this rank."""
    from benchmarks.bench_memory import measure_step, warm_up

    warm_up(strategies, cfg)
    return {s: measure_step(s, cfg) for s in strategies}
