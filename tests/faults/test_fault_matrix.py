"""The fault matrix as tests: every case on gloo over TCP, gloo over shared memory, and MPI.

For each case every rank runs the fault and then a correct all_reduce (``fault_fns.run_case``);
``matrix.EXPECT`` says what each must give. The poisoning contract is the "next" column: after an
error that happened once bytes had moved, the next collective raises on **every** rank and never
returns data. Each case then re-creates the process group (``fault_fns.recover``), which proves the
recovery the error message asks for, and lets one pool of ranks serve every case.
"""

import fault_fns
import matrix
import pytest

from neural_arch.distributed.testing import RankPool

pytestmark = pytest.mark.timeout(90)

CASES = [pytest.param(c, marks=pytest.mark.slow) if c in matrix.SLOW else c for c in matrix.EXPECT]


def _variant_params():
    out = []
    for name in matrix.VARIANTS:
        marks = [pytest.mark.mpi] if name == "mpi" else []
        out.append(pytest.param(name, marks=marks, id=name))
    return out


@pytest.fixture(scope="module", params=_variant_params())
def pool(request):
    backend, env = matrix.VARIANTS[request.param]
    env = dict(env, NEURAL_ARCH_TIMEOUT=str(matrix.FAULT_TIMEOUT), NEURAL_ARCH_RENDEZVOUS_TIMEOUT="20")
    with RankPool(2, backend=backend, timeout=60, env=env) as p:
        p.variant, p.backend_name = request.param, backend
        yield p


def _check(results, want, case, variant):
    first_want, next_want = want
    for r in results:
        skipped = case == "missing_rank" and r["rank"] == len(results) - 1
        kind = r["first"][0]
        if not (skipped and first_want != "ok"):
            assert matrix.matches(kind, r["rank"], first_want), (variant, case, "first", r)
        nkind, nmsg, nsecs, nvalue = r["next"]
        assert matrix.matches(nkind, r["rank"], next_want, skipped), (variant, case, "next", r)
        if next_want != "ok" and next_want != "any" and not skipped:
            assert nvalue is None, (variant, case, "a poisoned group returned data", r)
        if nkind == "GroupPoisonedError":
            # names the first failure and the way out, and fails at once (no timeout)
            assert "destroy" in nmsg and nsecs < matrix.FAULT_TIMEOUT, (variant, case, r)
        if next_want == "ok" or nkind == "ok":
            # the late rank of missing_rank may complete the op its peers abandoned: only with the
            # frames of that very op (the header check), so with its correct result
            size = len(results)
            assert nvalue == [float(size * (size + 1) / 2)] * 4, (variant, case, "wrong data", r)


# a case without an entry for a backend is that backend's documented behaviour (docs/fault_tolerance.md):
# not generated, rather than skipped
@pytest.mark.cases(lambda p: matrix.expectation(p["case"], matrix.VARIANTS[p["pool"]][0]) is not None)
@pytest.mark.parametrize("case", CASES)
def test_fault(pool, case):
    want = matrix.expectation(case, pool.backend_name)
    results = pool.run(fault_fns.run_case, case)
    try:
        _check(results, want, case, pool.variant)
    finally:
        assert pool.run(fault_fns.recover) == [[3.0, 3.0, 3.0]] * 2
