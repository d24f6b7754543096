"""NCCL backend checks that need no GPU: they run everywhere (no ``gpu`` mark on purpose).

* pure logic: dtype/op tables against NCCL's enum values, unique-id encoding, version decoding,
  device selection, the completion poller;
* availability: ``is_available()`` is False (and silent) here, ``create()`` says what is missing;
* the backend itself, over an in-process fake of ``cupy.cuda.nccl`` (``fake_nccl.py``): ranks are
  threads, buffers are host memory reached through the same raw pointers NCCL would get. This
  checks the wiring (pointers, counts, roots, chunks, AVG fallback, grouping, sub-groups,
  timeouts and aborts), not CUDA: streams and events are the GPU tests' job.
"""

from __future__ import annotations

import threading
import time
import warnings

import fake_nccl as fk  # tests/gpu is on sys.path (pytest rootdir-relative import)
import numpy as np
import pytest

from neural_arch.distributed.comm import ReduceOp, get_backend_class
from neural_arch.distributed.comm.nccl import backend as nb
from neural_arch.distributed.comm.nccl import support as ns
from neural_arch.distributed.errors import (
    CollectiveTimeoutError,
    DistributedError,
    PeerFailureError,
    RendezvousError,
)


# -- pure logic -----------------------------------------------------------------------------------
def test_dtype_table_matches_nccl_enum_and_base_dtypes():
    from neural_arch.distributed.comm.dtypes import SUPPORTED_DTYPES
    mod = fk.make_nccl_module()
    assert {str(d) for d in SUPPORTED_DTYPES} == set(ns.DTYPE_TO_NCCL)
    for name in ns.DTYPE_TO_NCCL:
        code = nb.nccl_dtype(np.dtype(name), mod)
        expected = np.uint8 if name == "bool" else np.dtype(name)
        assert np.dtype(fk._NP[code]) == np.dtype(expected), name
    with pytest.raises(TypeError, match="cannot travel over NCCL"):
        nb.nccl_dtype(np.complex64, mod)


@pytest.mark.parametrize("op,code", [(ReduceOp.SUM, 0), (ReduceOp.PRODUCT, 1), (ReduceOp.MAX, 2),
                                     (ReduceOp.MIN, 3), ("average", 4), ("avg", 4)])
def test_reduce_op_table(op, code):
    assert nb.nccl_reduce_op(op, fk.make_nccl_module(), (2, 18, 5)) == (code, False)


def test_avg_falls_back_to_sum_then_divide_before_nccl_2_10():
    mod = fk.make_nccl_module()
    assert nb.nccl_reduce_op(ReduceOp.AVG, mod, (2, 9, 9)) == (0, True)
    assert nb.nccl_reduce_op(ReduceOp.AVG, mod, (2, 10, 3)) == (4, False)
    del mod.NCCL_AVG      # a CuPy built without the constant
    assert nb.nccl_reduce_op(ReduceOp.AVG, mod, (2, 18, 0)) == (0, True)


@pytest.mark.parametrize("code,expected", [(2804, (2, 8, 4)), (21003, (2, 10, 3)), (21805, (2, 18, 5)),
                                           (22703, (2, 27, 3)), (0, (0, 0, 0))])
def test_version_decoding(code, expected):
    assert nb.version_tuple(code) == expected


def test_unique_id_round_trip_signed_and_bytes():
    uid = tuple(((i * 37) % 256) - 128 for i in range(128))     # CuPy <= 13: signed C chars
    data = nb.encode_unique_id(uid)
    assert isinstance(data, bytes) and len(data) == len(ns.UID_MAGIC) + 128
    assert nb.decode_unique_id(data) == uid
    raw = bytes(range(128))                                      # CuPy 14: bytes
    assert bytes(v & 0xFF for v in nb.decode_unique_id(nb.encode_unique_id(raw))) == raw


