"""Harmony: extract the actual CPU load-balancing policy of a running Linux scheduler by experiment.

The library's entry point: ``harmony.load(path)`` opens a run, batch or suite directory
(:func:`harmony.results.load`; ``help(harmony.load)`` lists what it returns and every table's
columns). Everything else is in the modules docs/architecture.md names.
"""

import os as _os

# Installed, probes/, experiments/ and analysis/ are subpackages inside harmony/; in a source tree
# (a clone, an editable install, PYTHONPATH=clone) they sit beside it (setup.cfg's package_dir).
# There the tree's root joins the package's path, so that harmony.analysis & co. come from the same
# tree as harmony itself, whichever directory Python was started in: from a clone's root,
# `python -m` and `-c` put the clone's harmony/ first on sys.path.
_here = _os.path.dirname(_os.path.abspath(__file__))
if not _os.path.isdir(_os.path.join(_here, "analysis")) and \
        _os.path.isfile(_os.path.join(_here, _os.pardir, "analysis", "__init__.py")):
    __path__.append(_os.path.dirname(_here))    # noqa: F821 (a package's own __path__)

from harmony.core.version import __version__  # noqa: E402,F401


def __getattr__(name):
    """``harmony.load``, imported on first use (:mod:`harmony.results`): the fork server and the
    workers import harmony (harmony.core.osutil), and must not load the tables' declarations (nor
    pandas) with it."""
    if name == "load":
        from harmony.results import load

        return load
    raise AttributeError(f"module 'harmony' has no attribute {name!r}")


def __dir__():
    return sorted({*globals(), "load"})
