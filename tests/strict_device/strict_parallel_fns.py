"""Rank functions of the strict-device parallelism tests (module level: the ranks import them by name).

Each case runs one strategy's training step twice on the same ranks: once with plain NumPy
(float64) and once with every array on the strict fake device, counting what the device step
made the host do. It returns plain data for the parent to assert on:

* ``diff``: the largest difference between the device and the NumPy results;
* ``outside``: every device-to-host transfer / synchronisation / host-to-device copy made
  **outside the communication backend**, as ``"kind: what @ where"`` strings (the design promises
  none in a training step);
* ``staged``: how many transfers the gloo backend itself made (a CPU backend stages device
  arrays through the host with ``backend.to_host`` / ``to_device_like``: allowed, reported only);
* ``on_device``: parameters (and gradients where the step leaves them) are still device arrays.
"""

from __future__ import annotations

import os
import sys

import numpy as np

DEVICE = "fake"
#: ``"cuda"``: run the same cases on a real GPU with CuPy (``tests/gpu/test_parallel_on_gpu.py``): no fake
#: device, nothing counted; only the equality with NumPy and where the arrays live are checked
REAL_DEVICE = os.environ.get("STRICT_FNS_REAL_DEVICE", "")
_COMM = os.sep + os.path.join("neural_arch", "distributed", "comm") + os.sep


class _Recorder:
    """A ``fake_device`` recorder that also notes whether the event came from inside the comm layer.

    ``fake_device.counting()`` keeps only file basenames; to tell the backend's own staging
    (``neural_arch/distributed/comm/``) from a strategy's host transfer it needs full paths.
    """

    def __init__(self):
        self.outside: list = []
        self.staged = 0

    def _add(self, kind: str, what: str, where: str) -> None:
        f = sys._getframe(1)
        while f is not None:
            if _COMM in os.path.normcase(os.path.abspath(f.f_code.co_filename)):
                self.staged += 1
                return
            f = f.f_back
        self.outside.append(f"{kind}: {what} @ {where}")


class _counting:
    def __enter__(self):
        import fake_device as fd

        self.rec = _Recorder()
        with fd._lock:
            fd._recorders.append(self.rec)
        return self.rec

    def __exit__(self, *exc):
        import fake_device as fd

        with fd._lock:
            fd._recorders.remove(self.rec)
        return False


def _host(x) -> np.ndarray:
    from neural_arch import backend
    from neural_arch.core.tensor import Tensor

    # never getattr(x, "data", x): a device array's .data is its memory pointer (docs/gpu.md)
    return np.asarray(backend.to_host(x.data if isinstance(x, Tensor) else x), dtype=np.float64)


def _max_diff(a: dict, b: dict) -> float:
    return max(float(np.max(np.abs(_host(a[k]) - _host(b[k])))) if np.size(_host(a[k])) else 0.0 for k in a)


def _is_device_array(a) -> bool:
    if REAL_DEVICE:
        import cupy

        return isinstance(a, cupy.ndarray)
    import fake_device as fd

    return type(a) is fd.FakeArray


def _on_device(params) -> bool:
    return all(_is_device_array(p.data) for p in params)


def _dev(x, device):
    """``x`` (NumPy) on ``device`` (None: stays NumPy). Done before counting starts: the input copy
    is the data loader's, not the step's."""
    from neural_arch import backend

    return x if device is None else backend.to_device(x, device)


def _case(run):
    """Run ``run(device, count)`` on NumPy then on the fake device; ``count`` is a context manager
    the case wraps around its training step. Returns the summary described in the module docstring."""
    import contextlib

    import fake_device as fd

    ref = run(None, contextlib.nullcontext)
    if REAL_DEVICE:
        @contextlib.contextmanager
        def nothing_counted():
            yield _Recorder()

        got, on_device = run(REAL_DEVICE, nothing_counted)
        return {"diff": _max_diff(got, ref[0]), "on_device": on_device, "outside": [], "staged": 0}
    fd.install(DEVICE)
    try:
        recs = []

        @contextlib.contextmanager
        def count():
            with _counting() as rec:
                yield rec
            recs.append(rec)

        got, on_device = run(DEVICE, count)
        diff = _max_diff(got, ref[0])  # while the device is registered: to_host must know its arrays
    finally:
        fd.uninstall(DEVICE)
    return {"diff": diff, "on_device": on_device,
            "outside": [e for r in recs for e in r.outside], "staged": sum(r.staged for r in recs)}


# ----------------------------------------------------------------------------------- tensor parallel
TP_GPT = {"vocab_size": 16, "block_size": 8, "n_layer": 2, "n_head": 4, "n_embd": 16}


