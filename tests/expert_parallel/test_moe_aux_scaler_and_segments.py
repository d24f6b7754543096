"""In-process checks behind MoE under pipelining and context parallelism (the 5-D script's
launcher tests prove the training equal to one process):

* ``MoEAuxLossAutoScaler``: an MoE whose output carries its aux loss (``aux_loss_backward_scale=s``)
  gives the gradients of ``loss + s * aux_loss`` from the output's gradient alone, with the same
  output and ``moe.aux_loss``;
* ``route_segments``: capacity served in global order from runs of tokens held by different ranks in
  any order equals serving the whole batch in one process.
"""

import numpy as np

from neural_arch import Tensor, nn
from neural_arch.core.tensor import manual_seed
from neural_arch.nn.moe import route_counts, route_segments


def _moe(scale):
    manual_seed(4)
    moe = nn.MoE(6, num_experts=4, top_k=2, hidden_dim=5, capacity_factor=0.75, z_loss_coef=0.1,
                 aux_loss_backward_scale=scale).double()
    moe.router.weight.data[...] = np.random.default_rng(2).standard_normal((4, 6))
    return moe


def test_aux_loss_rides_on_the_output_gradient():
    x = np.random.default_rng(0).standard_normal((3, 5, 6))
    w = np.random.default_rng(1).standard_normal((3, 5, 6))
    plain, carried = _moe(None), _moe(0.25)
    xa, xb = Tensor(x, requires_grad=True), Tensor(x, requires_grad=True)
    ya, yb = plain(xa), carried(xb)
    assert np.array_equal(ya.data, yb.data) and float(plain.aux_loss.data) == float(carried.aux_loss.data)
    assert plain.dropped > 0                                    # capacity on: the dropped path too
    ((ya * Tensor(w)).sum() + plain.aux_loss * 0.25).backward()
    (yb * Tensor(w)).sum().backward()                           # the aux loss is not added here
    for (name, p), q in zip(plain.named_parameters(), carried.parameters()):
        assert np.abs(p.grad.data - q.grad.data).max() <= 1e-14, name
    assert np.abs(xa.grad.data - xb.grad.data).max() <= 1e-14
    assert np.abs(plain.router.weight.grad.data).max() > 0


def test_capacity_served_in_global_order_from_segments():
    rng = np.random.default_rng(7)
    n, k, E, ranks = 40, 2, 4, 3
    choice = np.stack([rng.permutation(E)[:k] for _ in range(n)])            # (n, k), global order
    onehot = (choice[:, :, None] == np.arange(E)).astype(np.int64)           # (n, k, E)
    cuts = np.sort(rng.choice(np.arange(1, n), size=9, replace=False))
    runs = np.split(np.arange(n), cuts)                                      # 10 runs of the global order
    held = rng.permutation(len(runs))                                        # held in shuffled order ...
    owners = rng.integers(0, ranks, size=len(runs))                          # ... by random ranks
    counts = np.stack([onehot[runs[s]].sum(axis=0) for s in held])
    keys = np.stack([[0, runs[s][0]] for s in held])
    for capacity in (None, 5, 12):
        offsets, kept = route_segments(counts, keys, owners, ranks, capacity)
        # one process: every token of the batch on one rank, in global order
        off1, kept1 = route_counts(onehot.sum(axis=0)[None], 0, capacity)
        expect = np.zeros((ranks, E), dtype=np.int64)
        cap = n * k if capacity is None else capacity
        for j in range(k):
            served = np.cumsum(onehot[:, j], axis=0) - onehot[:, j] + off1[j]   # before each token
            for i, s in enumerate(held):
                for t in runs[s]:
                    e = choice[t, j]
                    assert offsets[i, j, e] + onehot[runs[s][0]:t, j, e].sum() == served[t, e]
                    expect[owners[i], e] += served[t, e] < cap
        assert np.array_equal(kept, expect) and kept.sum() == kept1.sum(), capacity
