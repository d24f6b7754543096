"""Rendezvous: the key-value stores ranks meet through.

:mod:`.store` names them all (torch's names): :mod:`.base` (the ``Store`` interface,
``PrefixStore``, ``store_barrier``), :mod:`.tcp_store` (``TCPStore``), :mod:`.file_store`
(``FileStore``).
"""
