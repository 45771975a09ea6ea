"""Reconstruction, metrics, policy inference, plots."""
