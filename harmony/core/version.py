"""Harmony's version (the package's, setup.cfg's), for the manifests and ``harmony --version``."""

__version__ = "0.1.0"
