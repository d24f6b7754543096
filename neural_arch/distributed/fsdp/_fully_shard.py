"""``fully_shard`` (FSDP2, torch's ``torch.distributed.fsdp.fully_shard``) and ``FSDPModule``.

``fully_shard(module)`` shards every parameter of ``module`` that no nested ``fully_shard`` manages
on dim 0 over ``mesh`` (a :class:`~neural_arch.distributed.tensor.DTensor` with ``Shard(0)``, no
flat units), and hooks the module so that, per call:

1. **forward** (pre-hook): one all-gather unshards the module's parameters (in
   ``mp_policy.param_dtype``) and the module's parameter slots hold the full ones; floating inputs
   are cast to ``param_dtype``;
2. after **forward**: the sharded parameters are put back and the gathered memory is returned
   (``reshard_after_forward=True``, ZeRO-3), or kept until the module's backward is over
   (``False``, ZeRO-2); the outermost ``fully_shard`` module (the *root*) is never resharded after
   forward, as in torch (its backward starts at once);
3. **backward**: a hook on the module's outputs re-gathers the parameters before the module's
   backward if they were resharded; when every gradient of the module's parameters is final, one
   reduce-scatter (in ``mp_policy.reduce_dtype``; HSDP: then one all-reduce over the replicate
   dimension) averages them over the data-parallel ranks into the sharded parameters' ``.grad``
   (``DTensor`` ``Shard(0)`` too), and the module is resharded.

``set_requires_gradient_sync(False)`` skips the reductions: the unsharded gradients accumulate on
each rank, and the next synced backward reduces their sum (gradient accumulation, torch's). With
HSDP, ``set_requires_all_reduce(False)`` reduce-scatters each backward but keeps the sums until a
backward that all-reduces them. A parameter that no rank used in a backward keeps its gradient
(``None`` after ``zero_grad``: the optimizer skips it, as in one process); one used on some ranks
only gets the mean with zeros for the others, as long as every rank ran the backward of some
parameter of its module (a rank whose backward reaches none of them skips the module's
reduce-scatter and the ranks' collectives go out of step: a CollectiveMismatchError or a timeout,
where torch hangs).

The module's class becomes a subclass of its own class and :class:`FSDPModule` (torch does this),
so ``isinstance(model, FSDPModule)`` and ``model.unshard()`` work and everything else is unchanged.

Apply it bottom-up: each block first, then the root (every parameter left over goes to the root's
group)::

    from neural_arch.distributed.device_mesh import init_device_mesh
    from neural_arch.distributed.fsdp import fully_shard, MixedPrecisionPolicy
    mesh = init_device_mesh("cpu", (world_size,))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = optim.Adam(model.parameters(), lr=1e-3)    # steps each rank's shards
    loss = F.cross_entropy(model(x), y); loss.backward(); opt.step(); opt.zero_grad()

With tensor parallelism (torch's 2-d FSDP x TP): parallelize over ``mesh["tp"]``, then
``fully_shard(..., mesh=mesh["dp"])``; each DTensor parameter is sharded on dim 0 of its tp piece and
becomes a DTensor on the ``(dp, tp)`` mesh with placements ``(Shard(0) or _StridedShard(0), tp
placement)`` and TP's global shape, so ``full_tensor()``, distributed checkpoints and
``clip_grad_norm_`` see the whole parameter::

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    parallelize_module(model, mesh["tp"], {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
    fully_shard(model, mesh=mesh["dp"])
    model.fc1.weight.placements        # (_StridedShard(dim=0, sf=2), Shard(dim=0))

HSDP x TP is the same on a 3-d mesh: ``mesh_dim_names=("replicate", "shard", "tp")``, tensor parallel
over ``mesh["tp"]``, ``fully_shard(..., mesh=mesh["replicate", "shard"])``; the parameters are
DTensors on the whole mesh with ``(Replicate(), Shard(0) or _StridedShard(0), tp placement)``.

Inside a fault-tolerant replica (torchft's ``fully_shard(model, mesh=ft_init_device_mesh(...))``):
shard over the replica's own ranks and pass the replica's lane as ``replicate_group``; each
reduce-scattered gradient shard is then averaged over the replicas of the current quorum through the
:class:`~neural_arch.distributed.ft.manager.Manager` (a failure there voids the step, it never raises into
backward), and a replacement heals each rank's local shards from the peer with the same shard index::

    manager = ft.Manager(..., replica_id="replica_a", shard=(dist.get_rank(), dist.get_world_size()))
    fully_shard(model, replicate_group=ft.ManagedProcessGroup(manager))     # mesh: the replica's ranks
    opt = ft.OptimizerWrapper(manager, optim.Adam(model.parameters(), lr=1e-3))

Backward prefetch: when a module's backward starts, the all-gather of the module that ran before
it in the last forward (whose backward comes next) is started in the background, so it overlaps
this module's backward (torch's implicit backward prefetch; one more module's parameters are
gathered at a time). Forward prefetch is not done.

Not done here (see ``docs/fully_shard.md``): forward prefetch, ``state_dict`` of DTensors
(``model.state_dict()`` holds each rank's local shards), ``reshard_after_forward`` given as an int.
"""