def test_unique_id_rejects_garbage():
    with pytest.raises(ValueError, match="128 bytes"):
        nb.encode_unique_id((1, 2, 3))
    with pytest.raises(ValueError, match="byte values"):
        nb.encode_unique_id((1000,) * 128)
    with pytest.raises(RendezvousError, match="not an NCCL unique id"):
        nb.decode_unique_id(b"127.0.0.1:29500")


def test_select_device():
    assert nb.select_device(5, 4) == 1
    assert nb.select_device(5, 4, "cuda") == 1
    assert nb.select_device(0, 4, "cuda:3") == 3
    assert nb.select_device(0, 4, 2) == 2
    from neural_arch.backend import Device
    assert nb.select_device(0, 4, Device("cuda", 2)) == 2
    with pytest.raises(ValueError, match="out of range"):
        nb.select_device(0, 2, "cuda:5")
    with pytest.raises(ValueError, match="'cuda'"):
        nb.select_device(0, 2, "cpu")
    with pytest.raises(DistributedError, match="sees none"):
        nb.select_device(0, 0)


def test_local_rank_from_env(monkeypatch):
    for var in ("LOCAL_RANK", "MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"):
        monkeypatch.delenv(var, raising=False)
    assert nb.local_rank_from_env(7) == 7
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert nb.local_rank_from_env(7) == 3


def test_poll_until_done_error_and_deadline():
    calls = {"n": 0}

    def done():
        calls["n"] += 1
        return calls["n"] > 50
    assert nb.poll_until(done, lambda: None, time.monotonic() + 5)

    def boom():
        raise PeerFailureError("peer died")
    with pytest.raises(PeerFailureError):
        nb.poll_until(lambda: False, boom, time.monotonic() + 5)

    start = time.monotonic()
    assert nb.poll_until(lambda: False, lambda: None, start + 0.2) is False
    assert time.monotonic() - start < 1.0      # gives up at the deadline, never hangs


# -- availability without a GPU -------------------------------------------------------------------
def test_get_backend_class_imports_without_gpu():
    assert get_backend_class("nccl") is nb.NCCLBackend
    assert nb.NCCLBackend.name == "nccl" and nb.NCCLBackend.devices == ("cuda",)


def test_is_available_false_and_silent_here():
    if nb.missing_requirement() is None:
        pytest.skip("this machine has CuPy, NCCL and a GPU: the GPU tests cover it")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert nb.NCCLBackend.is_available() is False


def test_is_available_never_raises(monkeypatch):
    def broken():
        raise OSError("driver exploded")
    monkeypatch.setattr(nb, "missing_requirement", broken)
    assert nb.NCCLBackend.is_available() is False


def test_create_without_gpu_says_what_is_missing():
    missing = nb.missing_requirement()
    if missing is None:
        pytest.skip("this machine has CuPy, NCCL and a GPU")
    with pytest.raises(DistributedError) as info:
        nb.NCCLBackend.create(DictStore(), 0, 2, timeout=1)
    text = str(info.value)
    assert "nccl" in text and ("neural_arch[gpu]" in text or "nvidia-nccl" in text or "GPU" in text)


def test_missing_cupy_names_the_gpu_extra(monkeypatch):
    from neural_arch.distributed.comm.nccl import support as _nccl_support
    monkeypatch.setattr(_nccl_support, "_import_nccl", lambda: (None, None))
    assert "neural_arch[gpu]" in nb.missing_requirement()


# -- the backend over the fake communicator --------------------------------------------------------
class DictStore:
    """A thread-safe in-memory store with a blocking get (the slice of the Store API used)."""

    def __init__(self, timeout: float = 5.0):
        self.data, self.cv, self.timeout = {}, threading.Condition(), timeout

    def set(self, key, value):
        with self.cv:
            self.data[key] = bytes(value)
            self.cv.notify_all()

    def get(self, key):
        with self.cv:
            if not self.cv.wait_for(lambda: key in self.data, self.timeout):
                raise RendezvousError(f"key {key!r} never set")
            return self.data[key]

    def check(self, keys):
        with self.cv:
            return all(k in self.data for k in keys)


