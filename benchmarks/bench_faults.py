"""The fault matrix, run and timed: one line per (case, variant) with time-to-error on every rank.

Runs the cases of ``tests/faults`` (``fault_fns.run_case``, expectations in ``matrix.EXPECT``) on
``gloo-tcp``, ``gloo-shm`` and ``mpi`` (skipped where ``mpiexec`` is missing), two ranks each, and
prints for every rank the outcome of the faulty call and of the correct all_reduce after it, with
the seconds each took -- so "fails fast on every rank" is a number, not a claim::

    case          variant   verdict  rank 0                              rank 1
    dtype         gloo-tcp  PASS     FrameMismatchError 0.000s -> Group.. FrameMismatchError 0.000s -> ...

Usage::

    python benchmarks/bench_faults.py                      # every case, every variant
    python benchmarks/bench_faults.py --variants gloo-tcp --cases dtype,size --ranks 3
    python benchmarks/bench_faults.py --bytes 67108864     # the issue's 64 MiB read-only buffer

Exit status 1 if any (case, variant) does not give the expected outcome.
"""

from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
FAULTS = os.path.join(os.path.dirname(HERE), "tests", "faults")
sys.path.insert(0, FAULTS)        # the rank processes inherit sys.path (the pool passes it on)
sys.path.insert(0, os.path.dirname(HERE))

import fault_fns
import matrix

from neural_arch.distributed.testing import RankPool, mpiexec_path

_SHORT = {"GroupPoisonedError": "Poisoned", "FrameMismatchError": "FrameMismatch",
          "CollectiveTimeoutError": "Timeout", "ValueError": "ValueError"}


def _cell(r: dict) -> str:
    kind, _, secs, _ = r["first"]
    nkind, _, nsecs, _ = r["next"]
    return f"{_SHORT.get(kind, kind)} {secs:.3f}s -> {_SHORT.get(nkind, nkind)} {nsecs:.3f}s"


def _verdict(results, want, case) -> str:
    first_want, next_want = want
    for r in results:
        skipped = case == "missing_rank" and r["rank"] == len(results) - 1
        if not (skipped and first_want != "ok") and not matrix.matches(r["first"][0], r["rank"], first_want):
            return "FAIL"
        if not matrix.matches(r["next"][0], r["rank"], next_want, skipped):
            return "FAIL"
        if r["next"][0] == "ok" and r["next"][3] != [float(len(results) * (len(results) + 1) / 2)] * 4:
            return "WRONG-DATA"
    return "PASS"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", default=",".join(matrix.VARIANTS))
    ap.add_argument("--cases", default=",".join(matrix.EXPECT))
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--bytes", type=int, default=None, help="size of the read-only buffer (readonly case)")
    args = ap.parse_args()
    if args.bytes:
        os.environ["FAULT_READONLY_BYTES"] = str(args.bytes)
    failed = 0
    print(f"{'case':14s}{'variant':10s}{'verdict':9s}" + "".join(f"rank {r:<40d}" for r in range(args.ranks)))
    for variant in args.variants.split(","):
        backend, env = matrix.VARIANTS[variant]
        if backend == "mpi" and mpiexec_path() is None:
            print(f"{'*':14s}{variant:10s}SKIPPED  (mpi4py/mpiexec not installed)")
            continue
        env = dict(env, NEURAL_ARCH_TIMEOUT=str(matrix.FAULT_TIMEOUT), NEURAL_ARCH_RENDEZVOUS_TIMEOUT="20")
        if args.bytes:
            env["FAULT_READONLY_BYTES"] = str(args.bytes)
        with RankPool(args.ranks, backend=backend, timeout=120, env=env) as pool:
            for case in args.cases.split(","):
                want = matrix.expectation(case, backend)
                if want is None:
                    print(f"{case:14s}{variant:10s}{'MPI-DOC':9s}(MPI's behaviour: docs/fault_tolerance.md)")
                    continue
                results = pool.run(fault_fns.run_case, case)
                verdict = _verdict(results, want, case)
                failed += verdict != "PASS"
                print(f"{case:14s}{variant:10s}{verdict:9s}" + "".join(f"{_cell(r):45s}" for r in results),
                      flush=True)
                pool.run(fault_fns.recover)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