from __future__ import annotations

import weakref

from neural_arch.core.autograd import is_grad_enabled
from neural_arch.distributed.device_mesh import DeviceMesh
from neural_arch.distributed.fsdp._fsdp_api import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy
from neural_arch.distributed.fsdp._fsdp_param import FSDPParam, ShardedParameter
from neural_arch.distributed.fsdp._fsdp_param_group import FSDPParamGroup
from neural_arch.distributed.resolve import _resolve_group
from neural_arch.distributed.tensor.placement_types import Replicate, Shard
from neural_arch.nn.module import Module
from neural_arch.optim.optimizer import register_optimizer_step_pre_hook

__all__ = ["FSDPModule", "UnshardHandle", "fully_shard"]


class _ForwardOrder:
    """The groups in the order their modules' forwards start, recorded during the root's forward:
    each group's backward prefetch is the one before it (backward runs the modules in reverse)."""

    recording: list | None = None


class _FSDPState:
    """What ``fully_shard`` attaches to a module: its parameter group and whether it is the root."""

    def __init__(self, group: FSDPParamGroup):
        self.group = group
        self.is_root = True           # until a fully_shard on an ancestor says otherwise
        self.is_last_backward = True

    def pre_forward(self, module, args):
        if self.is_root and is_grad_enabled():
            _ForwardOrder.recording = []
        order = _ForwardOrder.recording
        if order is not None and self.group.fsdp_params and self.group not in order:
            order.append(self.group)
        return self.group.pre_forward(args)

    def post_forward(self, module, args, out):
        order = _ForwardOrder.recording
        if self.is_root and order is not None:
            for before, group in zip([None, *order], order):
                group.backward_prefetch = before
            _ForwardOrder.recording = None
        # no backward follows a no-grad forward: nothing would reshard the root later
        reshard = not is_grad_enabled() or (self.group.reshard_after_forward and not self.is_root)
        return self.group.post_forward(out, reshard)


class UnshardHandle:
    """What ``FSDPModule.unshard(async_op=True)`` returns (torch's): ``wait()`` (the all-gather has
    completed already here: collectives run in the caller).

    Example::

        handle = model.unshard(async_op=True); handle.wait()
    """

    def wait(self) -> None:
        """Return once the all-gather is done (it is)."""
        return


