"""FSDP's auto-wrap policies at torch's path, ``torch.distributed.fsdp.wrap``.

A policy is torch's callable ``policy(module, recurse, nonwrapped_numel) -> bool``: with
``recurse=True`` it says whether to look inside ``module``; with ``recurse=False``, whether
``module`` becomes its own FSDP unit.

Example::

    >>> import functools
    >>> from neural_arch import nn
    >>> policy = ModuleWrapPolicy({nn.Linear})
    >>> policy(nn.Linear(2, 2), recurse=False, nonwrapped_numel=6)
    True
    >>> big = functools.partial(size_based_auto_wrap_policy, min_num_params=100)
    >>> big(nn.Linear(2, 2), recurse=False, nonwrapped_numel=6)
    False
"""

from __future__ import annotations

__all__ = ["ModuleWrapPolicy", "resolve_policy", "size_based_auto_wrap_policy", "transformer_auto_wrap_policy"]


def size_based_auto_wrap_policy(module, recurse: bool, nonwrapped_numel: int,
                                min_num_params: int = int(1e8), exclude_wrap_modules=None, **_) -> bool:
    """torch's rule: wrap a module once its not-yet-wrapped parameters reach ``min_num_params``.

    Example:
        >>> from neural_arch import nn
        >>> size_based_auto_wrap_policy(nn.Linear(2, 2), recurse=False, nonwrapped_numel=6, min_num_params=4)
        True
    """
    if recurse:
        return True
    if exclude_wrap_modules and isinstance(module, tuple(exclude_wrap_modules)):
        return False
    return nonwrapped_numel >= min_num_params


def transformer_auto_wrap_policy(module, recurse: bool, nonwrapped_numel: int,
                                 transformer_layer_cls=(), **_) -> bool:
    """Wrap every instance of ``transformer_layer_cls`` (a set of classes).

    Example:
        >>> import functools
        >>> from neural_arch import nn
        >>> policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={nn.Linear})
        >>> policy(nn.Linear(2, 2), recurse=False, nonwrapped_numel=6)
        True
    """
    if recurse:
        return True
    return isinstance(module, tuple(transformer_layer_cls))


class ModuleWrapPolicy:
    """Wrap every submodule that is an instance of one of ``module_classes``.

    Example:
        >>> from neural_arch import nn
        >>> ModuleWrapPolicy({nn.Linear})(nn.ReLU(), recurse=False, nonwrapped_numel=0)
        False
    """

    def __init__(self, module_classes):
        self.module_classes = tuple(module_classes)
        if not all(isinstance(c, type) for c in self.module_classes):
            raise TypeError(f"ModuleWrapPolicy needs module classes, got {module_classes!r}")

    def __call__(self, module, recurse: bool, nonwrapped_numel: int) -> bool:
        return True if recurse else isinstance(module, self.module_classes)


def resolve_policy(policy):
    """A callable ``(module, recurse, nonwrapped_numel) -> bool`` from what users may pass.

    Example:
        >>> from neural_arch import nn
        >>> type(resolve_policy({nn.Linear})).__name__    # a set of classes becomes a policy
        'ModuleWrapPolicy'
        >>> resolve_policy(None) is None
        True
    """
    if policy is None:
        return None
    if isinstance(policy, (set, frozenset, list, tuple)):
        return ModuleWrapPolicy(policy)
    if callable(policy):
        return policy
    raise TypeError(f"auto_wrap_policy must be a callable (module, recurse, nonwrapped_numel) -> bool, "
                    f"a ModuleWrapPolicy, or a set of module classes; got {policy!r}")
