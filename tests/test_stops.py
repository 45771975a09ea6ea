"""A stop (Ctrl-C, SIGTERM) never leaves importlib's locks held (harmony.core.stops).

A CI run stopped by Ctrl-C 0.3 s after its start went on, took its capture and hung in its
analysis: the Ctrl-C, raised between importlib's ``_imp.acquire_lock()`` and the ``try`` that
releases it, had left the global import lock held by the main thread, and the side thread's
first import waited on it for ever (2026-12-06)."""

from __future__ import annotations

import contextlib
import dis
import json
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import harmony

from harmony.core import stops
from harmony.core.errors import Interrupted

from cli_run import HARMONY
from conftest import sigint_as_a_terminal
from test_import_export import known_capture, write_dir

HARMONY_DIR = Path(harmony.__file__).parent
NOP = dis.opmap["NOP"]

#: a child that takes module locks in a loop while a timer signals it every 0.5 ms, catches
#: each stop its handler raises and counts those that left the import lock held (released then).
#: Only while it takes them: a signal between the catch and the next try, raised there, ended
#: the child (1 run in 3 of the hermetic suite); the flag is set and cleared where Python runs
#: no handler (no call between the try, or the except, and the assignment).
LOCKS_UNDER_SIGNALS = textwrap.dedent("""
    import _imp, signal, sys
    import importlib._bootstrap as bootstrap

    def plain(signum, frame):           # as Python's own SIGINT handler does
        raise KeyboardInterrupt

    if sys.argv[1] == "harmony":
        from harmony.core.stops import raise_stop as handler
    else:
        handler = plain
    measuring = False

    def only_measuring(signum, frame):
        if measuring:
            handler(signum, frame)

    signal.signal(signal.SIGALRM, only_measuring)
    sys.unraisablehook = lambda u: None     # one raised in a finalizer: counted by its lock
    signal.setitimer(signal.ITIMER_REAL, 0.0005, 0.0005)
    raised = leaks = 0
    while raised < int(sys.argv[2]):
        try:
            measuring = True
            while True:
                bootstrap._get_module_lock("hmy_never_imported")   # dropped: its callback runs
        except BaseException:
            measuring = False
            raised += 1
            while True:
                try:
                    _imp.release_lock()
                    leaks += 1
                except RuntimeError:    # not held by this thread
                    break
    signal.setitimer(signal.ITIMER_REAL, 0)
    print(raised, leaks)
""")


