"""Solution to notebook 04's exercise: one SGD-with-momentum step, ZeRO-1 style, by hand.

Each parameter has one owner rank (here: round robin); only the owner keeps its momentum buffer
and updates it, then every parameter is broadcast from its owner so all ranks hold all of them.
The arithmetic is torch's SGD: ``buf = grad`` on the first step, then ``buf = momentum * buf + grad``;
``param -= lr * buf``.

>>> import numpy as np
>>> p, state = [np.ones(2)], {}
>>> zero1_step(p, [np.ones(2)], state, rank=0, world=1, lr=0.5, momentum=0.9)
>>> p[0], sorted(state)
(array([0.5, 0.5]), [0])
"""


def zero1_step(params, grads, state, rank, world, lr, momentum):
    import neural_arch.distributed as dist

    for i, (p, g) in enumerate(zip(params, grads)):
        owner = i % world
        if owner == rank:
            buf = state.get(i)
            state[i] = buf = g.copy() if buf is None else momentum * buf + g
            p -= lr * buf
        if world > 1:
            dist.broadcast(p, src=owner)         # the owner's updated parameter, to every rank
