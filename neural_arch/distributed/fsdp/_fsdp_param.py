"""``FSDPParam``: one parameter under ``fully_shard``: its sharded ``DTensor(Shard(0))`` and its
unsharded (gathered) tensor, and where in its module(s) it is registered.

The sharded parameter is what ``module.parameters()`` yields between forwards and what the optimizer
steps: a :class:`~neural_arch.nn.Parameter` whose array is this rank's rows (``torch.chunk`` sizes
of dim 0 over the shard dimension of the mesh), that is also a
:class:`~neural_arch.distributed.tensor.DTensor` (``placements``, ``device_mesh``, ``to_local()``,
``full_tensor()``, ``redistribute()``). Its *Tensor* face is the local shard: ``.data``, ``.grad``,
``.shape`` and arithmetic are the shard's, which is why every optimizer here works on it unchanged
(torch's optimizers step DTensors through DTensor's ops; ours step arrays). Its gradient is the same
kind of object (a Tensor that is a DTensor with the parameter's placements).

A tensor-parallel parameter (a :class:`~neural_arch.distributed.tensor._parameter.DTensorParameter`
on a ``tp`` mesh sliced from the same root mesh as ``fully_shard``'s ``dp`` mesh) is sharded on dim 0
of its local piece, and its sharded parameter lives on the 2-d ``(dp, tp)`` mesh with placements
``(dp placement, tp placement)`` and TP's global shape (torch's FSDP2 x TP): the dp placement is
``Shard(0)``, or ``_StridedShard(0, split_factor=tp)`` where TP shards dim 0 too (a column-parallel
weight: the dp chunk is taken inside the tp chunk). So ``full_tensor()`` is the whole parameter and a
distributed checkpoint of FSDP x TP loads into any other layout.

The unsharded tensor is a leaf whose array is a view into its group's gathered buffer
(:mod:`neural_arch.distributed.fsdp._fsdp_param_group`); while the module's forward runs it sits in the module's parameter slot
(torch swaps the registered parameter the same way), and the autograd engine accumulates the
module's gradient into it.

Example::

    p = next(model.parameters())            # after fully_shard(model)
    isinstance(p, DTensor), p.placements     # (True, (Shard(dim=0),))
    p.to_local() is p, p.full_tensor()       # the local rows; the whole parameter (a collective)
"""

from __future__ import annotations

import math

import numpy as np

from neural_arch import backend as _backend
from neural_arch.core.tensor import Tensor
from neural_arch.distributed.tensor import DTensor
from neural_arch.distributed.tensor._api import _chunk_range
from neural_arch.distributed.tensor._parameter import DTensorParameter
from neural_arch.distributed.tensor.placement_types import Shard, _StridedShard

__all__ = ["FSDPParam", "ShardedGrad", "ShardedParameter"]


def _dtensor_repr(t) -> str:
    return (f"{type(t).__name__}(local_tensor={Tensor.__repr__(t)}, device_mesh={t.device_mesh!r}, "
            f"placements={t.placements}, shape={t._shape})")


class ShardedParameter(DTensorParameter):
    """A sharded parameter: a :class:`~neural_arch.distributed.tensor._parameter.DTensorParameter`
    holding this rank's shard (``fully_shard``'s; ``isinstance`` tells them from TP's).

    ``to_local()`` is the parameter itself; ``full_tensor()`` all-gathers it (differentiably);
    the *global* shape is ``dtensor_shape`` (``.shape`` is the local shard's: the Tensor face).

    Example::

        p = model.weight                     # after fully_shard(model) on 2 ranks, weight (5, 3)
        p.shape, p.dtensor_shape, p.placements   # (3, 3), (5, 3), (Shard(dim=0),)
    """

    #: read by the distributed checkpoint's full state dicts: a model ``fully_shard`` sharded over a
    #: 1-d mesh lives on that mesh's ranks only (a TP DTensor may be replicated on other ranks)
    fully_sharded = True


class ShardedGrad(Tensor, DTensor):
    """The gradient of a :class:`ShardedParameter`: this rank's rows of the averaged gradient, as a
    Tensor (``.data`` is what optimizers read) that is also a DTensor with the parameter's placements.

    Example::

        g = model.weight.grad                # after a synced backward
        g.shape, g.placements, g.full_tensor()
    """

    def __init__(self, data, device_mesh, placements, global_shape):
        Tensor.__init__(self, data)
        self.device_mesh = device_mesh
        self.placements = tuple(placements)
        self._shape = tuple(int(s) for s in global_shape)

    @property
    def _local_tensor(self):
        return self

    @property
    def dtensor_shape(self) -> tuple[int, ...]:
        """The global shape of the gradient."""
        return self._shape

    def __repr__(self) -> str:
        return _dtensor_repr(self)


