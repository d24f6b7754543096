"""Point-to-point for pipelines: tags per pipeline edge, the shape handshake, error wording.

Edge ``e`` joins stage ``e`` and stage ``e + 1``. Activations travel on tag
``TAG_BASE + 2e`` and gradients on ``TAG_BASE + 2e + 1``, so each (direction, edge) has its own
FIFO lane in the backend and the receiver's order always matches the sender's: every schedule
visits one stage's micro-batches in increasing order.

Once per ``step`` the first activation on an edge is preceded by a 16-int64 header
``[ndim, dtype code, *shape]``; the receiver allocates from it and every later micro-batch of
the step arrives as a bare buffer. Gradients need no header: they have the shape and dtype of
the activation the same stage sent.

Example::

    work = isend_meta(group, activation, dst_group_rank, edge_tag(stage, forward=True))
"""

from __future__ import annotations

import numpy as np

from neural_arch.distributed.comm.work import Work
from neural_arch.distributed.errors import DistributedError

TAG_BASE = 1000
META_LEN = 16
_DTYPES = ("float16", "float32", "float64", "int8", "uint8", "int32", "int64", "bool")
# Grace on top of the backend's own deadline: the transport raises first; this only guards a hang.
WAIT_GRACE_S = 15.0


class PipelineError(DistributedError):
    """A pipeline stage failed to send or receive; the message names both stages and ranks.

    ``action`` is the SEND/RECV action that failed (None when unknown).

    Example::

        try:
            schedule.step(x, target=y)
        except PipelineError as exc:
            print(exc.action, exc)       # the SEND/RECV that failed, and both stages and ranks
    """

    action = None


def _error(describe, exc: BaseException) -> PipelineError:
    err = PipelineError(f"{describe()} failed: {type(exc).__name__}: {exc}")
    err.action = getattr(describe, "action", None)
    return err


def edge_tag(sender_stage: int, forward: bool) -> int:
    """Tag of the activation (``forward``) or gradient crossing the edge after ``sender_stage``
    (forward) or before it (backward).

    Example::

        >>> edge_tag(0, forward=True) - TAG_BASE, edge_tag(1, forward=False) - TAG_BASE
        (0, 1)
    """
    edge = sender_stage if forward else sender_stage - 1
    return TAG_BASE + 2 * edge + (0 if forward else 1)


def encode_meta(array) -> np.ndarray:
    """The fixed-size header sent before an activation: ndim, dtype index, then the shape (-1 padded).

    Example::

        >>> shape, dtype = decode_meta(encode_meta(np.zeros((2, 3), np.float32)))
        >>> shape, dtype
        ((2, 3), dtype('float32'))
    """
    if array.ndim > META_LEN - 2:
        raise ValueError(f"pipeline activations may have at most {META_LEN - 2} dimensions, got {array.ndim}")
    name = str(array.dtype)
    if name not in _DTYPES:
        raise TypeError(f"a pipeline stage returned dtype {name}, which cannot be sent; use one of {_DTYPES}")
    meta = np.full(META_LEN, -1, dtype=np.int64)
    meta[0], meta[1] = array.ndim, _DTYPES.index(name)
    meta[2:2 + array.ndim] = array.shape
    return meta


def decode_meta(meta: np.ndarray):
    """``(shape, dtype)`` from a header made by :func:`encode_meta`: what the receiver allocates.

    Example::

        >>> decode_meta(encode_meta(np.zeros(4, np.float64)))
        ((4,), dtype('float64'))
    """
    ndim = int(meta[0])
    return tuple(int(d) for d in meta[2:2 + ndim]), np.dtype(_DTYPES[int(meta[1])])


def wait(work: Work, backend, describe) -> None:
    """Wait on a p2p Work within the backend's timeout; failures become :class:`PipelineError`.

    Example::

        work = start(lambda: backend.send(activation, peer, tag), describe)
        wait(work, backend, describe)    # a timeout or a dead peer raises PipelineError
    """
    try:
        work.wait(timeout=backend.timeout + WAIT_GRACE_S)
    except PipelineError:
        raise
    except Exception as exc:
        raise _error(describe, exc) from exc


def start(fn, describe) -> Work | None:
    """Start a p2p op (``fn()`` returns a Work); a synchronous failure gets the pipeline's context too.

    Example::

        work = start(lambda: backend.recv(buffer, peer, tag), describe)
        if work is not None:
            wait(work, backend, describe)
    """
    try:
        return fn()
    except (ValueError, TypeError):
        raise
    except Exception as exc:
        raise _error(describe, exc) from exc


__all__ = ["META_LEN", "TAG_BASE", "PipelineError", "decode_meta", "edge_tag", "encode_meta", "start", "wait"]