def tp_gpt_run(steps: int = 2):
    """``parallelize_gpt`` (vocab-parallel loss) + Adam, 2 steps."""
    import neural_arch.distributed as dist  # noqa: F401  (the group is initialised by the pool)
    from neural_arch import nn, optim
    from neural_arch.core.tensor import manual_seed
    from neural_arch.distributed.tensor.parallel import parallelize_gpt, vocab_parallel_cross_entropy

    def run(device, count):
        manual_seed(0)
        model = nn.GPT(**TP_GPT).double()
        if device:
            model.to(device)
        tp = parallelize_gpt(model, None, loss_parallel=True)
        opt = optim.Adam(tp.parameters(), lr=1e-2)
        rng = np.random.default_rng(5)
        for _ in range(steps):
            idx = _dev(rng.integers(0, TP_GPT["vocab_size"], size=(3, TP_GPT["block_size"])), device)
            tgt = _dev(rng.integers(0, TP_GPT["vocab_size"], size=(3, TP_GPT["block_size"])), device)
            with count():
                loss = vocab_parallel_cross_entropy(tp(idx), tgt)
                loss.backward()
                opt.step()
                opt.zero_grad()
        return tp.state_dict(), _on_device(tp.parameters())

    return _case(run)


# ----------------------------------------------------------------------------------- pipeline
def pp_1f1b_run(steps: int = 2, microbatches: int = 4):
    """A 2-stage MLP pipeline (one stage per rank) under ``Schedule1F1B`` + SGD, 2 steps."""
    import neural_arch.distributed as dist
    import neural_arch.nn.functional as F
    from neural_arch import nn, optim
    from neural_arch.core.tensor import manual_seed
    from neural_arch.distributed import pipelining as pl

    def run(device, count):
        manual_seed(0)
        layers = [nn.Linear(6, 12, dtype=np.float64), nn.Tanh(), nn.Linear(12, 12, dtype=np.float64),
                  nn.Tanh(), nn.Linear(12, 4, dtype=np.float64)]
        model = nn.Sequential(*layers)
        if device:
            model.to(device)
        pipe = pl.pipeline(model, num_stages=dist.get_world_size())
        # its own group: a failing pipeline aborts (poisons) its group, and the pool's default
        # group must stay usable for the other cases
        group = dist.new_group(list(range(dist.get_world_size())))
        stage = pipe.build_stage(dist.get_rank(), group=group)
        schedule = pl.Schedule1F1B(stage, microbatches, loss_fn=F.cross_entropy)
        params = list(stage.submodule.parameters())
        opt = optim.SGD(params, lr=0.1, momentum=0.9)
        rng = np.random.default_rng(9)
        for _ in range(steps):
            X = _dev(rng.normal(size=(2 * microbatches, 6)), device)
            y = _dev(rng.integers(0, 4, size=2 * microbatches), device)
            with count():
                schedule.step(*((X,) if stage.is_first else ()), target=y if stage.is_last else None)
                opt.step()
                opt.zero_grad()
        return dict(stage.submodule.named_parameters()), _on_device(params)

    return _case(run)


# ----------------------------------------------------------------------------------- ZeRO / FSDP
def _mlp(seed: int):
    from neural_arch import nn

    rng = np.random.default_rng(seed)
    model = nn.Sequential(nn.Linear(6, 16, dtype=np.float64), nn.ReLU(),
                          nn.Sequential(nn.Linear(16, 16, dtype=np.float64), nn.Tanh()),
                          nn.Linear(16, 4, dtype=np.float64))
    for p in model.parameters():
        p.data[...] = rng.normal(0, 0.5, size=p.data.shape)
    return model


def _batches(steps: int, per_rank: int = 3):
    import neural_arch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    rng = np.random.default_rng(3)
    out = []
    for _ in range(steps):
        X = rng.normal(size=(world * per_rank, 6))
        y = rng.integers(0, 4, size=world * per_rank)
        mine = slice(rank * per_rank, (rank + 1) * per_rank)
        out.append((X[mine], y[mine]))
    return out


def zero_run(stage: int, steps: int = 2):
    """``ZeroRedundancyOptimizer(Adam)``: stage 1 after an all-reduce of each gradient (not DDP:
    DDP's own strict check is test_strict_ddp.py, and its per-step control read would be counted
    against ZeRO here), stage 2 on its own (it reduce-scatters the gradients itself)."""
    import neural_arch.distributed as dist
    import neural_arch.nn.functional as F
    from neural_arch import optim
    from neural_arch.core.tensor import Tensor
    from neural_arch.distributed.optim import ZeroRedundancyOptimizer

    def run(device, count):
        model = _mlp(0)
        if device:
            model.to(device)
        opt = ZeroRedundancyOptimizer(model.parameters(), optim.Adam, stage=stage, lr=0.05)
        for X, y in _batches(steps):
            x, t = Tensor(_dev(X, device)), _dev(y, device)
            with count():
                F.cross_entropy(model(x), t).backward()
                if stage == 1:
                    for p in model.parameters():
                        dist.all_reduce(p.grad, dist.ReduceOp.AVG)
                opt.step()
                opt.zero_grad()
        return model.state_dict(), _on_device(model.parameters())

    return _case(run)


