"""Rank functions of the fault-tolerance tests (module level: pickled by reference).

Each pool rank is one replica. The training loop is the one docs/fault_tolerance.md teaches ("Per-step
fault tolerance"): ``zero_grad`` joins the quorum (OptimizerWrapper), the sampler follows the quorum's size and this replica's rank in it,
gradients are averaged across the quorum during backward (ft.DistributedDataParallel), and ``step``
applies the update only when every member of the quorum committed.
"""

from __future__ import annotations

import os
import signal
import time

import numpy as np

N, BATCH, EPOCHS, SEED = 36, 2, 2, 3
SPARE_SIGNAL = "test/start_the_spare"     # set once the survivors committed two steps as a quorum of two
STARTED = "test/started"
SPARE_READY = "test/spare_registered"     # the spare's Manager is up: replica 0 waits for it, so it joins


def model_and_data(seed: int = 0, samples: int = N):
    """A tiny float64 MLP (the same on every replica for seed 0) and ``samples`` rows of its data."""
    from neural_arch import nn

    rng = np.random.default_rng(seed)
    model = nn.Sequential(nn.Linear(3, 4, dtype=np.float64), nn.Tanh(), nn.Linear(4, 2, dtype=np.float64))
    for p in model.parameters():
        p.data[...] = rng.normal(size=p.data.shape)
    data = np.random.default_rng(100)
    return model, data.normal(size=(samples, 3)), data.normal(size=(samples, 2))


def setup(seed: int = 0):
    """:func:`model_and_data` and an Adam optimizer."""
    from neural_arch import optim

    model, X, Y = model_and_data(seed)
    return model, optim.Adam(model.parameters(), lr=0.05), X, Y


def global_batch(epoch: int, processed: int, size: int) -> np.ndarray:
    """The samples a committed step of ``size`` replicas uses (what the single-process reference replays)."""
    order = np.random.default_rng(SEED + epoch).permutation(N)
    return order[processed:processed + min(size * BATCH, N - processed)]


