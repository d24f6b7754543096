"""Utilities with torch's names: :mod:`neural_arch.utils.checkpoint` (activation checkpointing)."""
