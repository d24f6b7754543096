"""Distributed data: :class:`~.sampler.DistributedSampler` and ``distributed_evaluate``."""
