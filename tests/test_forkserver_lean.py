"""The fork server's lean fork (:func:`harmony.workload.forkserver.lean_fork`): the C library's
fork() without CPython's after-fork work, only in a process with a single thread. The at-fork
handlers are the witness: they run in a child of os.fork(), and not in a lean one."""

import os
import subprocess
import sys

import pytest
from conftest import ROOT

FORK = r"""
import os, sys, threading
from harmony.workload import forkserver
ran = []
os.register_at_fork(after_in_child=lambda: ran.append("handlers"))
if sys.argv[1] == "thread":         # another thread runs: a lean fork would be unsafe
    threading.Thread(target=threading.Event().wait, daemon=True).start()
alone = forkserver.one_thread()
r, w = os.pipe()
pid = forkserver.lean_fork(alone)
if pid == 0:
    os.write(w, f"{os.getpid()} {os.getppid()} {','.join(ran) or 'none'}".encode())
    os._exit(7)
os.close(w)
child, parent, handlers = os.read(r, 200).decode().split()
_, status = os.waitpid(pid, 0)
print(alone, child == str(pid), parent == str(os.getpid()), handlers,
      os.waitstatus_to_exitcode(status))
"""


@pytest.mark.parametrize("threads, want", [("alone", "True True True none 7"),
                                           ("thread", "False True True handlers 7")])
def test_a_lean_fork_skips_the_at_fork_work_only_in_a_process_alone(threads, want):
    out = subprocess.run([sys.executable, "-c", FORK, threads], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == want.split()
