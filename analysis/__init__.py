"""Reconstruction, metrics, policy inference, plots."""

from harmony.memory import tune_allocations

tune_allocations()  # analyses fill and free many large arrays: see harmony.memory
