"""The MPI backend (mpi4py), in one folder.

==============  ====================================================================
module          what it owns
==============  ====================================================================
``backend``     ``MPIBackend``: the six primitives on mpi4py, persistent requests
``allreduce``   the all-reduce strategies (two-rank exchange window, pairwise, native)
``alltoallv``   the uneven all-to-all's plan: split sizes in the check, blocks point-to-point
``check``       the call check every collective starts with (one fixed-size allgather)
``progress``    watchdog waits: every blocking MPI call has a deadline
``failure``     init watchdog, timeout text, job abort, the ``MPI_Abort`` exception hook
==============  ====================================================================

Imported only when the ``mpi`` backend is asked for (mpi4py is an extra).
"""
