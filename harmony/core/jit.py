"""When Harmony uses its compiled kernels (:mod:`harmony.core.kernels`): the trace decoder, the
task state machine, the tables' and checks' passes.

Compiled, they are several times faster than their numpy versions (which stay, give the same
tables, and are tested against them). Compiled ahead of time (``python -m harmony.precompile``),
they load in ~1 ms; by numba's JIT, importing numba and loading the kernels from its cache costs
~0.4-1 s once per process. ``HARMONY_JIT`` chooses:

- ``auto`` (default): compiled when the kernels are ready (built ahead of time, or numba loaded
  in this process already), or when the input is large enough to repay numba's start-up; numpy
  otherwise
- ``1``: always compiled (where numba is installed); ``0``: never
"""

from __future__ import annotations

import os
import sys
import threading

from harmony.core.kernels import numba_version  # noqa: F401 -- also this module's


def mode() -> str:
    m = os.environ.get("HARMONY_JIT", "auto").strip().lower()
    return m if m in ("0", "1") else "auto"


def numba_loaded() -> bool:
    """The compiled kernels cost nothing more to start here: they are built ahead of time, or
    numba is imported in this process already."""
    from harmony.core import kernels
    return "numba" in sys.modules or kernels.aot_ready()


def use_compiled(size: int, min_size: int) -> bool:
    """Whether to run the compiled kernel on an input of ``size`` (bytes, events: the caller's
    unit) when it repays numba's start-up from ``min_size`` on."""
    m = mode()
    if m == "0" or numba_version() is None:     # without numba, a call the build misses fails
        return False
    return m == "1" or size >= min_size or numba_loaded()


def describe() -> tuple[bool, str]:
    """(compiled kernels usable, a line for ``harmony doctor``)."""
    from harmony.core import kernels
    v = numba_version()
    if v is None:
        return False, "numpy only: numba is not installed (large traces decode 3-5x slower)"
    if mode() == "0":
        return False, f"numpy only: HARMONY_JIT=0 (numba {v} installed)"
    if kernels.aot_ready():
        return True, (f"compiled ahead of time (numba {v}) in {kernels.aot_built()}, for every "
                      f"trace{' (HARMONY_JIT=1)' if mode() == '1' else ''}")
    if not kernels.aot_enabled():
        why = "HARMONY_AOT=0"
    elif (failed := kernels.failed_build()) is not None:
        reason = failed.get("last_line") or "no reason"
        why = (f"a command's build for this code failed ({reason}): python -m "
               "harmony.precompile tries again")
    else:
        why = ("not built for this code: python -m harmony.precompile, or the first command "
               "that analyses a trace")
    if mode() == "1":
        return True, f"compiled by numba {v}'s JIT ({why}), for every trace (HARMONY_JIT=1)"
    return True, (f"compiled by numba {v}'s JIT for large traces, numpy below ({why}; each "
                  f"large import loads numba, ~0.4 s)")


#: below this many items a kernel runs on one thread: handing a range to a pool thread costs
#: ~0.05 ms, and the tests lower it to run the split path on small inputs
PARALLEL_MIN_ITEMS = 50_000


def threads() -> int:
    """Threads a compiled kernel may split its input over: the CPUs this process may run on
    (``HARMONY_THREADS`` overrides; 1 = never split)."""
    env = os.environ.get("HARMONY_THREADS", "").strip()
    if env.isdigit() and int(env) > 0:
        return int(env)
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def split(n: int, per_item: int = 1) -> list[tuple[int, int]]:
    """[lo, hi) ranges cutting range(n) into about equal parts, one per thread; a single range
    when the work, ``n * per_item`` (e.g. pages x records per page), is below PARALLEL_MIN_ITEMS."""
    k = 1 if n * per_item < PARALLEL_MIN_ITEMS else max(1, min(threads(), n))
    cuts = [n * i // k for i in range(k + 1)]
    return [(cuts[i], cuts[i + 1]) for i in range(k)]


def run_split(fn, ranges: list[tuple[int, int]]) -> list:
    """[fn(lo, hi, part) for each range]: the first range on this thread, the others on the pool's
    (:func:`in_background`). fn must release the GIL (a ``nogil`` numba kernel) for the threads to
    run at once. Returns, or raises, only when every range is done."""
    from concurrent.futures import wait
    futures = [in_background(fn, lo, hi, k) for k, (lo, hi) in enumerate(ranges[1:], 1)]
    try:
        first = fn(*ranges[0], 0)
    finally:
        wait(futures)           # no range outlives the call, even when one raised
    return [first] + [f.result() for f in futures]


#: this process's executors by thread name prefix: (pid, executor); a forked child makes its own
_executors: dict[str, tuple[int, object]] = {}


def _executor(prefix: str, workers: int):
    """This process's executor of ``workers`` threads named ``prefix``, made on first use (and
    again in a forked child: the parent's threads do not exist in it)."""
    held = _executors.get(prefix)
    if held is None or held[0] != os.getpid():
        from concurrent.futures import ThreadPoolExecutor
        held = _executors[prefix] = (os.getpid(),
                                     ThreadPoolExecutor(workers, thread_name_prefix=prefix))
    return held[1]


def in_background(fn, *args):
    """A future of fn(*args), run on this process's thread pool. The pool lives as long as the
    process: starting threads for each call cost more than the small kernels' work. Its tasks
    (kernels' ranges) wait on nothing: a task that splits its work goes to
    :func:`on_side_thread`."""
    return _executor("harmony-kernel", max(4, 3 * threads())).submit(fn, *args)


def on_side_thread(fn, *args):
    """A future of fn(*args), run on this process's one side thread (df_core's runs, built beside
    the rest). Always the same thread, so that the memory its arrays take stays in its malloc
    arena for its next call: on whichever pool thread was free, a call faulted its arrays in
    afresh whenever the thread differed from the last call's (2 M events: ~24 000 pages, half of
    the runs' time)."""
    return _executor("harmony-side", 1).submit(fn, *args)


def on_the_side_thread() -> bool:
    """Whether this is the side thread (:func:`on_side_thread`): a call there that handed work
    to the side thread and waited for it would wait for itself."""
    return threading.current_thread().name.startswith("harmony-side")


def shutdown_pool() -> None:
    """Let the pool's and the side thread's idle threads end (the next :func:`in_background` or
    :func:`on_side_thread` starts them again). An interpreter that exits normally does this
    itself; one that leaves by ``os._exit`` after joining its threads (``harmony.cli.entry``) must
    call it first, or wait for them forever."""
    while _executors:
        pid, executor = _executors.popitem()[1]
        if pid == os.getpid():
            executor.shutdown(wait=True)
