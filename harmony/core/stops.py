"""How a stopping signal (Ctrl-C, SIGTERM, SIGHUP) becomes an exception in the ``harmony``
command: ``KeyboardInterrupt`` for SIGINT, :class:`~harmony.core.errors.Interrupted` for the
others, raised where the main thread is, but never inside an import.

Python runs a signal's handler in the main thread between two bytecodes, right after a C call
returns too. Raised between importlib's ``_imp.acquire_lock()`` and the ``try`` that releases it
(``_get_module_lock``, and its weakref callback ``cb``, run as a finalizer wherever a module's
lock dies), the exception leaves the global import lock held by the main thread: every other
thread's next import then waits for ever. A CI run stopped by Ctrl-C 0.3 s after its start took
its capture, then hung in its analysis, its side thread waiting on that lock in
``_get_module_lock("harmony.analysis.plots")`` (2026-12-06). Raised in a module's own code, a
stop can be turned into another error: a Ctrl-C in numpy's code, run as matplotlib's
extension ``_backend_agg`` initialised, came out as "ImportError: initialization failed" and a
traceback. So:

- :func:`raise_stop`, the handler, raises nothing while the main thread is inside an import
  (importlib's frames on its stack): it sends the signal again, to the main thread,
  :data:`RETRY_S` later, until the import is over, and is raised there. A stop waits for the
  import under way, never longer (seaborn's, the longest, pandas with it: 1.0 s on a busy
  two-CPU host), and at most :data:`MAX_WAIT_S`: an import that takes longer is stuck, and is
  stopped as Python would have.
- :func:`guard_imports` puts it in place of Python's own SIGINT handler as the command's first
  modules are imported (its start-up's imports, 0.1 s and more, end before the stop is raised,
  in the command, which says "interrupted"), and :func:`handle_stops` for every stop once the
  command runs.
- :func:`release_leaked_import_lock` gives back what a stop raised by Python's own handler, as
  the process started, left held.
- :func:`never_swallowed`: a stop raised in a finalizer (a weakref callback, a ``__del__``) is
  ignored by Python, which prints "Exception ignored in ..." and goes on; it is sent again.
- :func:`swallowed`: a stop raised in a Python call an extension's C code made, and replaced there
  by an error of the extension's own with no trace of it, is found again: the error that
  follows a stop stands for it.

Standard library and Harmony's leaves only (:mod:`harmony.core.errors`,
:mod:`harmony.core.osutil`): the command sets :func:`guard_imports` before it imports anything
else.
"""

from __future__ import annotations

import _imp
import os
import queue
import signal
import sys
import threading
import time

from harmony.core.errors import Interrupted, stop_behind
from harmony.core.osutil import STOP_SIGNALS

#: how long a stop that came inside an import waits before it is sent again
RETRY_S = 0.01

#: the longest a stop waits for an import to end (the longest one here: 1.0 s, busy)
MAX_WAIT_S = 5.0

#: (when the stop waiting for an import to end came, when it was last sent again:
#: time.monotonic()), or None. A chain not sent again for a second ended elsewhere (its signal
#: taken by another handler): the next stop waits afresh
_waiting: tuple[float, float] | None = None

#: how many stops :func:`raise_stop` and :class:`held` have raised in this process, and the
#: signal of the last
_raised: tuple[int, int | None] = (0, None)

#: importlib's bootstrap modules by the names their code runs under: ``_frozen_importlib`` until
#: the ``importlib`` package is imported (Python's start-up), then ``importlib._bootstrap``
IMPORT_MACHINERY = frozenset({"_frozen_importlib", "_frozen_importlib_external",
                              "importlib._bootstrap", "importlib._bootstrap_external"})


def stop_exception(signum: int) -> BaseException:
    """What the stopping signal ``signum`` raises."""
    if signum == signal.SIGINT:
        return KeyboardInterrupt()
    return Interrupted(f"stopped by {signal.Signals(signum).name}", signum)


def in_import_machinery(frame) -> bool:
    """Whether ``frame`` is importlib's own code, where a raised exception can leave the import
    lock or a module's lock held."""
    return frame is not None and frame.f_globals.get("__name__") in IMPORT_MACHINERY


