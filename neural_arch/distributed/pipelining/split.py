"""``pipeline(module, ...)``: cut a ``Sequential`` or the project's ``GPT`` into stage modules.

The stage modules **share** the original model's parameters (nothing is copied) and keep the
original parameter names (``"3.weight"``, ``"blocks.5.attn.q_proj.weight"``), so a stage's
``named_parameters()`` can be compared with, or loaded from, the full model's.

* ``Sequential``: stage k runs children ``[split_points[k-1], split_points[k])``.
* ``GPT``: split points index ``blocks``; the embeddings (``tok_emb``, ``pos_emb``, ``drop``) run
  on the first stage, ``ln_f`` and ``head`` on the last (the loss goes to the schedule's ``loss_fn``).

``balance`` picks split points when only ``num_stages`` is given: ``"layers"`` gives each stage
the same number of layers (blocks), ``"params"`` balances the parameter counts (the contiguous
split that minimises the largest stage; GPT's embedding and head count towards the first/last).

Example::

    >>> from neural_arch import nn
    >>> model = nn.Sequential(*[nn.Linear(4, 4) for _ in range(6)])
    >>> pipe = pipeline(model, num_stages=3)
    >>> pipe.split_points, [n for n, _ in pipe[1].named_parameters()]
    ([2, 4], ['2.weight', '2.bias', '3.weight', '3.bias'])
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Sequence

from neural_arch.nn.container import ModuleDict, Sequential
from neural_arch.nn.module import Module
from neural_arch.nn.transformer import GPT


def _count(module: Module) -> int:
    return sum(int(p.data.size) for p in module.parameters())


def balanced_split_points(weights: Sequence[float], num_stages: int) -> list[int]:
    """Split points (cut before these indices) of the contiguous partition of ``weights`` into
    ``num_stages`` non-empty parts whose largest sum is smallest (ties: earliest cuts).

    Example::

        >>> balanced_split_points([4, 1, 1, 1, 1, 4], 3)      # parts [4], [1, 1, 1, 1], [4]
        [1, 5]
    """
    n = len(weights)
    if not 1 <= num_stages <= n:
        raise ValueError(f"num_stages={num_stages} must be between 1 and the number of layers ({n})")
    prefix = [0.0]
    for w in weights:
        prefix.append(prefix[-1] + float(w))
    inf = float("inf")
    # best[k][i]: smallest max-part cost of splitting the first i layers into k parts
    best = [[inf] * (n + 1) for _ in range(num_stages + 1)]
    cut = [[0] * (n + 1) for _ in range(num_stages + 1)]
    best[0][0] = 0.0
    for k in range(1, num_stages + 1):
        for i in range(k, n + 1):
            for j in range(k - 1, i):
                cost = max(best[k - 1][j], prefix[i] - prefix[j])
                if cost < best[k][i]:
                    best[k][i], cut[k][i] = cost, j
    points, i = [], n
    for k in range(num_stages, 0, -1):
        i = cut[k][i]
        points.append(i)
    return sorted(points)[1:]


def even_split_points(n: int, num_stages: int) -> list[int]:
    """Equal layer counts (the first ``n % num_stages`` stages get one more).

    Example::

        >>> even_split_points(5, 2)                           # 3 layers, then 2
        [3]
    """
    if not 1 <= num_stages <= n:
        raise ValueError(f"num_stages={num_stages} must be between 1 and the number of layers ({n})")
    base, extra = divmod(n, num_stages)
    points, at = [], 0
    for k in range(num_stages - 1):
        at += base + (1 if k < extra else 0)
        points.append(at)
    return points


class GPTStage(Module):
    """Blocks ``[start, stop)`` of a ``GPT``, plus its embeddings (first) and final norm + head (last).

    Example::

        >>> import numpy as np
        >>> from neural_arch import nn
        >>> from neural_arch.core.tensor import Tensor
        >>> gpt = nn.GPT(vocab_size=16, block_size=8, n_layer=2, n_head=2, n_embd=32)
        >>> first = GPTStage(gpt, 0, 1)                      # embeddings + block 0
        >>> first(Tensor(np.zeros((1, 4), dtype=np.int64))).shape
        (1, 4, 32)
    """

    def __init__(self, gpt: GPT, start: int, stop: int):
        super().__init__()
        self.first, self.last = start == 0, stop == len(gpt.blocks)
        self.start, self.stop = start, stop
        if self.first:
            self.tok_emb, self.pos_emb, self.drop = gpt.tok_emb, gpt.pos_emb, gpt.drop
            self.block_size = gpt.block_size
        self.blocks = ModuleDict(OrderedDict((str(i), gpt.blocks[i]) for i in range(start, stop)))
        if self.last:
            self.ln_f, self.head = gpt.ln_f, gpt.head

    def forward(self, x):
        if self.first:
            x = GPT.embed(self, x)  # reads tok_emb/pos_emb/drop/block_size, which this stage holds
        for i in range(self.start, self.stop):
            x = self.blocks[str(i)](x)
        if self.last:
            x = self.head(self.ln_f(x))
        return x

    def extra_repr(self) -> str:
        return f"blocks [{self.start}, {self.stop}), first={self.first}, last={self.last}"


class Pipe:
    """The result of :func:`pipeline`: ``pipe[k]`` is stage k's module; ``build_stage`` wraps one.

    Example::

        >>> from neural_arch import nn
        >>> pipe = pipeline(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)), split_points=[2])
        >>> pipe.num_stages, len(pipe[0]), len(pipe[1])
        (2, 2, 1)
    """

    def __init__(self, stages: list[Module], split_points: list[int]):
        self.stages = stages
        self.split_points = split_points

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    def __len__(self) -> int:
        return len(self.stages)

    def __getitem__(self, k: int) -> Module:
        return self.stages[k]

    def __iter__(self):
        return iter(self.stages)

    def get_stage_module(self, stage_index: int) -> Module:
        """torch's name for ``pipe[stage_index]``."""
        return self.stages[stage_index]

    def build_stage(self, stage_index: int, device=None, group=None, dp_group=None):
        """A :class:`~.stage.PipelineStage` running stage ``stage_index`` on this rank."""
        from neural_arch.distributed.pipelining.stage import PipelineStage

        return PipelineStage(self.stages[stage_index], stage_index, self.num_stages, device=device, group=group,
                             dp_group=dp_group)

    def __repr__(self) -> str:
        sizes = [_count(s) for s in self.stages]
        return f"Pipe({self.num_stages} stages, split_points={self.split_points}, parameters per stage={sizes})"