class FSDPModule:
    """The methods ``fully_shard`` adds to a module (its class becomes ``FSDP<Class>``, a subclass of
    this and of the module's own class, as in torch).

    Example::

        fully_shard(model)
        isinstance(model, FSDPModule)              # True
        model.set_requires_gradient_sync(False)    # accumulate without reducing
    """

    def __call__(self, *args, **kwargs):
        # the forward pre-hook casts the positional inputs; Module's hooks never see keyword ones,
        # which torch's cast_forward_inputs casts too
        if kwargs:
            kwargs = self._fsdp_state.group.cast_inputs(kwargs) or kwargs
        return super().__call__(*args, **kwargs)

    def _fsdp_modules(self, recurse: bool):
        mods = self.modules() if recurse else [self]
        return [m for m in mods if isinstance(m, FSDPModule)]

    def unshard(self, async_op: bool = False):
        """All-gather this module's parameters now (e.g. to overlap it by hand); returns an
        :class:`UnshardHandle` with ``async_op=True``, else None.

        Example::

            model.unshard(); model.reshard()
        """
        self._fsdp_state.group.unshard()
        return UnshardHandle() if async_op else None

    def reshard(self) -> None:
        """Put the sharded parameters back and free the gathered ones.

        Example::

            model.unshard(); model.reshard()
        """
        self._fsdp_state.group.reshard()

    def set_requires_gradient_sync(self, requires_gradient_sync: bool, *, recurse: bool = True) -> None:
        """``False``: backward accumulates unsharded gradients locally, with no reduction; the next
        backward with ``True`` reduces their sum (torch's gradient accumulation). ``recurse``: also
        every ``fully_shard`` module below.

        Example::

            model.set_requires_gradient_sync(False); loss1.backward()      # no communication
            model.set_requires_gradient_sync(True); loss2.backward()       # reduces grad1 + grad2
        """
        if not isinstance(requires_gradient_sync, bool):
            raise TypeError(f"set_requires_gradient_sync: requires_gradient_sync={requires_gradient_sync!r} "
                            "must be a bool")
        for m in self._fsdp_modules(recurse):
            m._fsdp_state.group.requires_gradient_sync = requires_gradient_sync

    def set_requires_all_reduce(self, requires_all_reduce: bool, *, recurse: bool = True) -> None:
        """HSDP: ``False`` reduce-scatters each backward's gradients over the shard dimension but
        skips the all-reduce over the replicate dimension; the sums wait (this rank's shard of them)
        until a backward with ``True`` all-reduces them with its own, and only then are the sharded
        gradients set (torch's gradient accumulation that keeps sharded gradients only, with less
        traffic across replicas). Without a replicate dimension it changes nothing.

        Example::

            for k, (x, y) in enumerate(micro_batches):
                model.set_requires_all_reduce(k == len(micro_batches) - 1)
                loss_fn(model(x), y).backward()
        """
        if not isinstance(requires_all_reduce, bool):
            raise TypeError(f"set_requires_all_reduce: requires_all_reduce={requires_all_reduce!r} must be a bool")
        for m in self._fsdp_modules(recurse):
            m._fsdp_state.group.requires_all_reduce = requires_all_reduce

    def set_reshard_after_backward(self, reshard_after_backward: bool, *, recurse: bool = True) -> None:
        """Whether the parameters are resharded once the module's backward is over (default True).
        ``False`` keeps them gathered after the *unsynced* backwards of gradient accumulation (no
        re-gather before the next micro-batch, torch's use); a synced backward always reshards, as
        the optimizer step that follows changes the shards (the gathered copy would be stale).

        Example::

            model.set_requires_gradient_sync(False)
            model.set_reshard_after_backward(False)    # keep them gathered for the next micro-batch
        """
        if not isinstance(reshard_after_backward, bool):
            raise TypeError(f"set_reshard_after_backward: reshard_after_backward={reshard_after_backward!r} "
                            "must be a bool")
        for m in self._fsdp_modules(recurse):
            m._fsdp_state.group.reshard_after_backward = reshard_after_backward

    def set_reshard_after_forward(self, reshard_after_forward: bool, recurse: bool = True) -> None:
        """Change ``reshard_after_forward`` after ``fully_shard`` (torch's).

        Example::

            model.set_reshard_after_forward(False)     # ZeRO-2 from now on
        """
        if not isinstance(reshard_after_forward, bool):
            raise TypeError(f"set_reshard_after_forward: reshard_after_forward={reshard_after_forward!r} "
                            "must be a bool")
        for m in self._fsdp_modules(recurse):
            m._fsdp_state.group.reshard_after_forward = reshard_after_forward

    def set_is_last_backward(self, is_last_backward: bool) -> None:
        """Accepted for torch's API; every backward here ends the same way, so it changes nothing.

        Example::

            model.set_is_last_backward(True)
        """
        self._fsdp_state.is_last_backward = bool(is_last_backward)


_CLASSES: dict[type, type] = {}
#: every parameter a fully_shard call replaced by its shard, by id, while it is alive anywhere (a slot
#: of another module still holding it is a tie across fully_shard modules: refused)
_SHARDED_ORIGINALS: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_calls = 0                # fully_shard calls so far (a checked optimizer is checked again after one)
_step_check = None        # the global optimizer step pre-hook, registered by the first call
_checked: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # optimizer -> (parameters, _calls)


