"""``DeviceMesh`` / ``init_device_mesh``: ranks laid out as an N-d array, one group per mesh dimension.

A mesh of shape ``(dp, tp)`` over 4 ranks is ``[[0, 1], [2, 3]]``: the ``tp`` groups are the
rows (``[0, 1]``, ``[2, 3]``), the ``dp`` groups the columns (``[0, 2]``, ``[1, 3]``). Every
group of every dimension is created once, by every rank, when the mesh is built (process-group
creation is collective), and cached; ``mesh["tp"]`` is a 1-d sub-mesh that reuses them and knows
its root mesh (``fully_shard`` over ``mesh["dp"]`` of a tensor-parallel model finds ``(dp, tp)``
there). ``DeviceMesh.from_group(group, device_type)`` wraps groups that exist already (no collective).

Example (4 ranks)::

    from neural_arch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    tp_group = mesh.get_group("tp")          # this rank's row
    mesh["dp"].size(), mesh.get_local_rank("tp")
    print(mesh)                              # DeviceMesh('cpu', [[0, 1], [2, 3]], ...)
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Sequence

import numpy as np

from neural_arch.distributed.process_group import GroupMember, ProcessGroup
from neural_arch.distributed.resolve import _resolve_group
from neural_arch.distributed.subgroups import new_subgroups_by_enumeration

__all__ = ["DeviceMesh", "init_device_mesh"]


def _groups_along(mesh: np.ndarray, dim: int) -> list[list[int]]:
    """Every 1-d slice of ``mesh`` along ``dim``, in row-major order of the other dimensions."""
    moved = np.moveaxis(mesh, dim, -1).reshape(-1, mesh.shape[dim])
    return [[int(r) for r in row] for row in moved]


def _check_increasing(mesh: np.ndarray) -> None:
    """Refuse a mesh whose ranks decrease along some dimension.

    A process group numbers its members in increasing global rank (torch's ``new_group`` sorts
    them too), while the mesh's coordinate along a dimension is the position in the mesh: with
    ``[[1, 0], [3, 2]]`` rank 0 would sit at coordinate 1 of its row but be rank 0 of the row's
    group, and a sharded tensor gathered over that group would come back with its pieces swapped.

    >>> _check_increasing(np.array([[0, 2], [1, 3]]))     # a transposed layout is fine
    >>> _check_increasing(np.array([[1, 0], [3, 2]]))
    Traceback (most recent call last):
    ...
    ValueError: DeviceMesh: along dimension 1 the ranks [1, 0] are not in increasing order; ...
    """
    for dim in range(mesh.ndim):
        for line in _groups_along(mesh, dim):
            if any(a >= b for a, b in itertools.pairwise(line)):
                raise ValueError(
                    f"DeviceMesh: along dimension {dim} the ranks {line} are not in increasing order; a process "
                    "group numbers its ranks in increasing global rank, so coordinates along that dimension would "
                    f"disagree with group ranks (and sharded results land in the wrong place). Mesh: {mesh.tolist()}; "
                    "lay the ranks out increasing along every dimension (e.g. a transpose of np.arange(n).reshape(...))")


class DeviceMesh:
    """An N-d array of global ranks with one cached process group per dimension (torch's API).

    Build it with :func:`init_device_mesh` (or ``DeviceMesh(device_type, mesh)`` where every
    rank passes the same array). ``mesh.mesh`` is the NumPy array of ranks.

    Example::

        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        tp_group = mesh.get_group("tp")          # the 2 ranks of this rank's row
        mesh["dp"].size()                        # 2
    """

    def __init__(self, device_type: str, mesh, mesh_dim_names: Sequence[str] | None = None, *,
                 _groups: dict | None = None, _parent: DeviceMesh | None = None):
        self.device_type = str(device_type)
        self.mesh = np.asarray(mesh, dtype=np.int64)
        if self.mesh.ndim == 0:
            raise ValueError("DeviceMesh: mesh must have at least one dimension (an array of ranks)")
        names = tuple(mesh_dim_names) if mesh_dim_names is not None else None
        if names is not None:
            if len(names) != self.mesh.ndim:
                raise ValueError(f"DeviceMesh: mesh_dim_names={names} has {len(names)} names for a "
                                 f"{self.mesh.ndim}-d mesh of shape {self.mesh.shape}")
            if len(set(names)) != len(names):
                raise ValueError(f"DeviceMesh: mesh_dim_names={names} must be unique")
        self.mesh_dim_names = names
        world = _resolve_group(None, "DeviceMesh")
        flat = sorted(int(r) for r in self.mesh.reshape(-1))
        # a mesh that makes its own groups spans the world; one given its groups (a sub-mesh,
        # DeviceMesh.from_group) may span part of it
        if _groups is None and flat != list(range(world.size())):
            raise ValueError(f"DeviceMesh: the mesh {self.mesh.tolist()} must hold every rank of the world "
                             f"0..{world.size() - 1} exactly once")
        #: the mesh this one was sliced from (the root: ``mesh["dp"]`` of a ``(dp, tp)`` mesh knows
        #: the 2-d mesh, as torch's ``_mesh_resources.get_root_mesh``), or None for a root mesh
        self._parent = _parent._parent if _parent is not None and _parent._parent is not None else _parent
        self._rank = world.rank()
        coord = np.argwhere(self.mesh == self._rank)
        self._coordinate = [int(c) for c in coord[0]] if len(coord) else None
        # dim index -> this rank's ProcessGroup along that dim; plus every group (for printing)
        self._groups: dict[int, ProcessGroup] = {}
        self._all: dict[int, list[list[int]]] = {}
        if _groups is not None:
            self._groups, self._all = _groups
        else:
            _check_increasing(self.mesh)
            for dim in range(self.mesh.ndim):
                lists = _groups_along(self.mesh, dim)
                mine, _ = new_subgroups_by_enumeration(lists)  # every rank creates every group
                self._all[dim] = lists
                if mine is None:
                    mine = GroupMember.NON_GROUP_MEMBER
                self._groups[dim] = mine

    # -- queries ---------------------------------------------------------------------------------
    @property
    def ndim(self) -> int:
        return self.mesh.ndim

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.mesh.shape)

    def size(self, mesh_dim: int | str | None = None) -> int:
        """Number of ranks in the mesh, or along ``mesh_dim``."""
        return int(self.mesh.size) if mesh_dim is None else int(self.mesh.shape[self._dim(mesh_dim)])

    def _dim(self, mesh_dim) -> int:
        if mesh_dim is None:
            if self.ndim != 1:
                raise ValueError(f"DeviceMesh of {self.ndim} dims: pass mesh_dim (one of "
                                 f"{self.mesh_dim_names or list(range(self.ndim))})")
            return 0
        if isinstance(mesh_dim, str):
            if not self.mesh_dim_names or mesh_dim not in self.mesh_dim_names:
                raise KeyError(f"DeviceMesh: no dimension named {mesh_dim!r}; the names are "
                               f"{self.mesh_dim_names}")
            return self.mesh_dim_names.index(mesh_dim)
        dim = int(mesh_dim)
        if not -self.ndim <= dim < self.ndim:
            raise IndexError(f"DeviceMesh: mesh_dim={mesh_dim} is out of range for {self.ndim} dims")
        return dim % self.ndim

    def get_group(self, mesh_dim: int | str | None = None) -> ProcessGroup:
        """This rank's process group along ``mesh_dim`` (name or index; optional on a 1-d mesh)."""
        return self._groups[self._dim(mesh_dim)]

    def get_all_groups(self) -> list[ProcessGroup]:
        """This rank's group along every dimension, in dimension order."""
        return [self._groups[d] for d in range(self.ndim)]

    def get_local_rank(self, mesh_dim: int | str | None = None) -> int:
        """This rank's coordinate along ``mesh_dim`` (== its rank in ``get_group(mesh_dim)``)."""
        if self._coordinate is None:
            raise ValueError(f"global rank {self._rank} is not in this mesh {self.mesh.tolist()}")
        return self._coordinate[self._dim(mesh_dim)]

    def get_coordinate(self) -> list[int] | None:
        """This rank's index in ``mesh.mesh`` (None when it is not in the mesh)."""
        return None if self._coordinate is None else list(self._coordinate)

    def get_rank(self) -> int:
        """This process's global rank."""
        return self._rank

    @staticmethod
    def from_group(group, device_type: str, mesh=None, *, mesh_dim_names: Sequence[str] | None = None) -> DeviceMesh:
        """A mesh over the ranks of existing process group(s), reusing them (torch's): no collective.

        ``group``: one ProcessGroup (a 1-d mesh over its ranks; ``mesh`` defaults to them) or a list
        of them, one per dimension of ``mesh`` (then required: the array of global ranks, every
        rank passing the same). Example::

            tp_mesh = DeviceMesh.from_group(tp_group, "cpu")     # e.g. [2, 3] on ranks 2 and 3
            tp_mesh.get_group() is tp_group                       # True
        """
        groups = list(group) if isinstance(group, (list, tuple)) else [group]
        if not groups or not all(isinstance(g, ProcessGroup) for g in groups):
            raise TypeError(f"DeviceMesh.from_group: group must be a ProcessGroup or a list of them, got {group!r}")
        if mesh is None:
            if len(groups) != 1:
                raise ValueError("DeviceMesh.from_group: a list of groups needs mesh= (the array of global ranks)")
            mesh = [int(r) for r in groups[0].ranks]
        array = np.asarray(mesh, dtype=np.int64)
        if array.ndim != len(groups):
            raise ValueError(f"DeviceMesh.from_group: mesh of {array.ndim} dims for {len(groups)} group(s); give one "
                             "group per mesh dimension")
        me = _resolve_group(None, "DeviceMesh.from_group").rank()
        coord = np.argwhere(array == me)
        alls = {}
        for d, g in enumerate(groups):
            ranks = [int(r) for r in g.ranks]
            if len(coord):
                along = [int(r) for r in np.moveaxis(array, d, -1)[tuple(c for i, c in enumerate(coord[0]) if i != d)]]
                if along != ranks:
                    raise ValueError(f"DeviceMesh.from_group: group {d} holds ranks {ranks} but mesh {array.tolist()} "
                                     f"puts {along} along dimension {d} through rank {me}")
            alls[d] = [ranks]   # only this rank's group is known (groups are created collectively)
        return DeviceMesh(str(device_type).split(":")[0], array, mesh_dim_names,
                          _groups=(dict(enumerate(groups)), alls))

    def _get_root_mesh(self) -> DeviceMesh:
        """The mesh this one was sliced from (itself for a root mesh)."""
        return self._parent if self._parent is not None else self

    # -- sub-meshes ------------------------------------------------------------------------------
    def __getitem__(self, names) -> DeviceMesh:
        """``mesh["tp"]`` (or ``mesh["dp", "tp"]``): the sub-mesh through this rank along those dims."""
        names = (names,) if isinstance(names, (str, int)) else tuple(names)
        dims = [self._dim(n) for n in names]
        if len(set(dims)) != len(dims):
            raise ValueError(f"DeviceMesh[{names}]: a dimension is named twice")
        if self._coordinate is None:
            raise ValueError(f"global rank {self._rank} is not in this mesh")
        index = tuple(slice(None) if d in dims else self._coordinate[d] for d in range(self.ndim))
        sub = self.mesh[index]
        # the kept dims appear in mesh order after indexing; reorder to the requested order
        kept = [d for d in range(self.ndim) if d in dims]
        sub = np.transpose(sub, [kept.index(d) for d in dims])
        groups = {i: self._groups[d] for i, d in enumerate(dims)}
        alls = {i: self._all[d] for i, d in enumerate(dims)}
        sub_names = tuple(self.mesh_dim_names[d] for d in dims) if self.mesh_dim_names else None
        return DeviceMesh(self.device_type, sub, sub_names, _groups=(groups, alls), _parent=self)

    # -- printing --------------------------------------------------------------------------------
    def __repr__(self) -> str:
        names = f", mesh_dim_names={self.mesh_dim_names}" if self.mesh_dim_names else ""
        return f"DeviceMesh('{self.device_type}', {self.mesh.tolist()}{names})"

    def describe(self) -> str:
        """A few lines naming the global ranks of every group along every dimension."""
        lines = [repr(self)]
        for d in range(self.ndim):
            name = self.mesh_dim_names[d] if self.mesh_dim_names else f"dim {d}"
            lines.append(f"  {name} groups: {self._all[d]}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.describe()

    def __eq__(self, other) -> bool:
        return (isinstance(other, DeviceMesh) and self.device_type == other.device_type
                and np.array_equal(self.mesh, other.mesh) and self.mesh_dim_names == other.mesh_dim_names)

    def __hash__(self) -> int:
        return hash((self.device_type, self.mesh.tobytes(), self.mesh.shape, self.mesh_dim_names))


def init_device_mesh(device_type: str, mesh_shape: Sequence[int], *,
                     mesh_dim_names: Sequence[str] | None = None) -> DeviceMesh:
    """A :class:`DeviceMesh` of ``mesh_shape`` over the world's ranks in row-major order (torch).

    Every rank calls it with the same arguments; the product of ``mesh_shape`` must equal the
    world size. The last dimension holds consecutive ranks (put ``"tp"`` there: it talks most,
    and consecutive ranks usually share a host). Example::

        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    """
    world = _resolve_group(None, "init_device_mesh")
    try:
        shape = tuple(operator.index(s) for s in mesh_shape)
    except TypeError:
        raise TypeError(f"init_device_mesh: mesh_shape={tuple(mesh_shape)} must hold ints") from None
    if not shape or any(s <= 0 for s in shape):
        raise ValueError(f"init_device_mesh: mesh_shape={tuple(mesh_shape)} must be positive sizes")
    total = int(np.prod(shape))
    if total != world.size():
        raise ValueError(f"init_device_mesh: mesh_shape={shape} holds {total} ranks but the world has "
                         f"{world.size()}; the product of mesh_shape must equal the world size")
    return DeviceMesh(device_type, np.arange(total).reshape(shape), mesh_dim_names)


def resolve_group_or_mesh(process_group=None, op: str = "this operation"):
    """``process_group`` (a ProcessGroup, a 1-d :class:`DeviceMesh`, or None for the world) -> ProcessGroup.

    What every strategy that takes "a group or a mesh dimension" (tensor and context parallelism)
    calls, so the error for a 2-d mesh reads the same everywhere::

        >>> resolve_group_or_mesh(None, "ring_attention").size()   # doctest: +SKIP
        4
    """
    if isinstance(process_group, DeviceMesh):
        if process_group.ndim != 1:
            raise ValueError(f"{op}: pass a 1-d mesh (e.g. mesh['tp']), got {process_group!r}")
        process_group = process_group.get_group()
    return _resolve_group(process_group, op)