def pipeline(module: Module, split_points: Sequence[int] | None = None, num_stages: int | None = None,
             balance: str = "params") -> Pipe:
    """Split ``module`` (a ``Sequential`` or a ``GPT``) into pipeline stages.

    Args:
        module: the model; the stages share its parameters.
        split_points: indices (children of a Sequential, blocks of a GPT) where a new stage
            starts, increasing, e.g. ``[2, 4]`` for 3 stages. Or give ``num_stages``.
        num_stages: the number of stages, split points chosen by ``balance``.
        balance: ``"params"`` (equalise parameter counts) or ``"layers"`` (equalise layer counts).

    Example::

        >>> from neural_arch import nn
        >>> gpt = nn.GPT(vocab_size=16, block_size=8, n_layer=2, n_head=2, n_embd=16)
        >>> pipe = pipeline(gpt, num_stages=2)
        >>> pipe.split_points, type(pipe[0]).__name__
        ([1], 'GPTStage')
    """
    if isinstance(module, GPT):
        units = list(module.blocks)
        weights = [_count(b) for b in units]
        if weights:
            weights[0] += _count(module.tok_emb) + _count(module.pos_emb)
            weights[-1] += _count(module.ln_f) + _count(module.head)
        what = "blocks of the GPT"
    elif isinstance(module, Sequential):
        units = list(module._modules.items())
        weights = [_count(m) for _, m in units]
        what = "children of the Sequential"
    else:
        raise TypeError(f"pipeline(): can split an nn.Sequential or nn.GPT, got {type(module).__name__}; wrap "
                        "your layers in a Sequential (one child per layer)")
    n = len(units)
    if (split_points is None) == (num_stages is None):
        raise ValueError("pipeline(): pass exactly one of split_points=[...] or num_stages=N")
    if split_points is None:
        if not isinstance(num_stages, int) or not 1 <= num_stages <= n:
            raise ValueError(f"pipeline(): num_stages={num_stages!r} must be an int between 1 and the number of "
                             f"{what} ({n})")
        if balance == "params":
            split_points = balanced_split_points(weights, num_stages)
        elif balance == "layers":
            split_points = even_split_points(n, num_stages)
        else:
            raise ValueError(f"pipeline(): balance={balance!r} must be 'params' or 'layers'")
    split_points = [int(s) for s in split_points]
    if any(not 0 < s < n for s in split_points) or any(a >= b for a, b in itertools.pairwise(split_points)):
        raise ValueError(f"pipeline(): split_points={split_points} must be strictly increasing indices in "
                         f"[1, {n - 1}] ({n} {what}); each stage needs at least one layer")
    bounds = [0] + split_points + [n]
    if isinstance(module, GPT):
        stages: list[Module] = [GPTStage(module, a, b) for a, b in itertools.pairwise(bounds)]
    else:
        stages = [Sequential(OrderedDict(units[a:b])) for a, b in itertools.pairwise(bounds)]
    return Pipe(stages, split_points)


__all__ = ["GPTStage", "Pipe", "balanced_split_points", "even_split_points", "pipeline"]