def importing(frame) -> bool:
    """Whether ``frame`` runs inside an import: importlib's frames on the stack, from it out.
    A stop taken while :func:`raise_stop` itself ran (starting its thread) finds there
    the import the first one was taken in: raised in the handler, it would leave the handler
    into that import (27 leaks in 300 stops, when only the innermost frame was looked at)."""
    while frame is not None:
        if in_import_machinery(frame):
            return True
        frame = frame.f_back
    return False


#: the stops to send again (their signal numbers), for :func:`_resend`'s thread. A put into a
#: SimpleQueue is reentrant and never waits: a handler that defers a stop returns at once.
#: Started as a timer thread each, a deferral waited for its thread to start, and on a busy
#: host the next signal (every 0.5 ms in test_stops, or a stop's own resending) came in that
#: wait: handlers nested in handlers until a RecursionError was raised deep in an import, the
#: import lock left held (1 stop in 1,500-3,000 with two CPU hogs beside it; CI, 2026-12-07)
_again: queue.SimpleQueue = queue.SimpleQueue()

#: the thread that sends the stops of :data:`_again` again, started by the first deferral
_resender: threading.Thread | None = None


def _resend(again: queue.SimpleQueue) -> None:
    """For ever: each stop deferred, sent again to the main thread :data:`RETRY_S` after it came,
    those that came meanwhile with it, each signal once."""
    while True:
        due = {again.get()}
        time.sleep(RETRY_S)
        while True:
            try:
                due.add(again.get_nowait())
            except queue.Empty:
                break
        for signum in due:
            signal.pthread_kill(threading.main_thread().ident, signum)


def _forget_resender() -> None:
    """In a forked child: the parent's thread is not there, nor is its queue to be shared."""
    global _again, _resender
    _again, _resender = queue.SimpleQueue(), None


os.register_at_fork(after_in_child=_forget_resender)


def send_again(signum: int) -> None:
    """Send ``signum`` to the main thread :data:`RETRY_S` from now, from a thread of its own: its
    handler then runs where the main thread is by then. To the main thread itself, so that a
    wait there (a lock, a future) is interrupted as a terminal's Ctrl-C interrupts it. Never
    waits, but the first time, as that thread starts (a stop that comes meanwhile is queued)."""
    global _resender
    _again.put(signum)
    if _resender is None:
        _resender = threading.Thread(target=_resend, args=(_again,), daemon=True,
                                     name="harmony-stop-again")
        _resender.start()


def raise_stop(signum: int, frame) -> None:
    """The handler of the stopping signals: raises :func:`stop_exception`, or, inside an import
    (:func:`importing`, or the import lock held), sends the signal again :data:`RETRY_S` later,
    for up to :data:`MAX_WAIT_S`."""
    global _waiting
    # the global import lock held counts as an import: a stop taken as a module lock's weakref
    # callback held it (a finalizer, its frame not always on the stack the handler is given)
    # still left it held in 1-4 of 300 stops, silently (Python ignores what a finalizer
    # raises), 2026-12-07
    if _imp.lock_held() or importing(frame):
        now = time.monotonic()
        if _waiting is None or now - _waiting[1] > 1.0:
            _waiting = (now, now)
        if now - _waiting[0] < MAX_WAIT_S:
            _waiting = (_waiting[0], now)
            send_again(signum)
            return
    _waiting = None
    raise _counted(signum)


def _counted(signum: int) -> BaseException:
    """:func:`stop_exception` for ``signum``, to be raised, counted by :func:`raised` (a stop
    raised by :class:`held` too: one an extension swallows there is found again)."""
    global _raised
    _raised = (_raised[0] + 1, signum)
    return stop_exception(signum)


def raised() -> int:
    """How many stops :func:`raise_stop` and :class:`held` have raised in this process so far:
    the ``since`` of :func:`swallowed`."""
    return _raised[0]


def swallowed(exc: BaseException, since: int) -> BaseException | None:
    """The stop the error ``exc`` stands for, raised from it, or None: an error that is not a
    stop, nor raised while one was handled (:func:`~harmony.core.errors.stop_behind` finds
    that one), after a stop was raised (:func:`raised` past ``since``). An extension's C code
    that calls Python can catch the stop raised there and raise an error of its own, with no
    context: matplotlib's ``convert_trans_affine`` turns it into "ValueError: Invalid affine
    transformation matrix", and a `harmony run` stopped by Ctrl-C 4.2 s in, drawing its
    figures, said its experiment "cannot analyse this capture" and exited 1 (CI, 2026-12-07).
    A stop the code caught and went on after (none of Harmony's does) would make a later error
    a stop too: the user did ask to stop."""
    count, signum = _raised
    if count <= since or signum is None or stop_behind(exc) is not None \
            or not isinstance(exc, Exception):
        return None
    stop = stop_exception(signum)
    stop.__cause__ = exc
    return stop


