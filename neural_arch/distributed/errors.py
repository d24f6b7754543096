"""Exceptions raised by the communication layer.

Every error names the operation, its sequence number within the group and the ranks
involved, so that a failure on rank 3 of 5 can be read without the other four logs::

    CollectiveTimeoutError: all_reduce #57 (shape (1024,), float32) on group [0, 1, 2, 3]
    timed out after 30.0 s on rank 0: ranks [3] did not arrive; ranks [0, 1, 2] were waiting
"""

from __future__ import annotations


class DistributedError(RuntimeError):
    """Base class of every error raised by ``neural_arch.distributed``.

    Catch it to handle any failure of the distributed layer in one place.

    Example::

        >>> from neural_arch.distributed.errors import DistributedError, PeerFailureError
        >>> issubclass(PeerFailureError, DistributedError)
        True
    """


class NotInitializedError(DistributedError):
    """A collective was called before ``init_process_group()``.

    Example::

        >>> from neural_arch.distributed.errors import DistributedError, NotInitializedError
        >>> issubclass(NotInitializedError, DistributedError)
        True
    """


class CollectiveTimeoutError(DistributedError, TimeoutError):
    """A blocking operation did not complete within the group's timeout.

    Also a ``TimeoutError``, so ``except TimeoutError`` catches it.

    Example::

        >>> from neural_arch.distributed.errors import CollectiveTimeoutError
        >>> issubclass(CollectiveTimeoutError, TimeoutError)
        True
    """


class PeerFailureError(DistributedError, ConnectionError):
    """A peer closed its connection or died while an operation needed it.

    Also a ``ConnectionError``.

    Example::

        >>> from neural_arch.distributed.errors import PeerFailureError
        >>> issubclass(PeerFailureError, ConnectionError)
        True
    """


class CollectiveMismatchError(DistributedError):
    """Ranks called different collectives (op, shape, dtype or root) at the same sequence number.

    Example::

        >>> from neural_arch.distributed.errors import CollectiveMismatchError, FrameMismatchError
        >>> issubclass(FrameMismatchError, CollectiveMismatchError)
        True
    """


class RendezvousError(DistributedError):
    """Ranks did not all reach the rendezvous in time (the message lists the missing ones).

    Example::

        >>> from neural_arch.distributed.errors import HandshakeError, RendezvousError, StoreTimeoutError
        >>> issubclass(StoreTimeoutError, RendezvousError), issubclass(HandshakeError, RendezvousError)
        (True, True)
    """


class StoreTimeoutError(RendezvousError, TimeoutError):
    """A key did not appear within the store's timeout (the message names it).

    Example::

        >>> from neural_arch.distributed.errors import StoreTimeoutError
        >>> issubclass(StoreTimeoutError, TimeoutError)
        True
    """


class AuthenticationError(DistributedError):
    """A connection presented no job token, or the wrong one.

    Example::

        >>> from neural_arch.distributed.errors import AuthenticationError, DistributedError
        >>> issubclass(AuthenticationError, DistributedError)
        True
    """


class UnusedParametersError(DistributedError):
    """Some parameters got no gradient in a synchronised DDP backward (``find_unused_parameters=False``).

    Example::

        >>> from neural_arch.distributed.errors import DistributedError, UnusedParametersError
        >>> issubclass(UnusedParametersError, DistributedError)
        True
    """


class FrameMismatchError(CollectiveMismatchError, ValueError):
    """A message's header (op, sequence number, dtype, byte count) does not match what the receiver
    expected: the ranks called different collectives, or the same one with different dtypes/sizes.
    Also a ``ValueError``, so code that caught the old size-mismatch ``ValueError`` still catches it.

    Example::

        >>> from neural_arch.distributed.errors import FrameMismatchError
        >>> try:
        ...     raise FrameMismatchError("all_reduce #3: expected float32, got float64")
        ... except ValueError as err:
        ...     print(type(err).__name__)
        FrameMismatchError
    """


class GroupPoisonedError(DistributedError):
    """An earlier operation failed after bytes had moved: the group's streams may be out of step, so
    every later operation fails at once (the message names the first failure). Destroy the process
    group and create it again.

    Example::

        >>> from neural_arch.distributed.errors import DistributedError, GroupPoisonedError
        >>> issubclass(GroupPoisonedError, DistributedError)
        True
    """


class GroupDestroyedError(DistributedError):
    """An operation another thread of this rank was waiting in when its process group was destroyed
    (``destroy_process_group()`` or the group's shutdown): it did not complete, and it stops as soon as
    the destroy begins rather than waiting for peers that may never come.

    Example::

        >>> from neural_arch.distributed.errors import GroupDestroyedError
        >>> str(GroupDestroyedError.during("recv #3 (shape (4,), float32, root 1)", rank=0))[:44]
        'recv #3 (shape (4,), float32, root 1) on ran'
    """

    @classmethod
    def during(cls, what: str, rank: int) -> GroupDestroyedError:
        """The error for the op ``what`` (``info.describe()``) on ``rank``."""
        return cls(f"{what} on rank {rank} did not complete: its process group was destroyed "
                   "(destroy_process_group() or the group's shutdown, from another thread of this rank) while "
                   "it was waiting; wait for every operation before destroying the group")


class ProtocolError(DistributedError):
    """A peer sent bytes that break the wire protocol (a header announcing 2**40 bytes, an unknown
    channel): the connection is dropped, never trusted.

    Example::

        >>> from neural_arch.distributed.errors import DistributedError, ProtocolError
        >>> issubclass(ProtocolError, DistributedError)
        True
    """


class HandshakeError(RendezvousError):
    """A store, transport or agent handshake failed or timed out (the message names host, port, rank
    and the phase).

    Example::

        >>> from neural_arch.distributed.errors import HandshakeError, RendezvousError
        >>> issubclass(HandshakeError, RendezvousError)
        True
    """