def run_threads(fn, n, timeout=20.0):
    """fn(rank) on n threads; results in rank order, or the first exception re-raised."""
    results, errors = [None] * n, [None] * n

    def target(r):
        try:
            results[r] = fn(r)
        except BaseException as exc:  # noqa: BLE001
            errors[r] = exc
    threads = [threading.Thread(target=target, args=(r,), daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), "a rank hung"
    return results, errors


@pytest.fixture
def fake_env(monkeypatch):
    """Route NCCLBackend.create to the fake modules; returns a factory of n-rank worlds."""
    undo = fk.register_with_backend(fk.make_cupy_module())

    def make(n, version=21805, with_split=True, timeout=10.0):
        nccl, cp = fk.make_nccl_module(version, with_split), fk.make_cupy_module()
        monkeypatch.setattr(nb, "_import_nccl", lambda: (cp, nccl))
        monkeypatch.setattr(nb, "missing_requirement", lambda: None)
        store = DictStore()
        backends, errors = run_threads(lambda r: nb.NCCLBackend.create(store, r, n, timeout=timeout), n)
        assert errors == [None] * n, errors
        return backends
    try:
        yield make
    finally:
        undo()


def _arr(a):
    return fk.FakeArray(np.ascontiguousarray(a))


def each(backends, fn):
    results, errors = run_threads(lambda r: fn(backends[r], r), len(backends))
    for e in errors:
        if e is not None:
            raise e
    return results


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "int32", "int64", "int8", "uint8"])
@pytest.mark.parametrize("op", [ReduceOp.SUM, ReduceOp.MAX, ReduceOp.MIN, ReduceOp.PRODUCT])
def test_allreduce_vs_numpy(fake_env, n, dtype, op):
    backends = fake_env(n)
    data = [(np.arange(6).reshape(2, 3) % 3 + r + 1).astype(dtype) for r in range(n)]
    reducer = {ReduceOp.SUM: np.sum, ReduceOp.MAX: np.max, ReduceOp.MIN: np.min, ReduceOp.PRODUCT: np.prod}[op]
    expected = reducer(np.stack(data), axis=0).astype(dtype)
    out = each(backends, lambda b, r: b.allreduce(_arr(data[r].copy()), op).result().get())
    for o in out:
        np.testing.assert_allclose(o.astype(np.float64), expected.astype(np.float64), rtol=1e-3)


@pytest.mark.parametrize("version", [21805, 20804])
def test_allreduce_avg_native_and_fallback(fake_env, version):
    backends = fake_env(4, version=version)
    out = each(backends, lambda b, r: b.allreduce(_arr(np.full(5, float(r), np.float32)), "avg").result().get())
    for o in out:
        np.testing.assert_allclose(o, 1.5)
    calls = backends[0]._comm.calls
    assert calls[-1] == "allReduce"


def test_bool_allreduce_max_travels_as_uint8(fake_env):
    backends = fake_env(2)
    out = each(backends, lambda b, r: b.allreduce(_arr(np.array([r == 0, False, r == 1])), ReduceOp.MAX)
               .result().get())
    for o in out:
        assert o.dtype == np.bool_ and o.tolist() == [True, False, True]


def test_broadcast_reduce_allgather_reduce_scatter(fake_env):
    n = 3
    backends = fake_env(n)
    out = each(backends, lambda b, r: b.broadcast(_arr(np.full(4, r, np.int64)), root=2).result().get())
    assert all(o.tolist() == [2] * 4 for o in out)

    out = each(backends, lambda b, r: b.reduce(_arr(np.full(4, r + 1.0)), root=1, op="avg").result().get())
    np.testing.assert_allclose(out[1], 2.0)
    np.testing.assert_allclose(out[0], 1.0)        # non-roots keep their input
    np.testing.assert_allclose(out[2], 3.0)

    def gather(b, r):
        out = _arr(np.zeros((n, 2, 2), np.float32))
        return b.allgather(out, _arr(np.full((2, 2), r, np.float32))).result().get()
    for o in each(backends, gather):
        assert [o[r].tolist() for r in range(n)] == [[[r] * 2] * 2 for r in range(n)]

    full = np.arange(n * 4, dtype=np.float64).reshape(n * 2, 2)

    def rs(b, r):
        out = _arr(np.zeros((2, 2)))
        return b.reduce_scatter(out, _arr(full * (r + 1)), ReduceOp.SUM).result().get()
    for r, o in enumerate(each(backends, rs)):
        np.testing.assert_allclose(o, (full * 6)[r * 2:(r + 1) * 2])


