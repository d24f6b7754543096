"""``MemoryEstimate``: bytes per rank by category, and the peak of one training step.

The categories are what a rank holds, each at its own largest (activations at the end of the
forward, gradients at the end of the backward...). They do not all exist at once, so the total
is not their sum: :attr:`MemoryEstimate.total` is the peak over the three phases of a step
(``forward``, ``backward``, ``optimizer``), each phase the sum of what coexists in it (see
:func:`neural_arch.memory.estimate` for the formulas).

Example::

    >>> from neural_arch.memory.result import MemoryEstimate
    >>> e = MemoryEstimate("ddp", 1, parameters=100, gradients=100, optimizer_state=200, gathered=100,
    ...                    activations=50, temporary=10, phases={"forward": 450, "backward": 500, "optimizer": 510})
    >>> e.total, e.peak_phase
    (510, 'optimizer')
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["MemoryEstimate"]

#: the categories, in the order the table prints them
CATEGORIES = ("parameters", "gradients", "optimizer_state", "gathered", "activations", "temporary")


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per rank (the worst rank) for one training step of one strategy.

    Attributes:
        strategy, world_size: what was estimated.
        parameters: the parameter arrays this rank keeps between steps (shards under ZeRO-3/FSDP;
            ZeRO-2's model copy plus its flat master shards).
        gradients: the gradient arrays at the end of the backward (sharded where the strategy shards them).
        optimizer_state: the optimizer's state arrays (Adam's two moments).
        gathered: communication buffers at their largest: DDP's gradient buckets, ZeRO-1's broadcast
            buffers, ZeRO-2's buckets, FSDP's all-gathered units.
        activations: what the forward keeps alive for the backward (at the end of the forward).
        temporary: the largest transient array set outside the categories (the optimizer step's
            scratch arrays, a gradient on its way to its bucket or shard).
        phases: ``{"forward": ..., "backward": ..., "optimizer": ...}``: what coexists at the worst
            moment of each phase.
        notes: what the estimate assumes or leaves out.

    Example::

        >>> from neural_arch import memory, nn
        >>> model = nn.GPT(vocab_size=64, block_size=8, n_layer=1, n_head=2, n_embd=16)
        >>> e = memory.estimate(model, strategy="ddp", world_size=2, batch=2, seq=8)
        >>> e.total == max(e.phases.values()), e.parameters == e.gradients
        (True, True)
    """

    strategy: str
    world_size: int
    parameters: int
    gradients: int
    optimizer_state: int
    gathered: int
    activations: int
    temporary: int
    phases: dict = field(default_factory=dict)
    notes: tuple = ()

    @property
    def total(self) -> int:
        """The peak bytes of one step, which is the largest phase.

        Example::

            >>> from neural_arch.memory.result import MemoryEstimate
            >>> MemoryEstimate("tp", 2, 1, 1, 2, 0, 3, 0, {"forward": 7, "backward": 5, "optimizer": 4}).total
            7
        """
        return max(self.phases.values()) if self.phases else 0

    @property
    def peak_phase(self) -> str:
        """The phase that sets :attr:`total` (``"forward"``, ``"backward"`` or ``"optimizer"``).

        Example::

            >>> from neural_arch.memory.result import MemoryEstimate
            >>> MemoryEstimate("tp", 2, 1, 1, 2, 0, 3, 0, {"forward": 7, "backward": 5, "optimizer": 4}).peak_phase
            'forward'
        """
        return max(self.phases, key=self.phases.get) if self.phases else ""

    def as_dict(self) -> dict:
        """Every category, the phases, ``total`` and ``peak_phase`` as plain data (for JSON).

        Example::

            >>> from neural_arch.memory.result import MemoryEstimate
            >>> sorted(MemoryEstimate("ddp", 1, 1, 1, 2, 1, 0, 0, {"forward": 5}).as_dict())[:3]
            ['activations', 'gathered', 'gradients']
        """
        out = {name: getattr(self, name) for name in CATEGORIES}
        out.update(strategy=self.strategy, world_size=self.world_size, phases=dict(self.phases),
                   total=self.total, peak_phase=self.peak_phase, notes=list(self.notes))
        return out

    def __str__(self) -> str:
        rows = [(name.replace("_", " "), getattr(self, name)) for name in CATEGORIES]
        rows += [(f"{phase} phase", value) for phase, value in self.phases.items()]
        rows.append((f"total (peak, in {self.peak_phase})", self.total))
        width = max(len(label) for label, _ in rows)
        lines = [f"memory.estimate: {self.strategy}, world_size {self.world_size}, bytes per rank (worst rank)"]
        lines += [f"  {label:<{width}}  {value / 2**20:>10.2f} MiB" for label, value in rows]
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)
