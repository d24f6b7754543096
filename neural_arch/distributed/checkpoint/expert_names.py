"""State-dict names of a module list that holds a slice of a larger one: expert parallelism.

Under expert parallelism (``parallelize_moe``) an MoE layer's ``experts`` holds only this rank's
``E / ep`` experts, numbered ``0 .. E/ep - 1`` like any ``ModuleList``; by those local numbers,
``experts.0`` would be expert 0 on one rank and expert 2 on another. A checkpoint needs the
**global** number instead, as torch DCP names a sharded tensor by its global identity: then a
checkpoint saved at ep = 2 loads at ep = 1 (one process, no parallelism: the plain model's names),
ep = 4 or another data-parallel size, and the ranks that hold the same expert (its
expert-data-parallel group) hold the same key, which ``dcp.save`` writes once.

The contract (duck-typed: nothing here imports a parallel strategy): a module list holding a
slice carries ``_global_indices`` (its children's indices in the whole list, in order) and
``_global_size`` (the whole list's length). :func:`named_modules` is ``Module.named_modules``
with those children renamed; :func:`held_elsewhere` tells the keys of the experts other ranks hold
(not *unexpected* in a whole state dict loaded into a slice); :func:`expand_group_names` makes an optimizer's ``param_groups``
name list the same on every rank (every expert's parameters, in the whole list's order).

Example::

    >>> from neural_arch import nn
    >>> experts = nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2)])    # experts 2 and 3 of 4
    >>> experts._global_indices, experts._global_size = (2, 3), 4
    >>> [name for name, _ in named_modules(nn.Sequential(experts))][1:]
    ['0', '0.2', '0.3']
    >>> expand_group_names(["0.2.weight", "0.2.bias", "0.3.weight", "0.3.bias"], nn.Sequential(experts))[:3]
    ['0.0.weight', '0.0.bias', '0.1.weight']
"""

from __future__ import annotations

from collections.abc import Iterator

from neural_arch.nn.module import Module

__all__ = ["expand_group_names", "held_elsewhere", "named_modules", "sliced_lists"]


def _child_names(module: Module) -> dict[str, str]:
    """{local child name: global child name} of a sliced list; empty for any other module."""
    indices = getattr(module, "_global_indices", None)
    if indices is None:
        return {}
    local = [name for name, child in module._modules.items() if child is not None]
    if len(local) != len(indices):
        raise ValueError(f"{type(module).__name__} holds {len(local)} modules but names {len(indices)} global "
                         f"indices {tuple(indices)}")
    return {name: str(int(g)) for name, g in zip(local, indices)}


def named_modules(module: Module, prefix: str = "", memo: set | None = None) -> Iterator[tuple[str, Module]]:
    """``module.named_modules()`` with the children of sliced lists under their global index.

    >>> from neural_arch import nn
    >>> [n for n, _ in named_modules(nn.Linear(2, 2))]
    ['']
    """
    memo = set() if memo is None else memo
    if id(module) in memo:
        return
    memo.add(id(module))
    yield prefix, module
    rename = _child_names(module)
    for name, child in module._modules.items():
        if child is None:
            continue
        name = rename.get(name, name)
        yield from named_modules(child, f"{prefix}.{name}" if prefix else name, memo)


def sliced_lists(module: Module) -> dict[str, tuple[tuple[str, ...], tuple[str, ...]]]:
    """{prefix of a sliced list: (the global names of its children here, every global name)}.

    >>> from neural_arch import nn
    >>> sliced_lists(nn.Linear(2, 2))
    {}
    """
    out = {}
    for prefix, sub in named_modules(module):
        rename = _child_names(sub)
        if rename:
            out[prefix] = (tuple(rename.values()), tuple(str(i) for i in range(int(sub._global_size))))
    return out


def expand_group_names(names: list[str], module: Module) -> list[str]:
    """``names`` (a parameter group's, global names) with the run of each sliced list's parameters
    replaced by the parameters of every child of the whole list (its first child here gives the
    parameter names of one child, as every expert has the same structure): the same list on every
    rank, and the list the unsliced model's group has.

    >>> expand_group_names(["w"], Module())
    ['w']
    """
    lists = sliced_lists(module)
    if not lists:
        return names
    out, done = [], set()
    for name in names:
        hit = next(((p, mine, every) for p, (mine, every) in lists.items()
                    if name.startswith(f"{p}." if p else "") and name[len(p) + 1 if p else 0:].split(".", 1)[0] in mine),
                   None)
        if hit is None:
            out.append(name)
            continue
        prefix, mine, every = hit
        if prefix in done:
            continue
        done.add(prefix)
        head = f"{prefix}.{mine[0]}." if prefix else f"{mine[0]}."
        rests = [n[len(head):] for n in names if n.startswith(head)]
        out.extend(f"{prefix}.{g}.{r}" if prefix else f"{g}.{r}" for g in every for r in rests)
    return out


def held_elsewhere(name: str, lists: dict) -> bool:
    """Whether ``name`` belongs to a child of a sliced list (:func:`sliced_lists`) held by another rank.

    >>> held_elsewhere("moe.experts.0.fc1.weight", {"moe.experts": (("2", "3"), ("0", "1", "2", "3"))})
    True
    """
    for prefix, (mine, every) in lists.items():
        head = f"{prefix}." if prefix else ""
        if name.startswith(head):
            child = name[len(head):].split(".", 1)[0]
            if child in every and child not in mine:
                return True
    return False