class FSDPParam:
    """One parameter of a ``fully_shard`` group: layout of its shard in the group's collectives,
    its sharded parameter and its unsharded tensor, and the ``(module, name)`` slots holding it.

    ``chunk`` rows per rank (``ceil(rows / n)``, torch.chunk), ``row_numel`` elements per row;
    in the group's per-rank flat buffer it owns ``[offset, offset + chunk * row_numel)``.

    Example::

        fp = FSDPParam(model.weight, [(model, "weight")], mesh, [Shard(0)], shard_size=2, shard_rank=0,
                       host_shard=False)
        fp.sharded_param.shape, fp.chunk, fp.padded_numel
    """

    def __init__(self, param: Tensor, slots, mesh, placements, shard_size: int, shard_rank: int, host_shard: bool):
        if param.ndim == 0:
            name = f"{type(slots[0][0]).__name__}.{slots[0][1]}"
            raise ValueError(f"fully_shard: parameter {name} is 0-d; Shard(0) needs at least one dimension "
                             "(reshape it to (1,) in the module)")
        self.slots = list(slots)
        # the gathers and reductions move the local piece (TP's slice, or the whole parameter)
        self.shape = tuple(param.shape)
        self.orig_dtype = param.dtype
        self.rows = int(self.shape[0])
        self.row_numel = int(np.prod(self.shape[1:], dtype=np.int64))
        self.numel = self.rows * self.row_numel
        self.chunk = math.ceil(self.rows / shard_size) if self.rows else 0
        self.padded_numel = self.chunk * self.row_numel
        self.start, self.stop = _chunk_range(self.rows, shard_size, shard_rank)
        self.local_rows = self.stop - self.start
        self.device = param.device
        self.offset = 0          # set by the group: where this parameter's chunk sits per rank
        self.unsharded_offset = 0
        data = param.data[self.start:self.stop]
        # a copy: the shard must not keep the full array alive
        data = (_backend.to_device(data, "cpu") if host_shard else data).copy()
        mesh, placements, global_shape = _spmd_layout(param, slots, mesh, placements)
        self.sharded_param = ShardedParameter(data, mesh, placements, global_shape,
                                              requires_grad=param.requires_grad)
        self.unsharded = None    # a leaf Tensor, a view of the group's gathered buffer (set by the group)

    @property
    def requires_grad(self) -> bool:
        return self.sharded_param.requires_grad

    def install(self, tensor) -> None:
        """Put ``tensor`` in every slot (module parameter registry) of this parameter."""
        for module, name in self.slots:
            module._parameters[name] = tensor


def _spmd_layout(param, slots, mesh, placements):
    """``(mesh, placements, global shape)`` of the sharded parameter: ``fully_shard``'s own for a
    plain parameter; for a tensor-parallel DTensor parameter, the root mesh's ``(dp..., tp)``
    dimensions with ``(dp placements..., tp placement)`` and TP's global shape (torch's FSDP2 x TP;
    with an HSDP ``(replicate, shard)`` mesh the result is 3-d: ``(Replicate(), Shard(0) or
    _StridedShard(0), tp placement)``)."""
    if not isinstance(param, DTensor):
        return mesh, placements, tuple(param.shape)
    name = f"{type(slots[0][0]).__name__}.{slots[0][1]}"
    tp_mesh = param.device_mesh
    if tp_mesh.ndim != 1:
        raise NotImplementedError(f"fully_shard: parameter {name} is a DTensor on {tp_mesh!r}; fully_shard of a "
                                  "DTensor parameter supports a 1-d tp mesh")
    root = mesh._get_root_mesh()
    dims = [next((d for d in range(root.ndim) if root.get_group(d) is mesh.get_group(k)), None)
            for k in range(mesh.ndim)]
    tps = [d for d in range(root.ndim) if d not in dims and root.get_coordinate() is not None
           and _ranks_along(root, d) == [int(r) for r in tp_mesh.mesh.reshape(-1)]]
    if None in dims or not tps:
        raise ValueError(f"fully_shard: parameter {name} is a DTensor on {tp_mesh!r}, which is not a dimension of "
                         f"the mesh {root!r} that the dp mesh {mesh!r} was sliced from; build both on one mesh: "
                         "mesh = init_device_mesh(..., mesh_dim_names=('dp', 'tp')), tensor parallel over "
                         "mesh['tp'], fully_shard(..., mesh=mesh['dp']) (HSDP: mesh_dim_names=('replicate', "
                         "'shard', 'tp') and mesh=mesh['replicate', 'shard'])")
    order = dims + [tps[0]]
    spmd_mesh = root if order == list(range(root.ndim)) else root[tuple(order)]
    (tp_placement,) = param.placements
    if isinstance(tp_placement, Shard) and tp_placement.dim == 0:
        dp_placement = _StridedShard(0, split_factor=tp_mesh.size())
    else:
        dp_placement = placements[-1]
    return spmd_mesh, tuple(placements[:-1]) + (dp_placement, tp_placement), tuple(param.dtensor_shape)


def _ranks_along(mesh, dim: int) -> list[int]:
    """The global ranks of ``mesh`` along ``dim`` through this rank."""
    coord = mesh.get_coordinate()
    index = tuple(slice(None) if d == dim else coord[d] for d in range(mesh.ndim))
    return [int(r) for r in mesh.mesh[index]]
