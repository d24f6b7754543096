"""``DTensorParameter``: a learnable :class:`~neural_arch.nn.Parameter` that is also a
:class:`~neural_arch.distributed.tensor.DTensor` (torch's ``nn.Parameter(DTensor)``).

torch's tensor-parallel styles turn each sharded weight into a DTensor parameter, and torch's
optimizers step it through DTensor's operators. Ours step arrays, so the object has two faces:

* its **Tensor face** is this rank's piece: ``.data``, ``.grad``, ``.shape`` and every operator are
  the local shard's, so layers, autograd and every optimizer work on it unchanged (the numbers are
  those of the plain local parameter it replaces);
* its **DTensor face** says what the piece is a part of: ``placements``, ``device_mesh``,
  ``to_local()`` (the parameter itself), ``full_tensor()`` (a collective) and ``redistribute()``;
  the *global* shape is ``dtensor_shape``.

Distributed checkpoints and the state-dict helpers read the DTensor face: a parameter saved on one
mesh loads into any other (see :mod:`neural_arch.distributed.checkpoint.state_dict`).
:func:`neural_arch.optim.clip_grad_norm_` reads ``_norm_shard`` (it does not import ``distributed``):
the groups over which the parameter's ``|g|**p`` sums are summed to the global norm (the groups of
the mesh dimensions on which it is ``Shard``; ``Replicate`` dimensions hold copies), with the
interface of FSDP's ``FlatShard`` (``group``, ``all_reduce_norm``).

Example (2 ranks of a tp mesh; a column-parallel ``Linear(3, 4)`` weight)::

    w = DTensorParameter(local_rows, mesh, [Shard(0)], global_shape=(4, 3))
    w.shape, w.dtensor_shape, w.placements      # (2, 3), (4, 3), (Shard(dim=0),)
    w.full_tensor()                             # the whole (4, 3) weight on every rank
"""

from __future__ import annotations

from functools import cached_property

import numpy as np

from neural_arch.core.tensor import Tensor
from neural_arch.distributed.comm.work import ReduceOp
from neural_arch.distributed.tensor._api import DTensor, _normalize, compute_local_shape_and_global_offset
from neural_arch.distributed.tensor.placement_types import Shard
from neural_arch.nn.parameter import Parameter

__all__ = ["DTensorParameter"]


class DTensorParameter(Parameter, DTensor):
    """A Parameter holding this rank's piece of a global parameter laid out by ``placements``.

    Args:
        data: this rank's piece (an array or a Tensor, as ``Parameter``); its shape must be the
            ``torch.chunk`` piece of ``global_shape`` under ``placements`` on this rank.
        device_mesh: the :class:`~neural_arch.distributed.device_mesh.DeviceMesh` it lives on.
        placements: one ``Shard``/``Replicate`` per mesh dimension.
        global_shape: the whole parameter's shape.

    Example::

        b = DTensorParameter(bias_array, tp_mesh, [Replicate()], global_shape=bias_array.shape)
        b.to_local() is b, b.placements          # (True, (Replicate(),))
    """

    def __init__(self, data, device_mesh, placements, global_shape, requires_grad: bool = True, device=None):
        Parameter.__init__(self, data, requires_grad=requires_grad, device=device)
        global_shape = tuple(int(s) for s in global_shape)
        placements = _normalize(placements, device_mesh, len(global_shape), "DTensorParameter")
        want, _ = compute_local_shape_and_global_offset(global_shape, device_mesh, placements)
        if tuple(self.data.shape) != want:
            raise ValueError(f"DTensorParameter: this rank's piece has shape {tuple(self.data.shape)} but placements "
                             f"{list(placements)} of global shape {global_shape} on {device_mesh!r} give it {want}")
        self.device_mesh = device_mesh
        self.placements = placements
        self._shape = global_shape

    @property
    def _local_tensor(self) -> Tensor:
        # the Tensor face *is* the local piece: DTensor's methods (full_tensor, redistribute) use it
        return self

    @property
    def dtensor_shape(self) -> tuple[int, ...]:
        """The global shape (the DTensor's ``shape``; ``.shape`` is the local piece's)."""
        return self._shape

    @cached_property
    def _norm_shard(self) -> ShardGroupsNorm:
        """How ``clip_grad_norm_`` totals this parameter's part of the norm over the ranks (computed
        once; assignable, like the ``_norm_shard`` other strategies set on plain parameters)."""
        mesh = self.device_mesh
        return ShardGroupsNorm(mesh.get_group(k) for k, p in enumerate(self.placements)
                               if isinstance(p, Shard) and mesh.size(k) > 1)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(local_tensor={Tensor.__repr__(self)}, device_mesh={self.device_mesh!r}, "
                f"placements={self.placements}, shape={self._shape})")


class ShardGroupsNorm:
    """The groups a DTensor parameter's gradient is split over, for the global gradient norm.

    FSDP's ``FlatShard`` interface, which :func:`neural_arch.optim.clip_grad_norm_` duck-types:
    ``group`` (a hashable key: the tuple of the ``Shard`` mesh dimensions' groups, None when the
    parameter is whole on this rank) and ``all_reduce_norm(value, op)``, a sum (or max) over every
    one of those groups in turn, i.e. over all the ranks holding the other pieces.

    Example::

        fc1.weight._norm_shard.group     # (tp_group,) for a column-parallel weight; None: Replicate
    """

    __slots__ = ("group",)

    def __init__(self, groups):
        self.group = tuple(groups) or None

    def all_reduce_norm(self, value, op: str):
        """``value`` summed (``op="sum"``) or maxed (``"max"``) over every group: a collective. A
        float gives a float; a 1-element array is reduced in place and returned."""
        scalar = isinstance(value, (int, float))
        buf = np.array([value], dtype=np.float64) if scalar else value
        for g in self.group or ():
            g.backend.allreduce(buf, ReduceOp.SUM if op == "sum" else ReduceOp.MAX)
        return float(buf[0]) if scalar else buf

    def __repr__(self) -> str:
        return f"ShardGroupsNorm({0 if self.group is None else len(self.group)} groups)"