def behind(exc: BaseException, since: int) -> BaseException | None:
    """The stop the error ``exc`` stands for, or None: the one it was raised while handling
    (:func:`~harmony.core.errors.stop_behind`: a Ctrl-C's cleanup that failed), or one an
    extension swallowed (:func:`swallowed`) after ``since``. Where an error is recorded and the
    work goes on (a suite's configuration, a matrix's cell), such an error stops it."""
    return stop_behind(exc) or swallowed(exc, since)


class held:
    """A block a stop (Ctrl-C, SIGTERM, SIGHUP) does not cut short, for cleanup that must finish
    (the host put back, a run's manifest written: a Ctrl-C 3.3 s into a 2 s run, as it stopped
    its probes, left its manifest saying "running", 2026-12-07). The first stop that comes in it
    is raised as the block ends, unless the block ends by an exception (that one goes on); a
    second is raised at once, where it comes: a cleanup that hangs can still be stopped. Only in
    the main thread, for the signals that have a Python handler; elsewhere a plain block."""

    def __enter__(self):
        self.got, self.old = None, {}
        if threading.current_thread() is threading.main_thread():
            for s in STOP_SIGNALS:
                handler = signal.getsignal(s)
                if callable(handler):
                    self.old[s] = handler
                    signal.signal(s, self._hold)
        return self

    def _hold(self, signum: int, frame) -> None:
        if self.got is None:
            self.got = signum
            return
        self._restore()
        raise _counted(signum)

    def _restore(self) -> None:
        for s, handler in self.old.items():
            signal.signal(s, handler)
        self.old = {}

    def __exit__(self, exc_type, exc, tb) -> bool:
        self._restore()
        if self.got is not None and exc_type is None:
            raise _counted(self.got)
        return False


def guard_imports() -> None:
    """:func:`raise_stop` in place of Python's own SIGINT handler, if that one is in place (an
    ignored SIGINT, a shell's background job's, stays ignored), and :func:`never_swallowed`.
    SIGTERM and SIGHUP keep their default meanwhile: the process ends, nothing has started.
    Imported by a program (tests, a notebook), the handler behaves as Python's, but for the
    imports it waits for."""
    never_swallowed()
    if threading.current_thread() is threading.main_thread() \
            and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, raise_stop)


def handle_stops(signals=STOP_SIGNALS) -> None:
    """:func:`raise_stop` for each of ``signals`` this process does not ignore."""
    for sig in signals:
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, raise_stop)


def release_leaked_import_lock() -> int:
    """Release the import lock the calling thread holds where nothing of importlib runs on its
    stack, which only an exception raised between its acquisition and its ``try`` leaves so;
    returns how many times it was held (0: it was not). Where importlib's frames are on the
    stack they may hold it rightly: nothing is released."""
    import _imp

    if importing(sys._getframe(1)):
        return 0
    held = 0
    while True:
        try:
            _imp.release_lock()
        except RuntimeError:        # not held by this thread (any more)
            return held
        held += 1


def never_swallowed() -> None:
    """A ``KeyboardInterrupt`` or :class:`Interrupted` raised while Python runs a finalizer (a
    weakref callback, a ``__del__``: matplotlib's run as a figure is drawn) cannot leave it:
    Python prints "Exception ignored in ..." with a traceback and goes on, and the command
    would run on as if never stopped. Such a stop is sent again (``sys.unraisablehook``)
    :data:`RETRY_S` later, to be raised where the command is by then: not in the hook, where
    it would be ignored again."""
    previous = sys.unraisablehook
    if getattr(previous, "sends_stops_again", False):
        return

    def hook(unraisable):
        exc = unraisable.exc_value
        if isinstance(exc, KeyboardInterrupt):
            send_again(signal.SIGINT)
        elif isinstance(exc, Interrupted):
            send_again(exc.signal)
        else:
            previous(unraisable)

    hook.sends_stops_again = True
    sys.unraisablehook = hook