def _refuse_replaced_parameters(optimizer, args, kwargs):
    """Before every optimizer step: an optimizer built before ``fully_shard`` holds the parameters it
    replaced, which never get a gradient again -- its steps would silently train nothing."""
    params = [p for g in getattr(optimizer, "param_groups", ()) for p in g["params"]]
    if _checked.get(optimizer) == (len(params), _calls):
        return
    for p in params:
        if _SHARDED_ORIGINALS.get(id(p)) is p:
            raise RuntimeError(f"{type(optimizer).__name__}.step(): the optimizer holds a parameter of shape "
                               f"{tuple(p.shape)} that fully_shard has replaced by its shard, so it never gets a "
                               "gradient and the step would train nothing; build the optimizer after "
                               "fully_shard, from model.parameters() (the sharded parameters)")
    _checked[optimizer] = (len(params), _calls)


def _fsdp_class(cls: type) -> type:
    if cls not in _CLASSES:
        _CLASSES[cls] = type(f"FSDP{cls.__name__}", (FSDPModule, cls), {"__module__": cls.__module__})
    return _CLASSES[cls]


def _managed_slots(module: Module):
    """``[(param, [(owner, name), ...])]`` for the parameters of ``module`` that no nested
    ``fully_shard`` manages, in registration order (a tied parameter once, with all its slots)."""
    found: dict[int, tuple] = {}

    def walk(m: Module):
        for name, p in m._parameters.items():
            if p is None or isinstance(p, ShardedParameter):
                continue
            found.setdefault(id(p), (p, []))[1].append((m, name))
        for child in m._modules.values():
            if child is not None and not isinstance(child, FSDPModule):
                walk(child)

    walk(module)
    return list(found.values())


def _refuse_shards_of_an_ancestor(module: Module) -> None:
    """A sharded parameter below ``module`` that no nested ``fully_shard`` module holds was sharded by
    a ``fully_shard`` call on an ancestor (called top-down): ``module`` would get no parameters, and
    the ancestor's unit would still gather them around ``module``'s forward."""

    def walk(m: Module, prefix: str):
        for name, p in m._parameters.items():
            if isinstance(p, ShardedParameter):
                raise ValueError(  # noqa: TRY004 - a wrong order of calls, not a wrong argument type
                    f"fully_shard: parameter {prefix}{name} of {type(module).__name__} is already a shard "
                    "of an earlier fully_shard call that no fully_shard module inside it holds: apply "
                    "fully_shard bottom-up (each block first, then the root), and keep shared "
                    "parameters in one fully_shard module")
        for child_name, child in m._modules.items():
            if child is not None and not isinstance(child, FSDPModule):
                walk(child, f"{prefix}{child_name}.")

    walk(module, "")


def _check_args(module, mesh, reshard_after_forward, mp_policy, offload_policy, replicate_group=None):
    if not isinstance(module, Module):
        raise TypeError(f"fully_shard: module must be an nn.Module, got {type(module).__name__} "
                        "(a list of modules is not supported: call fully_shard on each)")
    if getattr(module, "_fsdp_state", None) is not None:
        raise ValueError(f"fully_shard: module {type(module).__name__} was already passed to fully_shard; "
                         "call it once per module")
    if mesh is not None and not isinstance(mesh, DeviceMesh):
        raise TypeError(f"fully_shard: mesh must be a DeviceMesh (or None for the world), got {type(mesh).__name__}")
    if mesh is not None and mesh.ndim not in (1, 2):
        raise ValueError(f"fully_shard: mesh={mesh!r} has {mesh.ndim} dimensions; pass a 1-d mesh (shard over it) "
                         "or a 2-d mesh (replicate, shard) for HSDP, e.g. mesh['dp']")
    if replicate_group is not None and mesh is not None and mesh.ndim != 1:
        raise ValueError(f"fully_shard: replicate_group is given and mesh={mesh!r} has {mesh.ndim} dimensions; "
                         "with replicate_group, mesh is the 1-d mesh of the ranks that shard (the replica's own), "
                         "and replicate_group replaces HSDP's replicate dimension")
    if replicate_group is not None and not callable(getattr(getattr(replicate_group, "backend", None),
                                                            "allreduce", None)):
        raise TypeError(f"fully_shard: replicate_group must be a process group (with .backend.allreduce), e.g. "
                        f"ft.ManagedProcessGroup(manager), got {type(replicate_group).__name__}")
    if not isinstance(reshard_after_forward, bool):
        raise TypeError(f"fully_shard: reshard_after_forward={reshard_after_forward!r} must be a bool "
                        "(an int, torch's reshard to a smaller world, is not supported)")
    if not isinstance(mp_policy, MixedPrecisionPolicy):
        raise TypeError(f"fully_shard: mp_policy must be a MixedPrecisionPolicy, got {type(mp_policy).__name__}")
    if not isinstance(offload_policy, OffloadPolicy):
        raise TypeError(f"fully_shard: offload_policy must be an OffloadPolicy or CPUOffloadPolicy, got "
                        f"{type(offload_policy).__name__}")


