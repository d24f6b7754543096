"""Rendezvous: the key-value stores ranks meet through (:mod:`.store`, :mod:`.file_store`)."""
