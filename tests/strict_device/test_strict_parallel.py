"""The parallel strategies on the strict fake device (2 gloo ranks, one pool for every case), and
autocast on the fake ``"cuda"``: each step equals the same step on plain NumPy (float64, <= 1e-10),
keeps its arrays on the device, and makes the host wait only where docs/gpu.md allows it.

What is allowed: the gloo backend is a CPU backend, so it stages every device array it moves
through the host (``backend.to_host`` / ``to_device_like`` inside ``neural_arch/distributed/comm/``);
those transfers are counted apart (``staged``). Everything else in a training step — the strategy's
own code, forward, loss, backward, optimizer — must make **no** device-to-host transfer, no
synchronisation and no host-to-device copy. A checkpoint save stages each array to the host once
(it is written to a file); a load copies each array back once and reads nothing from the device.

A case that fails because the library breaks that promise is marked ``xfail(strict=True)`` with
the culprit in its reason: it flips to a failure (remove the mark) once the library is fixed.
"""

from __future__ import annotations

import fake_device as fd
import numpy as np
import pytest
import strict_parallel_fns as fns

from neural_arch.distributed.testing import RankFailure, RankPool

pytestmark = pytest.mark.timeout(120)

TOL = 1e-10


class _Pool:
    """One 2-rank gloo pool for the module; a case that aborts the process group (the failing
    pipeline does) discards it, and the next case gets a fresh one."""

    def __init__(self):
        self._pool = None

    def run(self, fn, *args):
        if self._pool is None:
            self._pool = RankPool(2, backend="gloo", timeout=60.0)
            self._pool.start()
        try:
            return self._pool.run(fn, *args)
        except RankFailure:
            self.close()
            raise

    def close(self):
        if self._pool is not None:
            self._pool.close()
            self._pool = None


@pytest.fixture(scope="module")
def pool():
    p = _Pool()
    yield p
    p.close()


_results: dict = {}


def _run(pool, name, fn, *args):
    """Each case runs once on the ranks; the tests that check different promises share its result."""
    if name not in _results:
        _results[name] = pool.run(fn, *args)
    return _results[name]


def _assert_equal_and_on_device(results, what):
    for rank, r in enumerate(results):
        assert r["diff"] <= TOL, f"{what}, rank {rank}: the device step differs from NumPy by {r['diff']:g}"
        assert r["on_device"], f"{what}, rank {rank}: parameters left the device"


def _assert_no_host_waits(results, what):
    for rank, r in enumerate(results):
        assert r["outside"] == [], (f"{what}, rank {rank}: {len(r['outside'])} host transfers/syncs outside the "
                                    f"comm backend:\n  " + "\n  ".join(sorted(set(r["outside"]))))
        assert r["staged"] > 0, f"{what}, rank {rank}: no collective staged anything: nothing was distributed"


# ------------------------------------------------------------------------------------------- ZeRO
@pytest.mark.parametrize("stage", [1, 2])
def test_zero_step_on_device(pool, stage):
    res = _run(pool, f"zero{stage}", fns.zero_run, stage)
    _assert_equal_and_on_device(res, f"ZeRO-{stage}")
    _assert_no_host_waits(res, f"ZeRO-{stage}")


# ------------------------------------------------------------------------------------------- FSDP
def test_fsdp_step_on_device(pool):
    res = _run(pool, "fsdp", fns.fsdp_run)
    _assert_equal_and_on_device(res, "FSDP FULL_SHARD")
    _assert_no_host_waits(res, "FSDP FULL_SHARD")


def test_fsdp_clip_grad_norm_step_makes_no_host_wait(pool):
    res = _run(pool, "fsdp-clip", fns.fsdp_run, True)
    _assert_equal_and_on_device(res, "FSDP FULL_SHARD + clip_grad_norm_")
    _assert_no_host_waits(res, "FSDP FULL_SHARD + clip_grad_norm_")


def test_fsdp_every_parameter_on_device(pool):
    res = _run(pool, "fsdp", fns.fsdp_run)
    for rank, r in enumerate(res):
        assert r["host_params"] == [], f"rank {rank}: FSDP parameters not on the device: {r['host_params']}"


