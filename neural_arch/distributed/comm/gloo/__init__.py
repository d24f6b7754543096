"""The gloo-style backend (pure Python, TCP + shared memory), in one folder.

=================  ================================================================
module             what it owns
=================  ================================================================
``backend``        ``GlooBackend``: connects the mesh, runs each op
``plans``          collective schedules as data (ring, recursive halving, trees...)
``executor``       runs a plan's steps over the links; the one plan cache
``shm_direct``     same-host collectives on one shared segment
``transport/``     framing, TCP and shared-memory links, the connection ``engine``
=================  ================================================================
"""