@pytest.mark.parametrize("n", [2, 3, 4])
def test_alltoall_gather_scatter(fake_env, n):
    backends = fake_env(n)
    inputs = [np.arange(n * 2, dtype=np.float32) + 100 * r for r in range(n)]

    def a2a(b, r):
        out = _arr(np.zeros(n * 2, np.float32))
        return b.alltoall(out, _arr(inputs[r])).result().get()
    for r, o in enumerate(each(backends, a2a)):
        expected = np.concatenate([inputs[s][r * 2:(r + 1) * 2] for s in range(n)])
        np.testing.assert_array_equal(o, expected)

    def gather(b, r):
        out = _arr(np.zeros((n, 3), np.int32)) if r == 1 else None
        res = b.gather(out, _arr(np.full(3, r, np.int32)), root=1).result()
        return None if res is None else res.get()
    got = each(backends, gather)
    assert got[1].tolist() == [[r] * 3 for r in range(n)]

    def scatter(b, r):
        src = _arr(np.arange(n * 2, dtype=np.int64).reshape(n, 2)) if r == 0 else None
        return b.scatter(_arr(np.zeros(2, np.int64)), src, root=0).result().get()
    assert [o.tolist() for o in each(backends, scatter)] == [[2 * r, 2 * r + 1] for r in range(n)]


# split matrices: counts[s][d] rows go from rank s to rank d (zeros, a rank that sends nothing, an empty op)
_A2AV_COUNTS = {
    2: [[1, 3], [0, 2]],
    3: [[0, 0, 0], [2, 0, 1], [4, 1, 0]],          # rank 0 sends nothing, rank 1 keeps nothing
    4: [[1, 0, 2, 5], [0, 0, 0, 0], [3, 1, 0, 0], [0, 2, 1, 1]],
}


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("dtype", ["float64", "int32"])
def test_alltoallv_is_native_and_moves_only_real_rows(fake_env, n, dtype):
    backends = fake_env(n)
    counts = np.array(_A2AV_COUNTS[n])
    rows = [np.arange(counts[s].sum() * 3, dtype=dtype).reshape(-1, 3) + 1000 * s for s in range(n)]

    def a2av(b, r):
        out = _arr(np.full((counts[:, r].sum(), 3), -1, dtype))
        return b.alltoallv(out, _arr(rows[r]), output_split_sizes=counts[:, r].tolist(),
                           input_split_sizes=counts[r].tolist()).result().get()
    got = each(backends, a2av)
    at = [np.concatenate([[0], np.cumsum(counts[s])]) for s in range(n)]
    for r in range(n):
        expected = np.concatenate([rows[s][at[s][r]:at[s][r + 1]] for s in range(n)]).reshape(-1, 3)
        np.testing.assert_array_equal(got[r], expected)
        comm = backends[r]._comm
        # no padding: exactly one send per peer that gets rows, of exactly its rows' bytes, and no
        # MAX all-reduce agreeing on a padded block length (what the interface's default hook does)
        row = 3 * np.dtype(dtype).itemsize
        assert sorted(comm.sent) == sorted((d, int(counts[r][d]) * row) for d in range(n) if d != r and counts[r][d])
        assert comm.calls.count("recv") == sum(1 for s in range(n) if s != r and counts[s][r])
        assert "allReduce" not in comm.calls