# ------------------------------------------------------------------------------------------- TP
def test_tensor_parallel_gpt_step_equals_numpy(pool):
    _assert_equal_and_on_device(_run(pool, "tp", fns.tp_gpt_run), "parallelize_gpt")


def test_tensor_parallel_gpt_step_makes_no_host_wait(pool):
    _assert_no_host_waits(_run(pool, "tp", fns.tp_gpt_run), "parallelize_gpt")


# ------------------------------------------------------------------------------------------- checkpoint
def test_distributed_checkpoint_round_trip(pool, tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("strict_dcp"))
    for rank, r in enumerate(_run(pool, "dcp", fns.dcp_roundtrip_run, directory)):
        assert r["diff"] == 0.0, f"rank {rank}: the loaded state differs from the saved one by {r['diff']:g}"
        assert r["on_device"], f"rank {rank}: the loaded parameters or optimizer state are not on the device"
        # one staging copy per array (it is written to a file), no other wait
        assert len(r["save_to_host"]) == r["arrays"], (
            f"rank {rank}: save copied {len(r['save_to_host'])} arrays to the host for {r['arrays']} arrays: "
            + "; ".join(r["save_to_host"]))
        assert r["save_syncs"] == [], f"rank {rank}: save synchronised: {r['save_syncs']}"
        # the load targets are host state dicts of the fresh model/optimizer: the same staging
        assert len(r["target_to_host"]) == r["arrays"] and r["target_syncs"] == [], (
            f"rank {rank}: get_state_dict for the load targets: {r['target_to_host']} {r['target_syncs']}")
        # dcp.load + set_state_dict read nothing back from the device and copy each array in once
        assert r["load_out"] == [], f"rank {rank}: load read from the device: {r['load_out']}"
        assert len(r["load_in"]) == r["arrays"], (
            f"rank {rank}: load copied {len(r['load_in'])} arrays in for {r['arrays']}: " + "; ".join(r["load_in"]))


# ------------------------------------------------------------------------------------------- autocast
def _autocast_step(device):
    import neural_arch.nn.functional as F
    from neural_arch import backend, nn, optim
    from neural_arch.amp import autocast
    from neural_arch.core.tensor import Tensor

    rng = np.random.default_rng(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 4))  # float32: autocast casts it
    for p in model.parameters():
        p.data[...] = rng.normal(0, 0.5, size=p.shape).astype(np.float32)
    model.to(device)
    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = Tensor(backend.to_device(rng.normal(size=(8, 6)).astype(np.float32), device))
    y = backend.to_device(rng.integers(0, 4, size=8), device)
    with fd.counting() as ev:
        with autocast(device.split(":")[0], dtype=np.float16):
            out = model(x)
            loss = F.cross_entropy(out, y)
        loss.backward()
        grads = [p.grad.data for p in model.parameters()]
        opt.step()
    arrays = [out.data, loss.data, *grads, *(p.data for p in model.parameters())]
    return [backend.to_host(a) for a in arrays], ev, all(type(a) is fd.FakeArray for a in arrays)


def test_autocast_float16_step_on_strict_cuda(strict_cuda):
    got, ev, on_device = _autocast_step("cuda")
    want, _, _ = _autocast_step("cpu")
    assert on_device, "autocast outputs, gradients or parameters left the device"
    assert got[0].dtype == np.float16 and want[0].dtype == np.float16, "the Linear did not run in float16"
    assert got[2].dtype == np.float32, "the gradient of a float32 parameter must come back in float32"
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and float(np.max(np.abs(g.astype(np.float64) - w))) <= TOL
    assert ev.host_waits == [] and ev.from_host == [], f"autocast step waited for the device: {ev}"


# ------------------------------------------------------------------------------------------- pipeline
# Last: a failing pipeline aborts its process group, after which the pool is started afresh.
def test_pipeline_1f1b_step_on_device(pool):
    res = pool.run(fns.pp_1f1b_run)
    _assert_equal_and_on_device(res, "Schedule1F1B")
    _assert_no_host_waits(res, "Schedule1F1B")
