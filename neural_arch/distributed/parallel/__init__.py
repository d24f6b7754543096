"""Parallel strategies, each proven equal to single-process training on the global batch.

``data_parallel/`` (DDP), ``tensor_parallel/``, ``pipeline/``, ``sharded/`` (ZeRO, FSDP).
"""