def test_alltoallv_same_checks_as_the_other_backends(fake_env):
    backends = fake_env(2)
    b = backends[0]
    with pytest.raises(ValueError, match="must hold 2 row counts"):
        b.alltoallv(_arr(np.zeros((2, 1))), _arr(np.zeros((2, 1))), [2], [1, 1])
    with pytest.raises(ValueError, match="sum to dim 0"):
        b.alltoallv(_arr(np.zeros((2, 1))), _arr(np.zeros((2, 1))), [1, 1], [2, 1])
    with pytest.raises(ValueError, match="share dtype"):
        b.alltoallv(_arr(np.zeros((2, 1))), _arr(np.zeros((2, 2))), [1, 1], [1, 1])
    with pytest.raises(TypeError, match="cuda"):
        b.alltoallv(np.zeros((2, 1)), np.zeros((2, 1)), [1, 1], [1, 1])
    assert b._comm.sent == []          # every check fires before any I/O
    # both ranks sending nothing at all: nothing is posted, and the op still completes
    out = each(backends, lambda b, r: b.alltoallv(_arr(np.zeros((0, 2))), _arr(np.zeros((0, 2))),
                                                  [0, 0], [0, 0]).result().get())
    assert [o.shape for o in out] == [(0, 2), (0, 2)] and backends[1]._comm.calls.count("send") == 0


def test_alltoallv_splits_that_disagree_fail_loudly_never_hang(fake_env):
    backends = fake_env(2, timeout=2.0)
    # rank 0 sends 2 rows to rank 1, which expects 1: NCCL cannot tell before data moves; the receiver's
    # error (here the fake's count check; on a GPU an error or the timeout's abort) names the op
    outs, ins = [[1, 2], [1, 1]], [[1, 2], [2, 1]]          # [rank][peer]: rows received, rows sent
    _, errors = run_threads(lambda r: backends[r].alltoallv(_arr(np.zeros((sum(outs[r]), 2))), _arr(np.zeros((3, 2))),
                                                            outs[r], ins[r]).result(), 2)
    assert errors[0] is None and isinstance(errors[1], DistributedError), errors
    assert "all_to_allv #1" in str(errors[1]) and "matched a send of 4" in str(errors[1]), errors


def test_send_recv_barrier_and_objects(fake_env):
    backends = fake_env(2)

    def p2p(b, r):
        if r == 0:
            b.send(_arr(np.arange(5, dtype=np.float32)), dst=1)
            return None
        return b.recv(_arr(np.zeros(5, np.float32)), src=0).result().get()
    assert each(backends, p2p)[1].tolist() == [0, 1, 2, 3, 4]
    each(backends, lambda b, r: b.barrier())
    assert each(backends, lambda b, r: b.broadcast_object({"rank": r}, root=1)) == [{"rank": 1}] * 2
    assert each(backends, lambda b, r: b.allgather_object(("x", r))) == [[("x", 0), ("x", 1)]] * 2


def test_async_ops_complete_in_order(fake_env):
    backends = fake_env(2)

    def run(b, r):
        works = [b.allreduce(_arr(np.full(3, float(i + r))), async_op=True) for i in range(5)]
        return [w.result().get().tolist() for w in works]
    for res in each(backends, run):
        assert res == [[2.0 * i + 1] * 3 for i in range(5)]


def test_submission_orders_comm_stream_after_callers_stream(fake_env):
    backends = fake_env(2)
    each(backends, lambda b, r: b.allreduce(_arr(np.ones(2))))
    for b in backends:
        assert b._stream.waited, "the comm stream never waited on the caller's event"
        assert b._stream.waited[-1].recorded_on is fk._CURRENT


def test_numpy_arrays_are_rejected_with_a_hint(fake_env):
    backends = fake_env(2)
    with pytest.raises(TypeError, match="cuda"):
        backends[0].allreduce(np.ones(3))


def test_debug_mode_stages_its_numpy_table(fake_env):
    backends = fake_env(2)
    for b in backends:
        b.debug = True
    out = each(backends, lambda b, r: b.allreduce(_arr(np.ones(2))).result().get())
    assert all(o.tolist() == [2.0, 2.0] for o in out)


