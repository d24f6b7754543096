"""Nested state dicts <-> flat ``{"dotted.key": leaf}`` tables.

``{"model": {"fc.weight": w}, "optim": {"state": {0: {"step": 3, "exp_avg": m}}}}`` flattens to
``model.fc.weight``, ``optim.state.0.step`` and ``optim.state.0.exp_avg``. Each leaf keeps its
*path* (the real keys, ints stay ints) so a load can write back into the caller's containers,
and build missing ones (a fresh optimizer has an empty ``state``) with the right key types.

Leaves are arrays (``np.ndarray``, NumPy scalars, CuPy arrays, ``Tensor``), ``ShardedArray``,
``DTensor`` (given as its box ``ShardedArray``, see :mod:`.dtensor_box`), or plain values (numbers, strings, None, bools, lists/tuples of those) which are stored in the
metadata as JSON. Lists and tuples that contain dicts or arrays are walked by index.

Example::

    >>> import numpy as np
    >>> [(k, p) for k, p, _ in flatten_state_dict({"a": {0: np.ones(2)}, "lr": 0.1})]
    [('a.0', ['a', 0]), ('lr', ['lr'])]
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from neural_arch import backend as _backend
from neural_arch.distributed.checkpoint.dtensor_box import as_sharded_array, is_dtensor
from neural_arch.distributed.checkpoint.sharded import ShardedArray

__all__ = ["decode_object", "encode_object", "flatten_state_dict", "is_array_leaf", "to_host"]


def to_host(value) -> np.ndarray:
    """A NumPy view/copy of an array-like leaf (device arrays and Tensors are copied to host).

    >>> to_host([1, 2]).tolist()
    [1, 2]
    """
    return _backend.to_host(value)


def is_array_leaf(value) -> bool:
    """Whether ``value`` is stored as a tensor (an array, a Tensor, a ``ShardedArray``), not as JSON.

    Example:
        >>> is_array_leaf(np.zeros(2)), is_array_leaf([1.0, 2.0])
        (True, False)
    """
    if isinstance(value, (np.ndarray, np.generic, ShardedArray)) or is_dtensor(value):
        return True
    return _backend.is_device_array(value) or type(value).__name__ in ("Tensor", "Parameter")


def _walkable(value) -> bool:
    if isinstance(value, Mapping):
        return True
    if isinstance(value, (list, tuple)):
        return any(isinstance(v, Mapping) or is_array_leaf(v) or isinstance(v, (list, tuple)) and _walkable(v)
                   for v in value)
    return False


def flatten_state_dict(state_dict, prefix: tuple = ()) -> list[tuple[str, list, object]]:
    """``[(dotted_key, path, leaf)]`` in a deterministic order (keys sorted within each dict).

    Example:
        >>> [(key, path) for key, path, _ in flatten_state_dict({"optim": {"step": 3}, "w": np.zeros(2)})]
        [('optim.step', ['optim', 'step']), ('w', ['w'])]
    """
    out: list[tuple[str, list, object]] = []
    if isinstance(state_dict, Mapping):
        items = sorted(state_dict.items(), key=lambda kv: (str(type(kv[0]).__name__), str(kv[0])))
    else:
        items = list(enumerate(state_dict))
    for key, value in items:
        if not isinstance(key, (str, int)) or isinstance(key, bool):
            raise TypeError(f"state dict keys must be str or int, got {key!r} at {'.'.join(map(str, prefix))}")
        path = prefix + (key,)
        if not is_array_leaf(value) and _walkable(value):
            out.extend(flatten_state_dict(value, path))
        else:
            key = ".".join(str(p) for p in path)
            # a DTensor is saved and loaded as its box (sharing its local array: loads are in place)
            out.append((key, list(path), as_sharded_array(value, repr(key)) if is_dtensor(value) else value))
    if not prefix:  # two paths that join to one dotted key ({"a.b": x, "a": {"b": y}}, "0" and 0) would
        # share one slot of the checkpoint: one of them would silently load the other's values
        seen: dict[str, list] = {}
        for key, path, _ in out:
            if key in seen:
                raise ValueError(f"duplicated flatten key {key!r}: the state dict paths {seen[key]!r} and {path!r} "
                                 "join to the same dotted key; rename one of them")
            seen[key] = path
    return out


def encode_object(value):
    """JSON form of a plain leaf; tuples are tagged so they come back as tuples.

    Example:
        >>> encode_object((1, "a"))
        {'__tuple__': [1, 'a']}
    """
    if isinstance(value, tuple):
        return {"__tuple__": [encode_object(v) for v in value]}
    if isinstance(value, list):
        return [encode_object(v) for v in value]
    if isinstance(value, Mapping):  # an empty dict, or one holding only plain values
        return {"__dict__": [[k, encode_object(v)] for k, v in value.items()]}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"cannot store {type(value).__name__} {value!r} in a checkpoint: use arrays, numbers, "
                    "strings, None, or lists/tuples/dicts of those")


def decode_object(value):
    """The plain leaf :func:`encode_object` encoded (tuples and dicts come back as such).

    Example:
        >>> decode_object(encode_object({"betas": (0.9, 0.999)}))
        {'betas': (0.9, 0.999)}
    """
    if isinstance(value, list):
        return [decode_object(v) for v in value]
    if isinstance(value, dict):
        if "__tuple__" in value:
            return tuple(decode_object(v) for v in value["__tuple__"])
        if "__dict__" in value:
            return {k: decode_object(v) for k, v in value["__dict__"]}
    return value