def replica(addr: str, token: str, role: str, kill_at: int | None = None, wait_s: float = 60.0,
            overlap: bool = False):
    """Train until the end of epoch ``EPOCHS - 1`` as one replica.

    ``role``: ``"replica"`` starts at once; ``"victim"`` SIGKILLs itself in the middle of step
    ``kill_at`` (after joining the quorum, before its gradients go out); ``"spare"`` waits until
    the survivors committed two steps without the victim and then starts, from a different initialisation, as the replacement that
    must heal from a live peer. Returns ``(params, log, stats)``: ``log`` has one record per
    committed step (step number, epoch, samples processed before it, quorum size, members, this
    replica's samples).

    ``overlap``: ``Manager(use_async_quorum=True)`` and a loop that overlaps the quorum with the
    forward and backward: an up-to-date replica takes its share of the data from the last committed
    quorum's size and its rank in it, and discards the step if the quorum that arrived differs
    (docs/fault_tolerance.md, "Overlapping the quorum with compute").
    """
    import neural_arch.distributed as dist
    from neural_arch.core.tensor import Tensor
    from neural_arch.distributed import ft
    from neural_arch.distributed.elastic.sampler import ElasticDistributedSampler
    from neural_arch.distributed.rendezvous.tcp_store import TCPStore

    host, _, port = addr.rpartition(":")
    rank = dist.get_rank() if dist.is_initialized() else int(os.environ["RANK"])
    signals = TCPStore(host, int(port), timeout=wait_s, auth_token=token)
    model, adam, X, Y = setup(seed=0 if role != "spare" else 99)
    sampler = ElasticDistributedSampler(dataset_size=N, num_replicas=1, rank=0, shuffle=True, seed=SEED)
    rng = np.random.default_rng(1000 if role != "spare" else 1099)   # the spare's differs until it heals

    def state_dict():
        return {"model": model.state_dict(), "optim": adam.state_dict(), "sampler": sampler.state_dict(),
                "rng": rng.bit_generator.state}

    def load_state_dict(state):
        model.load_state_dict(state["model"])
        adam.load_state_dict(state["optim"])
        sampler.load_state_dict(state["sampler"])
        rng.bit_generator.state = state["rng"]

    if role == "spare":   # everything imported and built before the wait: it registers at once when told
        signals.wait([SPARE_SIGNAL], timeout=wait_s)
    manager = ft.Manager(pg=ft.ProcessGroupGloo(timeout=10.0, transport="tcp"), load_state_dict=load_state_dict,
                         state_dict=state_dict, min_replica_size=2, replica_id=f"replica{rank}",
                         lighthouse_addr=addr, timeout=10.0, quorum_timeout=wait_s, heartbeat_interval=0.05,
                         auth_token=token, init_sync=False,        # seeded alike: nothing to copy at step 0
                         use_async_quorum=overlap)
    if role == "spare":
        signals.set(SPARE_READY, b"1")
    else:   # the three register before any asks (else the first quorum may be two, and the late one heals)
        signals.add(STARTED, 1)
        deadline = time.monotonic() + wait_s
        while int(signals.add(STARTED, 0)) < 3 and time.monotonic() < deadline:
            time.sleep(0.005)
    ddp = ft.DistributedDataParallel(manager, model)
    opt = ft.OptimizerWrapper(manager, adam)
    log, discarded, last, overlapped = [], 0, None, 0
    while sampler.epoch < EPOCHS:
        if overlap:
            pending = manager.start_quorum() is None            # None: the quorum is still on its way
            adam.zero_grad()
            size, me = last if pending and last else (manager.num_participants(), manager.participating_rank())
        else:
            opt.zero_grad()                                     # joins the quorum; heals if behind
            size, me = manager.num_participants(), manager.participating_rank()
        sampler.reset(num_replicas=size, rank=me)
        processed = sampler.processed_samples()
        mine = sampler.indices()[:BATCH][~sampler.padding_mask()[:BATCH]]
        if role == "victim" and manager.current_step() == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        n_global = min(size * BATCH, N - processed)
        if len(mine):
            err = ddp(Tensor(X[mine])) - Tensor(Y[mine])
            loss = (err * err).sum() * (size / n_global)        # the quorum's mean is the global-batch mean
        else:                                                    # only padding here: zero gradients, same collectives
            loss = (ddp(Tensor(X[:1])) * 0.0).sum()
        loss.backward()
        if overlap and (manager.num_participants(), manager.participating_rank()) != (size, me):
            manager.report_error(RuntimeError("the quorum changed under an overlapped step"))
        if opt.step():
            last, overlapped = (size, me), overlapped + (overlap and pending)
            log.append((manager.current_step(), sampler.epoch, processed, size, manager.quorum.members,
                        mine.tolist()))
            sampler.record_samples(BATCH)
            if rank == 0 and sum(1 for entry in log if entry[3] == 2) == 2:
                signals.set(SPARE_SIGNAL, b"1")
                signals.wait([SPARE_READY], timeout=wait_s)   # else the epoch could end before it arrives
            rng.random()                                         # the RNG moves with every committed step
            if sampler.processed_samples() >= N:
                sampler.set_epoch(sampler.epoch + 1)
        else:
            discarded += 1
    stats = {"member": manager.member, "heals": manager.heals, "discarded": discarded,
             "step": manager.current_step(), "rng": rng.bit_generator.state["state"]["state"],
             "heal_bytes": manager.heal_bytes_received, "overlapped": overlapped}
    manager.shutdown()
    signals.close()
    return [p.data.copy() for p in model.parameters()], log, stats


def by_rank(addr: str, token: str, roles: tuple, kill_at: int, overlap: bool = False):
    """Pool entry point: rank ``r`` plays ``roles[r]``."""
    import os

    return replica(addr, token, roles[int(os.environ["RANK"])], kill_at, overlap=overlap)


def reference(log) -> list[np.ndarray]:
    """Single-process Adam over exactly the committed global batches of ``log``."""
    from neural_arch.core.tensor import Tensor

    model, adam, X, Y = setup(seed=0)
    for _step, epoch, processed, size, _members, _mine in log:
        batch = global_batch(epoch, processed, size)
        adam.zero_grad()
        err = model(Tensor(X[batch])) - Tensor(Y[batch])
        ((err * err).sum() * (1.0 / len(batch))).backward()
        adam.step()
    return [p.data.copy() for p in model.parameters()]
