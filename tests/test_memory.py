"""harmony.memory: importing the probes or the analyses stops numpy's huge-page requests
(measured 1.3-1.5x faster decoding on a VM), unless numpy's own switch is set."""

import os
import subprocess
import sys

import pytest

CHECK = ("import harmony.{mod}\n"
         "try:\n    from numpy._core import multiarray\n"
         "except ImportError:\n    from numpy.core import multiarray\n"
         "print(multiarray._get_madvise_hugepage())")


def _flag(mod: str, **env) -> str:
    base = {k: v for k, v in os.environ.items() if k != "NUMPY_MADVISE_HUGEPAGE"}
    out = subprocess.run([sys.executable, "-c", CHECK.format(mod=mod)], env=base | env,
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


@pytest.mark.parametrize("mod", ["probes", "analysis"])
def test_importing_turns_numpy_huge_pages_off(mod):
    assert _flag(mod) == "False"


def test_numpy_switch_set_by_the_user_wins():
    assert _flag("probes", NUMPY_MADVISE_HUGEPAGE="1") == "True"
