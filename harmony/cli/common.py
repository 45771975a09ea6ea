"""What every command shares: the exit-status contract, one-line errors, colour, checks of common
options.

The contract (:data:`EXIT_STATUSES`, printed by ``harmony --help``): 0 success; 1 the input or the
host was not usable (a run, batch or suite directory or a trace missing, corrupt or incomplete;
the host refused: not root, busy, a probe that cannot record); 2 usage (an option or argument
not acceptable, nothing was started); 130 interrupted by Ctrl-C (128 + the signal's number for
SIGTERM, 143, and SIGHUP, 129). :func:`exit_status` is the one place that maps an error to its
status.

A command never prints a traceback for what Harmony raises on purpose: :func:`exit_on_error` turns
it into one line (``harmony: error: ...``). The same problem is worded the same way by every
command because the wording is the library's (:mod:`harmony.store`: a missing directory, a
corrupt JSON file, an incomplete run), never the command's.

Colour: :func:`style` marks answers, warnings and errors; click drops it when the output is not
a terminal, and :func:`colour_off` (``NO_COLOR`` set) drops it everywhere.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import sys
from pathlib import Path

import click

from harmony.core import osutil, stops
from harmony.core.errors import HarmonyError, IncompleteRun, Interrupted, ParameterError
from harmony.core.wording import plural  # the commands import it from here

#: the exit statuses of every command (harmony --help prints this; docs/cli.md explains it)
EXIT_STATUSES = (
    "Exit status of every command: 0 success; 1 the input or the host was not usable (a run, "
    "batch, suite or trace missing, corrupt or incomplete; the host refused); 2 usage (an "
    "option or argument not acceptable: nothing was started); 130 interrupted by Ctrl-C (143 "
    "by SIGTERM, 129 by SIGHUP).")

#: the statuses by name, as EXIT_STATUSES says them
OK, UNUSABLE, USAGE, INTERRUPTED = 0, 1, 2, 130


def exit_status(exc: BaseException) -> int:
    """The exit status of a command that stopped on ``exc`` (see :data:`EXIT_STATUSES`)."""
    if isinstance(exc, KeyboardInterrupt):
        return INTERRUPTED
    if isinstance(exc, Interrupted):
        return 128 + exc.signal
    if isinstance(exc, (click.UsageError, ParameterError)):
        return USAGE
    return UNUSABLE


def colour_off() -> bool:
    """Whether colour is off whatever the terminal: ``NO_COLOR`` set to anything (no-color.org)."""
    return bool(os.environ.get("NO_COLOR"))


#: how each kind of text is marked on a terminal
STYLES = {"error": {"fg": "red", "bold": True}, "warning": {"fg": "yellow", "bold": True},
          "answer": {"bold": True}, "ok": {"fg": "green"}, "heading": {"bold": True},
          "dim": {"dim": True}}


def style(text: str, kind: str) -> str:
    """``text`` marked as ``kind`` (:data:`STYLES`) for a terminal; click.echo drops the marks
    where the output is not one."""
    return text if colour_off() else click.style(text, **STYLES[kind])


def echo(text: str = "", err: bool = False) -> None:
    """click.echo, coloured only on a terminal and without NO_COLOR."""
    click.echo(text, err=err, color=False if colour_off() else None)


def clear_status_line() -> None:
    """Take a progress line off the terminal (stderr) before a message takes its place."""
    if sys.stderr.isatty():
        sys.stderr.write("\r\033[K")
        sys.stderr.flush()


def error_line(msg: str) -> None:
    """``harmony: error: MSG`` on stderr, after any progress line is cleared."""
    clear_status_line()
    echo(f"harmony: {style('error:', 'error')} {msg}", err=True)


def warn(msg: str) -> None:
    """``warning: MSG`` on stderr: something the user must not miss, which did not stop the
    command."""
    echo(f"{style('warning:', 'warning')} {msg}", err=True)


def note(msg: str) -> None:
    """``note: MSG`` on stderr: a fact about what the command did; not with ``-q``
    (:func:`quiet_option`)."""
    if not quiet():
        echo(f"note: {msg}", err=True)


#: what ``-q`` means in every command that takes it (:func:`quiet_option`)
QUIET_HELP = "quiet: no progress or notes on standard error, only warnings and errors"


def quiet() -> bool:
    """Whether the command running was given ``-q`` (:func:`quiet_option`)."""
    ctx = click.get_current_context(silent=True)
    return bool(ctx and ctx.meta.get("harmony.quiet"))


def quiet_option(f):
    """``-q``/``--quiet``, the same in every command (:data:`QUIET_HELP`): the command gets it as
    ``quiet`` for its progress display, and :func:`note` says nothing while it is set."""
    def remember(ctx, param, value):
        if value:
            ctx.meta["harmony.quiet"] = True
        return value

    return click.option("--quiet", "-q", is_flag=True, callback=remember, help=QUIET_HELP)(f)


def json_option(what: str, as_report: bool = False):
    """``--json``, the same in every command that takes it: print ``what`` (the result a program
    wants) as JSON on standard output instead of the screen (``as_report``: what ``harmony report
    --json`` prints of the same result); the command gets it as ``as_json``."""
    said = ", as `harmony report --json OUT` does" if as_report else ""
    return click.option("--json", "as_json", is_flag=True, help=f"print {what} as JSON{said}")


def fail(msg: str, code: int = UNUSABLE):
    error_line(msg)
    sys.exit(code)


def what_can_be_done(exc: IncompleteRun) -> str:
    """What can still be done with the incomplete run ``exc`` names: one line."""
    d = exc.path
    if exc.status == "captured":
        return f"`harmony report {d}` analyses it"
    return (f"what it captured can still be read: `harmony report --allow-incomplete {d}`, "
            f"`harmony export {d}` (its capture as a trace.dat), "
            f"harmony.load('{d}', allow_incomplete=True) in Python")


def error_message(exc: BaseException) -> str:
    """The one line an error is worded in."""
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted"
    if isinstance(exc, OSError):
        return f"{exc.filename + ': ' if exc.filename else ''}{exc.strerror or exc}"
    return str(exc)


@contextlib.contextmanager
def exit_on_error(marked=None, also: tuple = ()):
    """Every command's errors: Harmony's (and ``also`` these types) become one line and the
    status :func:`exit_status` gives. Bad input (a :class:`ParameterError`: an unknown kernel,
    scheduler or experiment, a bad plan or topology) is a usage error, raised as click's
    ``UsageError``: the line names the command's --help (``harmony.cli.entry``), status 2.
    ``marked`` (a string, or a function giving one) says what an interrupted command leaves
    behind ("<dir> is marked incomplete"). An incomplete run is followed by what can still be
    done with it. A stop that a library turned into an error of its own (a Ctrl-C in an
    extension's initialisation comes out as its ImportError), or that an error of the cleanup
    after it followed, or that an extension's C code replaced with an error of its own (a
    Ctrl-C as matplotlib draws a figure: its ValueError, :func:`harmony.core.stops.swallowed`),
    is the stop."""
    since = stops.raised()
    try:
        yield
    except (KeyboardInterrupt, HarmonyError, *also) as exc:
        _exit_on(stops.swallowed(exc, since) or exc, marked)
    except Exception as exc:
        stop = stops.behind(exc, since)
        if stop is None or isinstance(exc, click.ClickException):
            raise
        _exit_on(stop, marked)


def _exit_on(exc: BaseException, marked) -> None:
    """:func:`exit_on_error`'s line and status for ``exc``."""
    if isinstance(exc, ParameterError):     # bad input: a usage error, as click's own are
        raise click.UsageError(error_message(exc),
                               ctx=click.get_current_context(silent=True)) from None
    msg = error_message(exc)
    if marked and isinstance(exc, (KeyboardInterrupt, Interrupted)):
        said = marked() if callable(marked) else marked
        msg = f"{msg}; {said}" if said else msg
    error_line(msg)
    if isinstance(exc, IncompleteRun):
        echo(f"harmony: {what_can_be_done(exc)}", err=True)
    sys.exit(exit_status(exc))


