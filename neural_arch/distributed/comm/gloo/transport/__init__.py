"""Byte transports under the gloo backend: frame format (:mod:`.framing`), TCP and shared-memory
links (:mod:`.tcp`, :mod:`.shm`), and the engine that connects a full mesh at rendezvous (:mod:`.engine`)."""
