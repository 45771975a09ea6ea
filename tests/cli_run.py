"""Running the harmony CLI from kernel tests, as a user would (a separate process)."""

from __future__ import annotations

import subprocess
import sys
import time

HARMONY = [sys.executable, "-m", "harmony.cli"]


def cli(*args, timeout: float = 180, check_busy: bool = True) -> subprocess.CompletedProcess:
    """Run the harmony CLI; wait and retry while another Harmony run holds the host lock (unless
    ``check_busy`` is false: for commands expected to fail before they take the lock)."""
    deadline = time.monotonic() + 300
    while True:
        p = subprocess.run(HARMONY + [str(a) for a in args], capture_output=True, text=True,
                           timeout=timeout)
        if check_busy and p.returncode == 1 and "another Harmony run" in p.stderr \
                and time.monotonic() < deadline:
            time.sleep(2)
            continue
        return p
