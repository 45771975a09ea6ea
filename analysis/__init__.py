"""Reconstruction, metrics, policy inference, plots."""

from harmony.memory import small_pages

small_pages()  # analyses fill and free many large arrays: see harmony.memory
