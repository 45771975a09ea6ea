"""The fork server forked from its controller (:func:`harmony.workload.forkserver.fork_now`, what
the guest agent does at its start): a child of the controller named as the server is, which
serves (a calibration's pairs forked from it), holds none of the controller's input, and dies with
the controller; in a process where another thread runs, nothing is forked and the server is a
fresh interpreter as before."""

import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import ROOT

CONTROLLER = r"""
import os, sys, threading, time
from harmony.workload import forkserver
if sys.argv[1] == "thread":
    threading.Thread(target=threading.Event().wait, daemon=True).start()
forkserver.fork_now()
server, why = forkserver.shared()
assert server is not None, why
ns = forkserver._calibrate_served([[0, 0]], 50)
with open(f"/proc/{server.pid}/cmdline", "rb") as f:
    fresh = b"-m\0harmony.workload.forkserver" in f.read()
with open(f"/proc/{server.pid}/comm") as f:
    comm = f.read().strip()
with open(f"/proc/{server.pid}/stat") as f:
    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
print(server.pid, ppid == os.getpid(), comm, fresh, os.readlink(f"/proc/{server.pid}/fd/0"),
      len(ns) == 1 and ns[0] > 0, flush=True)
if sys.argv[2] == "wait":
    time.sleep(600)
"""


def _controller(threads: str, then: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-S", "-c", CONTROLLER, threads, then],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})


def _gone(pid: int, within_s: float = 10.0) -> bool:
    give_up = time.monotonic() + within_s
    while time.monotonic() < give_up:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.02)
    return False


@pytest.mark.parametrize("threads, forked", [("alone", True), ("thread", False)])
def test_the_server_is_forked_from_a_controller_alone_and_ends_with_it(threads, forked):
    p = _controller(threads, "exit")
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    pid, child, comm, fresh, stdin, served = out.split()
    assert (child, comm, fresh, served) == ("True", "harmony-forksrv", str(not forked), "True")
    if forked:      # the controller's input (the guest's job channel) is not the server's
        assert stdin == "/dev/null"
    assert _gone(int(pid)), "the fork server outlived its controller's exit"


def test_a_forked_server_dies_with_its_killed_controller():
    p = _controller("alone", "wait")
    try:
        line = p.stdout.readline().split()
        assert line and line[1] == "True", p.stderr.read() if not line else line
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
        assert _gone(int(line[0])), "the fork server outlived its killed controller"
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