def left_behind(out: Path) -> str:
    """What a run stopped half-way left in ``out``, in a few words (its manifest says)."""
    try:
        status = json.loads((out / "manifest.json").read_text()).get("status")
    except (OSError, ValueError):
        return "nothing was started" if not out.exists() else f"{out} holds no run"
    if status == "captured":
        return f"{out} holds the capture, not analysed (`harmony report {out}` analyses it)"
    if status == "complete":
        return f"{out} is complete"
    return (f"{out} is marked incomplete (`harmony report --allow-incomplete {out}` shows what "
            "it captured)")


def check_out(out: Path) -> None:
    """Refuse, in one line and before anything starts, an --out that cannot be a directory Harmony
    writes: a file in the way, or no writable directory where it would be made."""
    if out.is_symlink():
        raise click.BadParameter(f"{out} is a symbolic link: Harmony does not write through one",
                                 param_hint="--out")
    if out.exists() and not out.is_dir():
        raise click.BadParameter(f"{out} exists and is not a directory", param_hint="--out")
    base = out if out.exists() else next((a for a in out.absolute().parents if a.exists()), None)
    if base is None or not base.is_dir():
        raise click.BadParameter(f"{out}: {base} is not a directory", param_hint="--out")
    from harmony.store import cannot_write

    why = cannot_write(base)
    if why:
        raise click.BadParameter(f"{out}: cannot write under {base} ({why})", param_hint="--out")


