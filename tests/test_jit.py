"""harmony.core.jit's thread pool and side thread: split work runs on them, waits for every range,
survives fork, and never keeps the console script from exiting."""

import os
import subprocess
import sys
import threading
import time

import pytest

from harmony.core import jit


def test_run_split_returns_in_range_order_and_uses_the_pool():
    seen = []

    def fn(lo, hi, k):
        seen.append(threading.current_thread().name)
        return (lo, hi, k)

    ranges = [(0, 3), (3, 5), (5, 9)]
    assert jit.run_split(fn, ranges) == [(0, 3, 0), (3, 5, 1), (5, 9, 2)]
    assert seen.count(threading.current_thread().name) == 1    # the first range, here
    assert sum(name.startswith("harmony-kernel") for name in seen) == 2


def test_run_split_waits_for_every_range_when_one_raises():
    done = []

    def fn(lo, hi, k):
        if k == 0:
            raise ValueError("first range")
        time.sleep(0.2)
        done.append(k)

    with pytest.raises(ValueError, match="first range"):
        jit.run_split(fn, [(0, 1), (1, 2), (2, 3)])
    assert sorted(done) == [1, 2]      # nothing still runs after the call


def test_the_side_thread_is_one_thread_that_may_wait_on_the_pool():
    # always the same thread: the memory its last call freed stays in its malloc arena
    assert len({jit.on_side_thread(threading.get_native_id).result() for _ in range(20)}) == 1
    assert jit.on_side_thread(threading.get_native_id).result() != threading.get_native_id()
    # what it runs may split its work over the pool and wait for it (df_core's runs do)
    split = jit.on_side_thread(jit.run_split, lambda lo, hi, k: k, [(0, 1), (1, 2), (2, 3)])
    assert split.result(timeout=20) == [0, 1, 2]


def test_a_forked_child_gets_its_own_pool():
    assert jit.in_background(int, "7").result() == 7      # the parent's pool has threads now
    assert jit.on_side_thread(int, "6").result() == 6     # and its side thread
    pid = os.fork()
    if pid == 0:  # the parent's threads do not exist here: the old pool would never run this
        ok = False
        try:
            ok = (jit.in_background(int, "8").result(timeout=20) == 8
                  and jit.on_side_thread(int, "9").result(timeout=20) == 9)
        finally:
            os._exit(0 if ok else 1)
    deadline = time.monotonic() + 30
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail("the forked child's work never ran")
        time.sleep(0.01)
    assert os.waitstatus_to_exitcode(status) == 0


def test_console_script_exits_after_using_the_pool():
    # entry() joins the non-daemon threads before os._exit: the pool's idle workers must end first
    code = ("import sys\nfrom harmony.core import jit\njit.in_background(int, '1').result()\n"
            "jit.on_side_thread(int, '1').result()\n"
            "sys.argv = ['harmony', '--help']\nfrom harmony.cli import entry\nentry()\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "Usage" in out.stdout


FORKED_ANALYSES = """
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from harmony.core import jit

def child(x):   # an analysis process on a large trace splits work on its own pool
    return jit.run_split(lambda lo, hi, k: k, [(0, 1), (1, 2), (2, 3)]) + [x]

if __name__ == "__main__":
    jit.in_background(int, "1").result()      # the parent's pool exists when it forks
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("fork")) as pool:
        print(list(pool.map(child, range(4))))
"""


def test_forked_analysis_processes_use_and_leave_their_pools(tmp_path):
    # as harmony.runners.analyse_groups forks them; each must exit once done (its pool's idle
    # threads must not hold it)
    script = tmp_path / "forked.py"
    script.write_text(FORKED_ANALYSES)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str([[0, 1, 2, x] for x in range(4)])