def fsdp_run(clip: bool = False, strategy: str = "FULL_SHARD", steps: int = 2):
    """``FSDP`` (every Linear a unit) + Adam (+ ``fsdp.clip_grad_norm_`` if ``clip``). Also returns
    ``host_params``: the FSDP parameters that are not on the device (name, shape, dtype)."""
    import neural_arch.nn.functional as F
    from neural_arch import nn, optim
    from neural_arch.core.tensor import Tensor
    from neural_arch.distributed.fsdp import FSDP, ShardingStrategy

    def run(device, count):
        model = _mlp(0)
        if device:
            model.to(device)
        fsdp = FSDP(model, sharding_strategy=ShardingStrategy[strategy], auto_wrap_policy={nn.Linear})
        opt = optim.Adam(fsdp.parameters(), lr=0.05)
        for X, y in _batches(steps):
            x, t = Tensor(_dev(X, device)), _dev(y, device)
            with count():
                F.cross_entropy(fsdp(x), t).backward()
                if clip:
                    fsdp.clip_grad_norm_(0.5)
                opt.step()
                opt.zero_grad()
        host_params.extend((n, tuple(p.shape), str(p.dtype)) for n, p in fsdp.named_parameters()
                           if device and not _is_device_array(p.data))
        return dict(fsdp.named_parameters()), _on_device(p for p in fsdp.parameters() if _holds_elements(p))

    host_params: list = []
    out = _case(run)
    out["host_params"] = host_params
    return out


def _holds_elements(p) -> bool:
    """Whether an FSDP flat parameter holds any of the model's elements (not only padding)."""
    shard = getattr(p, "_flat_shard", None)
    return shard is None or bool(getattr(shard, "params", True))


# ----------------------------------------------------------------------------------- checkpoint
def dcp_roundtrip_run(directory: str):
    """The documented save/resume path on 2 ranks, model and Adam state on the device:
    ``get_state_dict`` + ``dcp.save``, then into a fresh model/optimizer ``get_state_dict`` +
    ``dcp.load`` + ``set_state_dict``.

    Returns the events of each part (save; building the load targets; load + set), the number of arrays in the state (model parameters and
    Adam's two moments per parameter), and the round-trip difference of every array."""
    import fake_device as fd

    import neural_arch.distributed as dist
    import neural_arch.nn.functional as F
    from neural_arch import optim
    from neural_arch.core.tensor import Tensor
    from neural_arch.distributed import checkpoint as dcp
    from neural_arch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    def fmt(items):
        return [f"{w} @ {loc}" for w, loc in items]

    def trained(seed: int, steps: int):
        model = _mlp(seed).to(DEVICE)
        opt = optim.Adam(model.parameters(), lr=0.05)
        rng = np.random.default_rng(4)  # the same batch on every rank: the replicas stay equal
        for _ in range(steps):
            X, y = _dev(rng.normal(size=(4, 6)), DEVICE), _dev(rng.integers(0, 4, size=4), DEVICE)
            F.cross_entropy(model(Tensor(X)), y).backward()
            opt.step()
            opt.zero_grad()
        return model, opt

    def arrays(model, opt):
        out = {f"model.{n}": p for n, p in model.named_parameters()}
        for i, p in enumerate(model.parameters()):
            for k, v in opt.state[p].items():
                if k != "step":
                    out[f"optim.{i}.{k}"] = v
        return out

    fd.install(DEVICE)
    try:
        model, opt = trained(0, 2)
        want = {k: _host(v) for k, v in arrays(model, opt).items()}
        path = os.path.join(directory, "ckpt")
        with fd.counting() as save_ev:
            model_sd, optim_sd = get_state_dict(model, opt)
            dcp.save({"model": model_sd, "optim": optim_sd}, path)
        dist.barrier()
        fresh, fresh_opt = trained(1, 1)  # other weights, and state to overwrite
        with fd.counting() as target_ev:  # the load targets: host state dicts, like a save's
            model_sd, optim_sd = get_state_dict(fresh, fresh_opt)
        state = {"model": model_sd, "optim": optim_sd}
        with fd.counting() as load_ev:
            dcp.load(state, path)
            set_state_dict(fresh, fresh_opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        got = arrays(fresh, fresh_opt)
        host = sorted(k for k, v in got.items() if type(v.data if isinstance(v, Tensor) else v) is not fd.FakeArray)
        on_device = not host
        return {"diff": _max_diff({k: _host(v) for k, v in got.items()}, want), "on_device": on_device,
                "host": host, "arrays": len(want), "save_to_host": fmt(save_ev.to_host), "save_syncs": fmt(save_ev.syncs),
                "target_to_host": fmt(target_ev.to_host), "target_syncs": fmt(target_ev.syncs),
                "load_out": fmt(load_ev.host_waits), "load_in": fmt(load_ev.from_host)}
    finally:
        fd.uninstall(DEVICE)
