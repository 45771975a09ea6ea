"""Harmony: extract the actual CPU load-balancing policy of a running Linux scheduler by experiment.

The library's entry points: :func:`load` (a run directory). Everything else is in the modules
docs/architecture.md names.
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


def load(run_dir, allow_incomplete: bool = False):
    """Load a run directory, verified: see :func:`harmony.pipeline.load_checked`."""
    # imported here: the fork server and the workers import harmony (harmony.core.osutil), and must not
    # load pandas with it
    from harmony.pipeline import load_checked as _load

    return _load(run_dir, allow_incomplete=allow_incomplete)
