"""Sharding propagation: which placements an op's output has, given its inputs' (torch's
``torch/distributed/tensor/_ops/``). One file per family of ops, beside this one:

* ``_pointwise_ops`` -- elementwise unary ops (``exp``, ``relu``, ``gelu``, ...): placements kept;
* ``_math_ops`` -- ``sum`` / ``mean`` (a sharded reduced dim gives ``Partial``), ``softmax`` /
  ``log_softmax`` over an unsharded dim, ``layer_norm`` over unsharded trailing dims;
* ``_view_ops`` -- ``reshape`` / ``view`` / ``transpose`` / ``permute`` (a sharded dim follows);
* ``_embedding_ops`` -- ``embedding`` (row-sharded table -> ``Partial``, column-sharded ->
  ``Shard(-1)``, sharded ids -> sharded output);
* ``_loss_ops`` -- ``cross_entropy`` (sharded batch -> ``Partial`` / sharded; sharded classes ->
  the vocabulary-parallel loss).

``+``, ``-``, ``* number`` and ``@`` are DTensor's own methods (``_api``). Each op computes
on the local pieces with the ordinary differentiable ops, so gradients follow. An op without a
rule for its inputs' placements raises ``NotImplementedError`` naming the op and the placements:
it never gathers silently. The ops that are ``Tensor`` methods are DTensor methods too
(``dt.sum(dim=0)``, ``dt.softmax(-1)``, ``dt.reshape(...)``); the functional ones are here.

Example::

    from neural_arch.distributed.tensor._ops import cross_entropy, embedding, layer_norm
    h = embedding(idx, wte)                     # wte Shard(0): h Partial()
    h = h.redistribute(mesh, [Replicate()])
    loss = cross_entropy(layer_norm(h, (C,), w, b) @ head, target)
"""

from neural_arch.distributed.tensor import _math_ops, _pointwise_ops, _view_ops
from neural_arch.distributed.tensor._embedding_ops import embedding
from neural_arch.distributed.tensor._loss_ops import cross_entropy
from neural_arch.distributed.tensor._math_ops import layer_norm, log_softmax, mean, softmax, sum
from neural_arch.distributed.tensor._pointwise_ops import UNARY_OPS, unary
from neural_arch.distributed.tensor._view_ops import permute, reshape, transpose, view

__all__ = ["UNARY_OPS", "cross_entropy", "embedding", "layer_norm", "log_softmax", "mean", "permute",
           "reshape", "softmax", "sum", "transpose", "unary", "view"]


def bind_methods(cls) -> None:
    """Make the ops that are ``Tensor`` methods DTensor methods (called once, by the package's
    ``__init__``: ``_api`` cannot import the rules, which import it)."""
    _pointwise_ops.bind(cls)
    _math_ops.bind(cls)
    _view_ops.bind(cls)
