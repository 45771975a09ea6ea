"""Harmony: extract the actual CPU load-balancing policy of a running Linux scheduler by experiment."""

__version__ = "0.1.0"


def load(run_dir):
    """Load a run directory; see :func:`harmony.store.load`."""
    # imported here: the fork server and the workers import harmony (harmony.osutil), and must not
    # load pandas with it
    from harmony.store import load as _load

    return _load(run_dir)