@pytest.mark.parametrize("with_split", [True, False])
def test_new_group(fake_env, with_split):
    backends = fake_env(4, with_split=with_split)
    groups = each(backends, lambda b, r: b.new_group([1, 3]))
    assert groups[0] is None and groups[2] is None
    assert groups[1].group_ranks == [1, 3] and (groups[1].rank, groups[3].rank) == (0, 1)
    sub = [groups[1], groups[3]]
    out = each(sub, lambda b, r: b.allreduce(_arr(np.full(2, float(b.group_ranks[r])))).result().get())
    assert all(o.tolist() == [4.0, 4.0] for o in out)
    assert ("commSplit" in backends[0]._comm.calls) == with_split


def test_timeout_aborts_and_raises_naming_the_op(fake_env):
    backends = fake_env(2, timeout=0.5)
    start = time.monotonic()
    with pytest.raises(CollectiveTimeoutError) as info:
        backends[0].allreduce(_arr(np.ones(8, np.float32)))   # rank 1 never joins
    assert time.monotonic() - start < 5
    text = str(info.value)
    assert "all_reduce #1" in text and "(8,)" in text and "aborted" in text and "[1]" in text
    assert backends[0]._comm.aborted
    with pytest.raises(DistributedError, match="failed|aborted"):
        backends[0].allreduce(_arr(np.ones(8, np.float32)))  # the group is poisoned, says so


def test_async_nccl_error_becomes_peer_failure(fake_env, monkeypatch):
    backends = fake_env(2, timeout=5)
    comm = backends[0]._comm
    comm.async_error = "remote process exited"
    monkeypatch.setattr(comm, "allReduce", lambda *a: None)   # enqueued, as a real launch returns
    monkeypatch.setattr(fk._Event, "done", False)             # ...but the kernel never finishes
    with pytest.raises(PeerFailureError, match="asynchronous error"):
        backends[0].barrier()
    assert backends[0]._comm.aborted


def test_create_rendezvous_timeout_is_an_error_not_a_hang(fake_env, monkeypatch):
    nccl, cp = fk.make_nccl_module(), fk.make_cupy_module()
    monkeypatch.setattr(nb, "_import_nccl", lambda: (cp, nccl))
    monkeypatch.setattr(nb, "missing_requirement", lambda: None)
    store = DictStore()
    start = time.monotonic()
    with pytest.raises(RendezvousError, match="did not join"):
        nb.NCCLBackend.create(store, 0, 2, timeout=0.5)       # rank 1 never comes
    assert time.monotonic() - start < 5


def test_shutdown_destroys_and_refuses_later_ops(fake_env):
    backends = fake_env(2)
    for b in backends:
        b.shutdown()
    with pytest.raises(DistributedError, match="destroyed"):
        backends[0].allreduce(_arr(np.ones(2)))


# -- the real cupy.cuda.nccl API, where CuPy and libnccl are installed (no GPU needed) -------------
@pytest.fixture
def real_nccl():
    cp, nccl = nb._import_nccl()
    if cp is None or not getattr(nccl, "available", False):
        pytest.skip("needs CuPy with libnccl (pip install 'neural_arch[gpu]' 'nvidia-nccl-cu12>=2.18'); "
                    "no GPU needed")
    return nccl


def _doc_params(method) -> list:
    """Parameter names from a Cython docstring's first line: 'f(self, intptr_t buf, ...)'."""
    first = (method.__doc__ or "").strip().splitlines()[0]
    inside = first[first.index("(") + 1:first.rindex(")")]
    return [p.split("=")[0].split()[-1] for p in inside.split(",") if p.strip()][1:]   # drop self


def test_real_nccl_constants_match_the_tables(real_nccl):
    for name in set(ns.DTYPE_TO_NCCL.values()) | set(ns.OP_TO_NCCL.values()):
        assert getattr(real_nccl, name) == fk.NCCL_CODES[name], name
    for fn in ("get_unique_id", "get_version", "groupStart", "groupEnd"):
        assert callable(getattr(real_nccl, fn))


@pytest.mark.parametrize("method", ["allReduce", "reduce", "broadcast", "allGather", "reduceScatter",
                                    "send", "recv", "commSplit"])
