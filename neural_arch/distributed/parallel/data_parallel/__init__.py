"""Data parallelism: :class:`~.ddp.DistributedDataParallel`, its gradient :mod:`.reducer`, uneven
inputs (:mod:`.join`) and the communication hooks the reducer calls (:mod:`.comm_hooks`)."""
