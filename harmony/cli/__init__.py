"""The ``harmony`` command: a thin layer over the library, one module per group of commands.

- :mod:`harmony.cli.measure`: ``run``, ``suite``, ``list``;
- :mod:`harmony.cli.results`: ``report``, ``infer``, ``compare``, ``simulate``;
- :mod:`harmony.cli.traces`: ``import``, ``export``;
- :mod:`harmony.cli.kernels`: ``kernel list|build|fetch``, ``scx list|build``;
- :mod:`harmony.cli.host`: ``doctor``, ``clean``;
- :mod:`harmony.cli.matrix`: ``matrix``, ``worker`` (a matrix of cells, on a Dask cluster);
- :mod:`harmony.cli.common`: what they share (one-line errors, exit statuses, common options).

Exit statuses (:data:`~harmony.cli.common.EXIT_STATUSES`, printed by ``harmony --help``;
:func:`~harmony.cli.common.exit_status` is the one place that maps errors to them): 0 success; 1
the input or the host was not usable (a run, batch, suite or trace missing, corrupt or
incomplete; the host refused); 2 usage (nothing was started); 130 interrupted by Ctrl-C; 128 +
the signal's number when stopped by SIGTERM (143) or SIGHUP (129).

Why the commands import inside their functions: a command loads what it uses when it runs, and
nothing else. ``harmony --help``, ``harmony clean`` or a usage error must not pay for numpy,
pandas, numba and matplotlib (0.3-0.7 s here), and the modules a command does not use are not
loaded into the process that forks the workers. Modules of the standard library, click and
Harmony's light leaves (harmony.core) are imported at the top.
"""

# ruff: noqa: E402 (a hook is set between the imports, see below)

from __future__ import annotations

import sys

from harmony.core import stops

# a Ctrl-C from here on waits for the command's imports to end (0.1 s and more of every start),
# and is never ignored (harmony.core.stops)
stops.guard_imports()

import click

from harmony.cli import host, kernels, matrix, measure, results, traces
from harmony.cli.common import EXIT_STATUSES, colour_off, echo, error_line, exit_status
from harmony.core.errors import Interrupted
from harmony.core.version import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]},
             epilog=EXIT_STATUSES + " Colour on a terminal only, never with NO_COLOR set. "
                    "The same option means the same thing in every command: docs/cli.md.")
@click.version_option(__version__, prog_name="harmony")
@click.pass_context
def main(ctx):
    """Harmony: extract the actual CPU load-balancing policy of the running Linux scheduler by
    experiment."""
    from harmony.core.memory import tune_allocations

    if colour_off():
        ctx.color = False

    # decoders and analyses fill and free many large arrays: see harmony.core.memory
    tune_allocations()


for command in (host.doctor, measure.list_experiments, measure.run, measure.suite, results.report,
                host.clean, traces.export, traces.import_, results.infer, results.compare,
                results.simulate, kernels.kernel, kernels.scx_group, matrix.matrix,
                matrix.worker):
    main.add_command(command)


def signals_do_not_interrupt_the_teardown() -> None:
    """The command is over and its outcome decided (a run written complete stays complete): a
    Ctrl-C, SIGTERM or SIGHUP while the process tears down (the fork server stopped, threads
    joined) is not raised into the middle of it, where it would print a traceback and leave the
    server to its death signal. A second one ends the process at once (status 128 + its number),
    for a teardown that hangs."""
    import os
    import signal

    from harmony.core.osutil import STOP_SIGNALS

    seen: list[int] = []

    def later(signum, frame):
        if seen:
            os._exit(128 + signum)
        seen.append(signum)

    for sig in STOP_SIGNALS:
        signal.signal(sig, later)


def help_of(ctx) -> str:
    """``harmony CMD --help`` for the command whose usage error ``ctx`` is, however harmony was
    started (``python -m harmony.cli`` too)."""
    names = []
    while ctx is not None and ctx.parent is not None:
        names.append(ctx.info_name)
        ctx = ctx.parent
    return " ".join(["harmony", *reversed(names), "--help"])


def naming_help(msg: str, help_line: str) -> str:
    """A usage error's line, ``(harmony CMD --help)`` at its end. A message that lists its
    problems under a first line (a matrix plan's bad cells, one a line) names the help on that
    first line, not after the last problem."""
    first, nl, rest = msg.partition("\n")
    if not nl:
        return f"{msg} ({help_line})"
    return (f"{first.removesuffix(':')} ({help_line})" + (":" if first.endswith(":") else "")
            + nl + rest)


def _stopped(exc: BaseException) -> int:
    """The line and status of a command stopped by ``exc`` (Ctrl-C, click's Abort, SIGTERM)."""
    stop = exc if isinstance(exc, Interrupted) else KeyboardInterrupt()
    stops.release_leaked_import_lock()  # the teardown's threads may import
    error_line("interrupted" if isinstance(stop, KeyboardInterrupt) else str(stop))
    return exit_status(stop)


def entry() -> None:
    """The console script: :func:`main`, then a quick exit. Tearing the interpreter down frees a
    suite's few hundred MB of Python objects one by one (0.3-0.5 s measured); the kernel frees
    the process's memory at once. What an orderly exit does first still happens: non-daemon
    threads are joined, atexit handlers run (the fork server's shutdown, temporary files), the
    output is flushed."""
    import atexit
    import os
    import threading

    since = stops.raised()
    try:
        stops.handle_stops()   # anywhere a command has not put a handler of its own
        if stops.release_leaked_import_lock():
            # left held by a Ctrl-C that Python's own handler raised in a finalizer of importlib's
            # before the command's were set (Python printed it, "Exception ignored"): the only
            # exception a signal raised there, and other threads' imports would wait for ever
            raise KeyboardInterrupt
        code = main(standalone_mode=False)      # click's own errors are shown below
        code = code if isinstance(code, int) else 0
    except SystemExit as exc:
        code = exc.code
    except click.ClickException as exc:
        if (stop := stops.behind(exc, since)) is not None:
            # a stop a library turned into an error that a check of the options then said: a
            # Ctrl-C 0.85 s into `harmony import`, as --out's check made and removed a
            # temporary directory, came out as "--out: cannot write (Bad file descriptor)", a
            # usage error, status 2 (CI, 2026-12-07; most likely shutil.rmtree closing its
            # directory's fd again after the stop cut its first close's bookkeeping)
            code = _stopped(stop)
        elif isinstance(exc, click.UsageError):         # a usage error: one line, status 2
            error_line(naming_help(exc.format_message(), help_of(exc.ctx)))
            code = exc.exit_code
        else:
            exc.show()
            code = exc.exit_code
    except (click.exceptions.Abort, KeyboardInterrupt, Interrupted) as exc:
        # Ctrl-C or SIGTERM where no command caught it (starting up, reading the host...)
        code = _stopped(exc)
    if code is None:
        code = 0
    elif not isinstance(code, int):
        echo(str(code), err=True)
        code = 1
    signals_do_not_interrupt_the_teardown()
    from harmony.core import jit
    jit.shutdown_pool()
    for t in threading.enumerate():
        # not a thread whose start a Ctrl-C interrupted (enumerated, never run: join raises)
        if t is not threading.current_thread() and not t.daemon and t.is_alive():
            t.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass   # a closed pipe (harmony ... | head): nothing more can be said
    os._exit(code)