def fully_shard(module: Module, *, mesh: DeviceMesh | None = None, reshard_after_forward: bool = True,
                mp_policy: MixedPrecisionPolicy | None = None, offload_policy: OffloadPolicy | None = None,
                replicate_group=None):
    """Shard ``module``'s parameters over ``mesh`` (torch's FSDP2; see the module docstring).

    Args:
        module: the module; every rank holds the same values (seed the initialisation): each keeps
            its ``torch.chunk`` rows of dim 0.
        mesh: a 1-d :class:`~neural_arch.distributed.device_mesh.DeviceMesh` to shard over
            (default: the world), or a 2-d ``(replicate, shard)`` one for HSDP (the parameters are
            ``DTensor`` s with ``(Replicate(), Shard(0))``).
        reshard_after_forward: free the gathered parameters after forward and re-gather them for
            backward (ZeRO-3, default), or keep them until backward (ZeRO-2). Ignored for the root.
        mp_policy: a :class:`MixedPrecisionPolicy` (default: no casts).
        offload_policy: :class:`OffloadPolicy` (default) or :class:`CPUOffloadPolicy`.
        replicate_group: not torch's: a group outside ``mesh`` (1-d) to average each gradient shard
            over after the reduce-scatter (``ReduceOp.AVG``; its size may change between steps), e.g.
            ``ft.ManagedProcessGroup(manager)`` for ``fully_shard`` inside a fault-tolerant replica
            (torchft's managed replicate dimension). The parameters stay ``Shard(0)`` on ``mesh``.

    Returns the same module, whose class now also subclasses :class:`FSDPModule`.

    Example::

        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        isinstance(next(model.parameters()), DTensor)      # True
    """
    mp_policy = MixedPrecisionPolicy() if mp_policy is None else mp_policy
    offload_policy = OffloadPolicy() if offload_policy is None else offload_policy
    _check_args(module, mesh, reshard_after_forward, mp_policy, offload_policy, replicate_group)
    slots = _managed_slots(module)
    _refuse_shards_of_an_ancestor(module)
    for p, where in slots:
        # any earlier call, not only one nested in this module: a sibling sharing the parameter (block 1
        # tied to block 0) would otherwise get a second, independent shard of it -- silently untied
        if _SHARDED_ORIGINALS.get(id(p)) is p:
            owner, name = where[0]
            raise ValueError(f"fully_shard: parameter {type(owner).__name__}.{name} is shared with a module that "
                             "an earlier fully_shard call sharded; shared parameters must belong to one "
                             "fully_shard module: call fully_shard on their common ancestor only")
    if mesh is None:
        device = slots[0][0].device if slots else "cpu"
        # the world group itself (no collective): every fully_shard call would otherwise make a new one
        mesh = DeviceMesh.from_group(_resolve_group(None, "fully_shard"), device.split(":")[0])
    if mesh.ndim == 1:
        shard_dim, replicate_dim, placements = 0, None, (Shard(0),)
    else:
        shard_dim, replicate_dim, placements = 1, 0, (Replicate(), Shard(0))
    host = isinstance(offload_policy, CPUOffloadPolicy)
    n, me = mesh.size(shard_dim), mesh.get_local_rank(shard_dim)
    fsdp_params = [FSDPParam(p, where, mesh, placements, n, me, host) for p, where in slots]
    group = FSDPParamGroup(fsdp_params, mesh, mp_policy, offload_policy, reshard_after_forward,
                           shard_dim, replicate_dim, replicate_group)
    for fp in fsdp_params:
        fp.install(fp.sharded_param)
    for sub in module.modules():
        if sub is not module and isinstance(sub, FSDPModule):
            sub._fsdp_state.is_root = False
    state = _FSDPState(group)
    global _calls, _step_check
    for p, _ in slots:
        _SHARDED_ORIGINALS[id(p)] = p
    _calls += 1
    if _step_check is None:
        _step_check = register_optimizer_step_pre_hook(_refuse_replaced_parameters)
    object.__setattr__(module, "_fsdp_state", state)
    module.register_forward_pre_hook(state.pre_forward)
    module.register_forward_hook(state.post_forward)
    module.__class__ = _fsdp_class(type(module))
    return module