def build_kernels_first() -> None:
    """Build Harmony's compiled kernels before the command starts where this code's are not
    built (the first command after a plain ``pip install``:
    :func:`harmony.precompile.ensure_built`), once; a note before and after (a warning if it
    fails)."""
    from harmony.precompile import ensure_built
    ensure_built(say=note, warn=warn)       # it checks build_needed itself


def parse_params(pairs: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{pair!r} is not key=value", param_hint="--param")
        out[key.strip()] = value.strip()
    return out


def check_release_options() -> None:
    """The controller's expert environment options, checked before anything starts."""
    from harmony.workload.controller import ControllerError, release_options
    try:
        release_options()
    except ControllerError as exc:
        raise click.UsageError(str(exc)) from None


def resolve_cpus(text: str | None) -> list[int]:
    """The experiment CPU set: ``text`` (a CPU list) checked against the online CPUs."""
    online = osutil.online_cpus()
    if text is None:
        return online
    try:
        cpus = osutil.parse_cpulist(text)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--cpus") from None
    offline = sorted(set(cpus) - set(online))
    if offline:
        raise click.BadParameter(
            f"{'CPU' if len(offline) == 1 else 'CPUs'} {osutil.format_cpulist(offline)} "
            f"{'is' if len(offline) == 1 else 'are'} not online (online: "
            f"{osutil.format_cpulist(online)})", param_hint="--cpus")
    return cpus


def default_out(prefix: str) -> Path:
    """The directory a command writes when not given --out: ``runs/<prefix>-<time>``."""
    return Path("runs") / f"{prefix}-{datetime.datetime.now():%Y%m%d-%H%M%S}"


def print_json(obj) -> None:
    """``obj`` as the JSON a program reads (``--json``): on stdout, indented, numpy and paths
    as plain values."""
    from harmony.store import json_default

    def plain(o):
        try:
            return json_default(o)
        except TypeError:
            return str(o)

    click.echo(json.dumps(obj, indent=1, default=plain))


def decide_options(f):
    """--until-decided, --max-repeat: runs added until the card's questions are decided
    (harmony.decide)."""
    from harmony.analysis.thresholds import UNTIL_DECIDED_MAX_REPEAT   # constants, no imports

    f = click.option("--max-repeat", type=click.IntRange(min=2), metavar="N",
                     help="with --until-decided: at most N runs a configuration, planned ones "
                          f"included (default {UNTIL_DECIDED_MAX_REPEAT}; "
                          "analysis/thresholds.py says why)")(f)
    f = click.option("--until-decided", is_flag=True,
                     help="after the planned runs, give a configuration whose questions are not "
                          "yet decided (or shown to vary) more runs, a few at a time, up to "
                          "--max-repeat")(f)
    return f


def decide_cap(until_decided: bool, max_repeat: int | None, planned: int) -> int | None:
    """The cap on a configuration's runs for --until-decided (None without it), checked before
    anything starts."""
    from harmony.analysis.thresholds import UNTIL_DECIDED_MAX_REPEAT

    if not until_decided:
        if max_repeat is not None:
            raise click.UsageError("--max-repeat goes with --until-decided")
        return None
    cap = max_repeat if max_repeat is not None else max(UNTIL_DECIDED_MAX_REPEAT, planned)
    if cap < planned:
        raise click.BadParameter(f"{cap} is fewer runs than the {planned} planned",
                                 param_hint="--max-repeat")
    return cap


def say_until_decided(record: dict) -> None:
    """One line on what --until-decided added to a suite (its record), if it was asked."""
    ud = record.get("until_decided")
    if ud:
        capped = [k for k, v in ud["configs"].items() if v and v.get("capped")]
        echo(f"until decided: {plural(ud['added_runs'], 'run')} added in "
             f"{plural(ud['rounds'], 'round')} (at most {ud['max_repeat']} a configuration)"
             + (f"; still undecided at the cap: {', '.join(capped)}" if capped else ""))