def test_real_nccl_methods_have_the_arity_the_backend_and_fake_use(real_nccl, method):
    import inspect
    real = getattr(real_nccl.NcclCommunicator, method, None)
    if real is None and method == "commSplit":
        pytest.skip("this CuPy has no commSplit: the backend uses the store path")
    real_params = [p for p in _doc_params(real) if p != "config"]
    fake_params = list(inspect.signature(getattr(fk.FakeComm, method)).parameters)[1:]
    assert len(real_params) == len(fake_params), (real_params, fake_params)
    for attr in ("check_async_error", "abort", "destroy"):
        assert hasattr(real_nccl.NcclCommunicator, attr)


def test_real_unique_id_round_trips_and_constructor_form(real_nccl):
    uid = real_nccl.get_unique_id()           # works without a GPU
    decoded = nb.decode_unique_id(nb.encode_unique_id(uid))
    raw = bytes(v & 0xFF for v in decoded)
    assert raw == (uid if isinstance(uid, bytes) else bytes(v & 0xFF for v in uid))
    if isinstance(uid, bytes):                # CuPy 14: the constructor wants bytes, refuses the tuple
        with pytest.raises(TypeError):
            real_nccl.NcclCommunicator(1, decoded, 0)
    assert nb.version_tuple(real_nccl.get_version()) >= (2, 0, 0)


def test_gpu_never_finishing_times_out_while_polling(fake_env, monkeypatch):
    backends = fake_env(2, timeout=0.5)
    comm = backends[0]._comm
    monkeypatch.setattr(comm, "allReduce", lambda *a: None)   # enqueued fine...
    monkeypatch.setattr(fk._Event, "done", False)             # ...but never completes
    start = time.monotonic()
    with pytest.raises(CollectiveTimeoutError, match="waiting for the GPU"):
        backends[0].allreduce(_arr(np.ones(4, np.float32)))
    assert time.monotonic() - start < 5 and comm.aborted


def test_comm_split_queues_behind_pending_async_ops(fake_env):
    backends = fake_env(2)

    def run(b, r):
        works = [b.allreduce(_arr(np.full(64, float(r + i))), async_op=True) for i in range(4)]
        sub = b.new_group([0, 1])                  # must not overtake the queued allreduces
        got = [w.result().get()[0] for w in works]
        x = _arr(np.full(2, float(r)))
        sub.allreduce(x)
        return got, x.get().tolist()
    for got, sub_sum in each(backends, run):
        assert got == [1.0 + 2 * i for i in range(4)]
        assert sub_sum == [1.0, 1.0]


def test_two_processes_on_one_gpu_fail_on_every_rank_naming_them(fake_env, monkeypatch):
    # the fake runs ranks as threads of one process; give each thread its own "pid" so they look like
    # the processes a launcher starts (all of them choose cuda:0, the fake's only device)
    monkeypatch.setattr(nb.os, "getpid", lambda: 1000 + threading.get_ident() % 997)
    nccl, cp = fk.make_nccl_module(21805, True), fk.make_cupy_module()
    monkeypatch.setattr(nb, "_import_nccl", lambda: (cp, nccl))
    monkeypatch.setattr(nb, "missing_requirement", lambda: None)
    store = DictStore()
    _, errors = run_threads(lambda r: nb.NCCLBackend.create(store, r, 2, timeout=5.0), 2)
    for err in errors:
        assert isinstance(err, DistributedError), errors
        assert "ranks [0, 1] all chose cuda:0" in str(err) and "--nproc_per_node" in str(err)


def test_world_of_one_with_nccl_and_no_cupy_says_what_to_install(monkeypatch):
    import neural_arch.distributed as dist
    from neural_arch.distributed.comm.nccl import support as _nccl_support

    monkeypatch.setattr(_nccl_support, "_import_nccl", lambda: (None, None))
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    try:
        with pytest.raises(ImportError, match=r"neural_arch\[gpu\]"):
            dist.init_process_group("nccl")   # before: a silent local world that reported "nccl"
        assert not dist.is_initialized()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