def _locks_under_signals(handler: str, stops_wanted: int = 300) -> tuple[int, int]:
    p = subprocess.run([sys.executable, "-c", LOCKS_UNDER_SIGNALS, handler, str(stops_wanted)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    raised, leaks = map(int, p.stdout.split())
    return raised, leaks


def test_a_stop_never_leaves_the_import_lock_held():
    """Signals every 0.5 ms into a loop that takes and drops module locks: raised by a plain
    handler, stops leave the import lock held (16 % of them here); by Harmony's, none does,
    and every signal still stops the loop."""
    raised, leaks = _locks_under_signals("plain")
    assert raised == 300 and leaks > 0, "the loop no longer shows the leak: the test is blind"
    raised, leaks = _locks_under_signals("harmony")
    assert (raised, leaks) == (300, 0)


def _sent_again(frame) -> list[int]:
    """The handler called for SIGUSR1 in ``frame``, which must raise nothing: the signals this
    process then received (within 5 s), a recorder its handler meanwhile."""
    got: list[int] = []
    old = signal.signal(signal.SIGUSR1, lambda s, f: got.append(s))
    try:
        stops.raise_stop(signal.SIGUSR1, frame)         # deferred: nothing raised
        deadline = time.monotonic() + 5
        while not got and time.monotonic() < deadline:
            time.sleep(0.001)
    finally:
        signal.signal(signal.SIGUSR1, old)
    return got


def _importlib_frame():
    """A frame of importlib's own code (a meta path finder's caller)."""
    seen = []

    class Finder:   # a meta path finder: runs inside importlib's frames
        def find_spec(self, name, path=None, target=None):
            if name == "hmy_never_found":
                seen.append(sys._getframe(1))
            return None

    sys.meta_path.insert(0, Finder())
    try:
        with pytest.raises(ModuleNotFoundError):
            __import__("hmy_never_found")
    finally:
        sys.meta_path.pop(0)
    return seen[0]


def test_a_stop_in_importlib_is_raised_once_out_of_it(monkeypatch):
    """The handler called with importlib's frame raises nothing, and sends the signal again to
    the main thread, to be raised where that thread is next; with any other frame it raises
    what the signal means."""
    frame = _importlib_frame()
    assert stops.in_import_machinery(frame)
    monkeypatch.setattr(stops, "_waiting", None)    # put back as it was, whatever this leaves
    assert _sent_again(frame) == [signal.SIGUSR1]
    # an import that has not ended MAX_WAIT_S after the stop came is stuck: stopped there
    now = time.monotonic()
    monkeypatch.setattr(stops, "_waiting", (now - stops.MAX_WAIT_S, now - stops.RETRY_S))
    with pytest.raises(KeyboardInterrupt):
        stops.raise_stop(signal.SIGINT, frame)
    assert stops._waiting is None
    # a chain that ended elsewhere long ago: the next stop waits afresh
    monkeypatch.setattr(stops, "_waiting", (now - 60, now - 50))
    assert _sent_again(frame) == [signal.SIGUSR1]
    assert stops._waiting[0] > now
    monkeypatch.setattr(stops, "_waiting", None)
    with pytest.raises(KeyboardInterrupt):
        stops.raise_stop(signal.SIGINT, sys._getframe())
    with pytest.raises(Interrupted, match="stopped by SIGTERM"):
        stops.raise_stop(signal.SIGTERM, sys._getframe())


def test_a_deferred_stop_starts_no_thread_of_its_own(monkeypatch):
    """A stop deferred out of an import returns without waiting: 100 in a row start one thread
    at most (the first deferral of the process), where a timer thread each waited to start and
    let the next signal nest a handler in the handler (a RecursionError raised in an import on
    a busy host, the import lock left held); all are sent again, together."""
    frame = _importlib_frame()
    started = []
    real_start = threading.Thread.start

    def start(self):
        started.append(self.name)
        real_start(self)
    monkeypatch.setattr(threading.Thread, "start", start)
    monkeypatch.setattr(stops, "_waiting", None)
    got: list[int] = []     # SIGWINCH: ignored by default, should one be sent after the test
    old = signal.signal(signal.SIGWINCH, lambda s, f: got.append(s))
    try:
        for _ in range(100):
            stops.raise_stop(signal.SIGWINCH, frame)         # deferred: nothing raised
        assert len(started) <= 1, started
        deadline = time.monotonic() + 5
        while not got and time.monotonic() < deadline:
            time.sleep(0.001)
    finally:
        signal.signal(signal.SIGWINCH, old)
        monkeypatch.setattr(stops, "_waiting", None)
    assert got and set(got) == {signal.SIGWINCH}


LEAKED_BEFORE_THE_COMMAND = textwrap.dedent("""
    import _imp, sys, threading
    _imp.acquire_lock()     # as a Ctrl-C swallowed in importlib's finalizer leaves it
    sys.argv = ["harmony", "list"]
    from harmony.cli import entry
    entry()
""")


def test_an_import_lock_left_held_as_the_command_starts_is_a_ctrl_c():
    """Held by the main thread before the command's handlers were set, the import lock can only
    have been left by a Ctrl-C Python's own handler raised in a finalizer (and printed, then
    ignored): the command stops as interrupted (130), and other threads can import again."""
    p = subprocess.run([sys.executable, "-c", LEAKED_BEFORE_THE_COMMAND], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 130 and p.stderr.strip() == "harmony: error: interrupted", p.stderr
    assert p.stdout == ""


#: the line of harmony/cli/__init__.py that puts Harmony's handler in place of Python's
GUARD_LINE = next(i for i, line in enumerate(
    (HARMONY_DIR / "cli" / "__init__.py").read_text().splitlines(), 1)
    if line.startswith("stops.guard_imports()"))


def _before_the_guard(err: str) -> bool:
    """Whether ``err`` is Python's own traceback of a Ctrl-C that came before the command put its
    handler in place: raised by Python's handler (no frame of Harmony's handlers), with
    Python's start-up's frames only, and Harmony's modules' top levels that run before the
    handler is set (harmony/cli/__init__.py's up to that line)."""
    if not err.rstrip().endswith("KeyboardInterrupt"):
        return False
    for file, line, where in re.findall(r'File "([^"]+)", line (\d+), in (\S+)', err):
        if file.startswith("<frozen") or not Path(file).is_relative_to(HARMONY_DIR):
            continue
        if where != "<module>" or (Path(file) == HARMONY_DIR / "cli" / "__init__.py"
                                   and int(line) >= GUARD_LINE):
            return False
    return True


def test_ctrl_c_at_any_moment_of_an_import_ends_it_interrupted_or_done(tmp_path):
    """Ctrl-C sent from 0.15 to 1.15 s into ``harmony import``, its start-up's imports and its
    analysis on two threads: each ends, done (0) or interrupted (130, its run marked so), never
    hangs, never a traceback. (Sent sooner, it can come before the command's first module, in
    Python's own start-up, ~0.03-0.05 s here: Python's traceback then, which nothing of the
    command's can prevent. On a busy host that start-up took more than 0.15 s (CI, 2026-12-07):
    such a stop, before the command's handler was set, is let pass.)"""
    from harmony.probes.tracedat_write import write_tracedat

    pages, _, _ = known_capture()
    dat = write_tracedat(write_dir(tmp_path / "raw", pages), tmp_path / "trace.dat")
    seen = []
    for k, at in enumerate(0.15 + 0.1 * i for i in range(11)):
        out = tmp_path / f"run{k}"
        p = subprocess.Popen(HARMONY + ["import", str(dat), "--comm", "cat-*", "--pid", "11",
                                        "--out", str(out), "-q"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, preexec_fn=sigint_as_a_terminal)
        time.sleep(at)
        p.send_signal(signal.SIGINT)
        try:
            _, err = p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            pytest.fail(f"stopped {at:.2f} s after its start, the import hung")
        seen.append((round(at, 2), p.returncode))
        if _before_the_guard(err):
            continue
        assert "Traceback" not in err and "Exception ignored" not in err, (at, err)
        assert p.returncode in (0, 130), (at, p.returncode, err)
        if p.returncode == 130:
            assert err.strip().endswith("interrupted") or "harmony: error: interrupted" in err
            if out.exists():        # stopped in the analysis: marked so; or after the run was
                # written complete, in the command's last steps (CI saw one 1.05 s in)
                m = json.loads((out / "manifest.json").read_text())
                assert m["status"] == "complete" or (
                    (m["status"], m.get("incomplete_reason"))
                    == ("incomplete", "interrupted (Ctrl-C)")), (at, m["status"])
        else:
            assert json.loads((out / "manifest.json").read_text())["status"] == "complete"
    assert any(code == 130 for _, code in seen), seen


SWALLOWED_IN_AN_OPTIONS_CHECK = textwrap.dedent("""
    import os, signal, sys
    sys.argv = ["harmony", "import", sys.argv[1], "--comm", "cat-*", "--out", sys.argv[2]]
    from harmony.cli import entry
    from harmony import store

    def cannot_write(directory):    # a library that takes the Ctrl-C and says an error instead
        try:
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):
                pass
        except KeyboardInterrupt:
            return "Bad file descriptor"
        return None
    store.cannot_write = cannot_write
    entry()
""")


def test_a_stop_an_options_check_took_is_the_stop(tmp_path):
    """A Ctrl-C that a library turned into an error while --out was checked (CI: "Invalid value
    for --out: ... (Bad file descriptor)", status 2, 0.85 s into an import) ends the command as
    interrupted, status 130, nothing made."""
    from harmony.probes.tracedat_write import write_tracedat

    pages, _, _ = known_capture()
    dat = write_tracedat(write_dir(tmp_path / "raw", pages), tmp_path / "trace.dat")
    out = tmp_path / "run"
    p = subprocess.run([sys.executable, "-c", SWALLOWED_IN_AN_OPTIONS_CHECK, str(dat), str(out)],
                       capture_output=True, text=True, timeout=120,
                       preexec_fn=sigint_as_a_terminal)
    assert (p.returncode, p.stderr) == (130, "harmony: error: interrupted\n")
    assert not out.exists()


def _stop_at_first_write(monkeypatch, name: str) -> None:
    """A Ctrl-C as the file ``name`` is first written (store.write_json), as a stop landing
    just before it would."""
    from harmony import store

    def write_json(path, obj, real=store.write_json):
        if path.name == name and not path.exists():
            raise KeyboardInterrupt
        real(path, obj)
    monkeypatch.setattr(store, "write_json", write_json)


@pytest.mark.parametrize("moment", ["manifest", "copy"])
def test_a_stop_as_an_import_makes_its_run_leaves_none_or_one_marked(tmp_path, monkeypatch,
                                                                    moment):
    """A Ctrl-C as the run directory is made, before its manifest is written (CI saw one, 0.35
    s into an import): no empty directory is left, nor the parent made for it; just after,
    before the analysis began (the trace's copy starting): the run is marked interrupted, not
    left "running"."""
    from harmony import importer
    from harmony.probes.tracedat_write import write_tracedat

    pages, _, _ = known_capture()
    dat = write_tracedat(write_dir(tmp_path / "raw", pages), tmp_path / "trace.dat")
    out = tmp_path / "runs" / "run"        # its parent made with it
    if moment == "manifest":
        _stop_at_first_write(monkeypatch, "manifest.json")
    else:
        def in_background(*args, **kwargs):
            raise KeyboardInterrupt
        monkeypatch.setattr(importer, "in_background", in_background)
    with pytest.raises(KeyboardInterrupt):
        importer.import_trace(dat, out, comms=["cat-*"], pids=[11])
    if moment == "manifest":
        assert not out.parent.exists()
    else:
        m = json.loads((out / "manifest.json").read_text())
        assert (m["status"], m["incomplete_reason"]) == ("incomplete", "interrupted (Ctrl-C)")


class _Reached(Exception):
    """The step after the window the stops are sent in, reached: the attempt ends there."""


def _makes_or_holds(filename: str) -> bool:
    """Whether a stop at a line of ``filename`` can leave something behind: Harmony's modules
    and those of the standard library that make files (tempfile) or end the blocks that hold
    them (contextlib); not the attempt's own lines, nor those that only compute (json's)."""
    return (Path(filename).is_relative_to(HARMONY_DIR) or Path(filename).name in (
        "tempfile.py", "contextlib.py")) and filename != __file__


def _a_stop_at_every_line(attempt):
    """Run ``attempt(k, window)`` twice dry (the first takes every lazy path once), then once
    per line the second ran while ``window[0]`` was True (the attempt sets it), a Ctrl-C sent
    (signal.raise_signal, to the command's handler) as that line first starts: what a Ctrl-C
    between two bytecodes does, at every line of the window. Yields (the line, what the
    attempt ended with: "stopped", "reached" or "returned", k). Only the lines of
    :func:`_makes_or_holds`'s files (all of them, four times as many attempts, took 10 s), and
    not a line that starts with a NOP (a ``try:``): Python never runs a signal's handler there,
    and what the tracer raises there is outside the try (its exception table starts after)."""
    state: dict = {}

    def tracer(frame, event, arg):
        if event == "line" and state["window"][0] and not state["fired"] \
                and _makes_or_holds(frame.f_code.co_filename) \
                and frame.f_code.co_code[frame.f_lasti] != NOP:
            line = (frame.f_code.co_filename, frame.f_lineno)
            if line not in state["seen"]:
                state["seen"].add(line)
                state["trail"].append(line)
                if line == state["target"]:
                    state["fired"] = True
                    signal.raise_signal(signal.SIGINT)
        return tracer

    def once(k, target):
        state.update(seen=set(), trail=[], target=target, fired=False, window=[False])
        old = signal.signal(signal.SIGINT, stops.raise_stop)
        sys.settrace(tracer)
        try:
            attempt(k, state["window"])
            ended = "returned"
        except KeyboardInterrupt:
            ended = "stopped"
        except _Reached:
            ended = "reached"
        finally:
            sys.settrace(None)
            signal.signal(signal.SIGINT, old)
        return ended

    once(0, None)
    once(1, None)
    trail = list(state["trail"])
    assert len(trail) > 20, trail       # the window was traced
    for k, line in enumerate(trail, start=2):
        ended = once(k, line)
        if state["fired"]:
            yield line, ended, k


def _every_stop_leaves_none_or_one_marked(attempt, out_of, first: str, marked: dict) -> None:
    """:func:`_a_stop_at_every_line` of ``attempt``: each stop ends it stopped, leaving no
    directory ``out_of(k)``, or one that holds only ``first`` (its manifest, suite.json...) with
    ``marked``'s values; and more than 20 lines were tried."""
    stopped = 0
    for line, ended, k in _a_stop_at_every_line(attempt):
        out = out_of(k)
        assert ended == "stopped", (line, ended)
        stopped += 1
        if out.exists():
            assert sorted(p.name for p in out.iterdir()) == [first], line
            record = json.loads((out / first).read_text())
            assert {key: record.get(key) for key in marked} == marked, line
    assert stopped > 20


#: what a run stopped as it was made says
INTERRUPTED = {"status": "incomplete", "incomplete_reason": "interrupted (Ctrl-C)"}


def test_a_stop_at_any_line_as_an_import_makes_its_run_leaves_none_or_one_marked(tmp_path,
                                                                              monkeypatch):
    """A Ctrl-C at each line from the manifest's making to the analysis of ``harmony import``:
    no directory is left, or the run with its manifest marked interrupted, never a directory
    without a manifest (CI, 0.45 s into an import, 2026-12-07: a stop just after ``mkdir``)
    nor a manifest left "running" (a stop as the block that wrote it ended)."""
    from harmony import importer
    from harmony.probes.tracedat_write import write_tracedat

    pages, _, _ = known_capture()
    dat = write_tracedat(write_dir(tmp_path / "raw", pages), tmp_path / "trace.dat")
    new_manifest = importer._new_manifest

    def attempt(k, window):
        def made(*args, **kwargs):
            manifest = new_manifest(*args, **kwargs)
            window[0] = True
            return manifest

        def analyse(*args, **kwargs):
            window[0] = False
            raise _Reached
        monkeypatch.setattr(importer, "_new_manifest", made)
        monkeypatch.setattr(importer, "_analyse_copying", analyse)
        importer.import_trace(dat, tmp_path / f"run{k}", comms=["cat-*"], pids=[11],
                              memory_check=False, disk_check=False)

    _every_stop_leaves_none_or_one_marked(attempt, lambda k: tmp_path / f"run{k}",
                                          "manifest.json", INTERRUPTED)


def test_a_stop_at_any_line_as_a_run_opens_leaves_none_or_one_marked(tmp_path):
    """The same, at each line of ``harmony run``'s opening (its directory, the space set aside,
    its manifest): nothing left, or the run marked interrupted with the space given back."""
    from harmony import run as run_mod
    from harmony.experiments import get_experiment

    exp = get_experiment("single-source")

    def attempt(k, window):
        cap = run_mod._Capture(exp, exp.resolve({}, [0]), [0], tmp_path / f"run{k}", "tracefs",
                               0, None, None, None, None, None)
        window[0] = True
        cap.open({}, lock_held=True)
        window[0] = False
        assert cap.manifest is not None
        cap.reserve.release()

    _every_stop_leaves_none_or_one_marked(attempt, lambda k: tmp_path / f"run{k}",
                                          "manifest.json", INTERRUPTED)


def test_a_stop_as_a_run_makes_its_directory_leaves_nothing(tmp_path, monkeypatch):
    """The same moment of ``harmony run`` (its directory and the space set aside made, its
    manifest not yet written): neither is left."""
    from harmony import run as run_mod
    from harmony.experiments import get_experiment

    _stop_at_first_write(monkeypatch, "manifest.json")
    exp = get_experiment("single-source")
    out = tmp_path / "run"
    cap = run_mod._Capture(exp, exp.resolve({}, [0]), [0], out, "tracefs", 0, None, None, None,
                           None, None)
    with pytest.raises(KeyboardInterrupt):
        cap.open({}, lock_held=True)
    assert not out.exists() and cap.reserve is None and cap.manifest is None


def test_a_stop_a_library_turned_into_its_own_error_is_the_stop(capsys):
    """A Ctrl-C raised in an extension's initialisation comes out as its ImportError (pybind11:
    "initialization failed", the Ctrl-C its cause): the command says "interrupted", status 130.
    The same error with no stop behind it is no stop."""
    from harmony.cli.common import exit_on_error

    with pytest.raises(SystemExit) as stopped:
        with exit_on_error(marked="the run is marked incomplete"):
            try:
                raise KeyboardInterrupt
            except KeyboardInterrupt as exc:
                raise ImportError("initialization failed") from exc
    assert stopped.value.code == 130
    assert capsys.readouterr().err == \
        "harmony: error: interrupted; the run is marked incomplete\n"
    with pytest.raises(ImportError, match="initialization failed"):
        with exit_on_error():
            raise ImportError("initialization failed")


class _SignalledMatrix:
    """An affine matrix that sends this process SIGINT as matplotlib's C code converts it: the
    handler (:func:`stops.raise_stop`) raises the Ctrl-C inside that Python call."""

    def __array__(self, dtype=None, copy=None):
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
        return np.eye(3)


@contextlib.contextmanager
def _ctrl_c_raised_by_harmony():
    old = signal.signal(signal.SIGINT, stops.raise_stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


def _transform_with_a_ctrl_c_inside() -> None:
    from matplotlib import _path

    _path.affine_transform(np.zeros((2, 2)), _SignalledMatrix())


def test_a_stop_an_extension_replaced_by_its_own_error_is_the_stop(capsys):
    """matplotlib's C code catches a Ctrl-C raised in a Python call it makes and raises
    "ValueError: Invalid affine transformation matrix" in its place, with no context (CI: a
    `harmony run` stopped as it drew its figures exited 1, "cannot analyse this capture"). An
    error after a stop was raised is the stop; without one it stays the error."""
    from matplotlib import _path

    from harmony.cli.common import exit_on_error

    with _ctrl_c_raised_by_harmony():
        since = stops.raised()
        with pytest.raises(ValueError, match="Invalid affine") as swallowed:
            _transform_with_a_ctrl_c_inside()
        assert swallowed.value.__context__ is None          # no trace of the stop
        stop = stops.swallowed(swallowed.value, since)
        assert isinstance(stop, KeyboardInterrupt) and stop.__cause__ is swallowed.value
        assert stops.swallowed(swallowed.value, stops.raised()) is None     # an older stop
        with pytest.raises(SystemExit) as ended:
            with exit_on_error(marked="the run is marked incomplete"):
                _transform_with_a_ctrl_c_inside()
        assert ended.value.code == 130
        assert capsys.readouterr().err == \
            "harmony: error: interrupted; the run is marked incomplete\n"
        # the same error, no stop raised in the block: the error
        with pytest.raises(ValueError, match="Invalid affine"):
            with exit_on_error():
                _path.affine_transform(np.zeros((2, 2)), "not a matrix")


def test_a_second_stop_in_a_held_block_an_extension_took_is_the_stop():
    """In a :class:`stops.held` block the first stop waits for its end and a second is raised
    where it comes: by the block's own handler, inside matplotlib's call there, and swallowed.
    It counts as a stop raised all the same: the error the block ends with stands for it."""
    with _ctrl_c_raised_by_harmony():
        since = stops.raised()
        with pytest.raises(ValueError, match="Invalid affine") as swallowed:
            with stops.held() as block:
                signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
                assert block.got == signal.SIGINT                   # the first: held
                _transform_with_a_ctrl_c_inside()                   # the second: taken
        assert isinstance(stops.swallowed(swallowed.value, since), KeyboardInterrupt)


def test_a_stop_as_the_figures_are_drawn_marks_the_run_interrupted(tmp_path, monkeypatch):
    """The same stop as an import draws its figures: the run is marked interrupted and the stop
    goes on, not "experiment cannot analyse" (a RunError)."""
    from harmony import importer, pipeline
    from harmony.probes.tracedat_write import write_tracedat

    pages, _, _ = known_capture()
    dat = write_tracedat(write_dir(tmp_path / "raw", pages), tmp_path / "trace.dat")

    def draw(run):
        _transform_with_a_ctrl_c_inside()
    monkeypatch.setattr(pipeline, "_draw", draw)
    out = tmp_path / "run"
    with _ctrl_c_raised_by_harmony(), pytest.raises(KeyboardInterrupt):
        importer.import_trace(dat, out, comms=["cat-*"], pids=[11], memory_check=False,
                              disk_check=False)
    m = json.loads((out / "manifest.json").read_text())
    assert {k: m.get(k) for k in INTERRUPTED} == INTERRUPTED


@pytest.mark.parametrize("where", ["suite", "matrix"])
def test_a_stop_an_extension_took_stops_a_suite_or_a_matrix(tmp_path, monkeypatch, where):
    """A suite records a configuration's error and goes on, a matrix a cell's: the error that
    stands for a stop (an extension's, with no trace of it) stops them, marked interrupted."""
    from harmony import batch, matrix
    from harmony.runners import SimRunner
    from harmony.suite import plan, run_suite

    from test_matrix import plan_file

    def ctrl_c_taken(*args, **kwargs):
        _transform_with_a_ctrl_c_inside()
    monkeypatch.setattr(batch, "run_batch", ctrl_c_taken)
    monkeypatch.setattr(matrix, "_local_cell", ctrl_c_taken)
    out = tmp_path / where
    with _ctrl_c_raised_by_harmony(), pytest.raises(KeyboardInterrupt):
        if where == "suite":
            run_suite(plan([0, 1], quick=True, experiments=["single-source"]), [0, 1], out,
                      SimRunner("poly-balance"), quiet=True)
        else:
            matrix.run_local(matrix.load_plan(plan_file(tmp_path)), out, quiet=True)
    record = json.loads((out / f"{where}.json").read_text())
    assert record["status"] == ("incomplete" if where == "suite" else "interrupted"), record
    assert not record.get("failures"), record


def test_a_stop_at_any_line_as_a_suite_starts_leaves_none_or_one_marked(tmp_path, monkeypatch):
    """The same, at each line of ``harmony suite``'s start, up to its runner's: nothing left, or
    suite.json marked interrupted (a stop as the block that wrote it ended left it "running")."""
    from harmony.runners import SimRunner
    from harmony.suite import plan, run_suite

    configs = plan([0, 1], quick=True, experiments=["single-source"])

    def attempt(k, window):
        def enter(self):
            window[0] = False
            raise _Reached
        monkeypatch.setattr(SimRunner, "__enter__", enter)
        window[0] = True
        run_suite(configs, [0, 1], tmp_path / f"s{k}", SimRunner("poly-balance"), quiet=True)

    _every_stop_leaves_none_or_one_marked(attempt, lambda k: tmp_path / f"s{k}", "suite.json",
                                          INTERRUPTED)


def test_a_stop_at_any_line_as_a_matrix_starts_leaves_none_or_one_marked(tmp_path,
                                                                         monkeypatch):
    """The same, at each line of ``harmony matrix``'s start here, up to its first cell: nothing
    left, or matrix.json marked interrupted."""
    from harmony import matrix

    from test_matrix import plan_file

    plan = matrix.load_plan(plan_file(tmp_path))

    def attempt(k, window):
        def first_cell(out, cell):
            window[0] = False
            raise _Reached
        monkeypatch.setattr(matrix, "_local_cell", first_cell)
        window[0] = True
        matrix.run_local(plan, tmp_path / f"m{k}", quiet=True)

    _every_stop_leaves_none_or_one_marked(attempt, lambda k: tmp_path / f"m{k}", "matrix.json",
                                          {"status": "interrupted"})


@pytest.mark.parametrize("moment", ["suite.json", "first capture"])
def test_a_stop_as_a_suite_starts_leaves_no_empty_directory(tmp_path, monkeypatch, moment):
    """A Ctrl-C as ``harmony suite`` makes its directory, before suite.json is written: no
    directory is left; in its first capture, before the run's directory is made: the suite is
    there, marked interrupted, with no empty batch directory in it."""
    from harmony.runners import SimRunner
    from harmony.suite import plan, run_suite

    if moment == "suite.json":
        _stop_at_first_write(monkeypatch, "suite.json")
    else:
        def capture(self, *args, **kwargs):
            raise KeyboardInterrupt
        monkeypatch.setattr(SimRunner, "capture", capture)
    out = tmp_path / "s"
    with pytest.raises(KeyboardInterrupt):
        run_suite(plan([0, 1], quick=True, experiments=["single-source"]), [0, 1], out,
                  SimRunner("poly-balance"), quiet=True)
    if moment == "suite.json":
        assert not out.exists()
    else:
        assert sorted(p.name for p in out.iterdir()) == ["suite.json"]
        record = json.loads((out / "suite.json").read_text())
        assert (record["status"], record["incomplete_reason"]) == ("incomplete",
                                                                   "interrupted (Ctrl-C)")
        from harmony.analysis import report_suite
        md, _ = report_suite.write(out)
        assert "**the suite did not finish** (incomplete: interrupted (Ctrl-C))" in md.read_text()


def test_a_held_block_finishes_then_raises_the_stop_and_a_second_stop_at_once():
    """stops.held: a Ctrl-C inside waits for the block's end; a second one is raised where it
    comes; an error of the block goes on instead of the held stop; the handlers are put back."""
    import os

    def ctrl_c():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)        # delivered: Python runs the handler between two bytecodes

    before = signal.getsignal(signal.SIGINT)
    done = []
    with pytest.raises(KeyboardInterrupt):
        with stops.held():
            ctrl_c()
            done.append("after the stop")
    assert done == ["after the stop"] and signal.getsignal(signal.SIGINT) is before
    with pytest.raises(KeyboardInterrupt):
        with stops.held():
            ctrl_c()
            ctrl_c()
            done.append("never")
    assert done == ["after the stop"] and signal.getsignal(signal.SIGINT) is before
    with pytest.raises(ValueError):
        with stops.held():
            ctrl_c()
            raise ValueError("the block's own error")
    assert signal.getsignal(signal.SIGINT) is before


def test_a_stop_as_a_run_cleans_up_still_writes_its_manifest(tmp_path):
    """A Ctrl-C that lands as a run stops its probes (CI: 3.3 s into a 2 s run) cut the cleanup
    short before the manifest was written: it said "running" for ever. The cleanup finishes,
    the manifest is written, then the stop is raised."""
    import os

    from harmony import run as run_mod
    from harmony.experiments import get_experiment

    class Probe:
        stopped = False

        def stop(self):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            Probe.stopped = True

    exp = get_experiment("single-source")
    out = tmp_path / "run"
    cap = run_mod._Capture(exp, exp.resolve({}, [0]), [0], out, "tracefs", 0, None, None, None,
                           None, None)
    cap.open({}, lock_held=True)
    cap.probe = Probe()
    cap.manifest["status"] = "captured"     # as finish() leaves it
    with pytest.raises(KeyboardInterrupt):
        cap.close()
    m = json.loads((out / "manifest.json").read_text())
    assert Probe.stopped and m["status"] == "captured" and m["ended_at"]
