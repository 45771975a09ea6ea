"""Harmony: extract the actual CPU load-balancing policy of a running Linux scheduler by experiment.

The library's entry points: :func:`load` (a run directory). Everything else is in the modules
README's "Layout of the code" names.
"""

from harmony.version import __version__  # noqa: F401


def load(run_dir, allow_incomplete: bool = False):
    """Load a run directory, verified: see :func:`harmony.pipeline.load`."""
    # imported here: the fork server and the workers import harmony (harmony.osutil), and must not
    # load pandas with it
    from harmony.pipeline import load as _load

    return _load(run_dir, allow_incomplete=allow_incomplete)
