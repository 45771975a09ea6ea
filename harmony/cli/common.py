"""What every command shares: one-line errors and the exit status, checks of common options.

A command never prints a traceback for what Harmony raises on purpose: :func:`exit_on_error` turns
it into one line (``harmony: error: ...``) and the status :func:`exit_status` gives.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import sys
import tempfile
from pathlib import Path

import click

from harmony.core import osutil
from harmony.core.errors import HarmonyError, Interrupted, ParameterError


def exit_status(exc: BaseException, inputs: tuple = ()) -> int:
    """The exit status of a command that stopped on ``exc``; ``inputs``: the error types that
    mean, for this command, that what it was given is not acceptable (bad arguments)."""
    if isinstance(exc, KeyboardInterrupt):
        return 130
    if isinstance(exc, Interrupted):
        return 128 + exc.signal
    if isinstance(exc, (ParameterError, *inputs)):
        return 2
    return 1


@contextlib.contextmanager
def exit_on_error(marked=None, also: tuple = (), inputs: tuple = ()):
    """Every command's errors: Harmony's (and ``also`` these types) become one line and the
    status :func:`exit_status` gives; ``marked`` (a string, or a function giving one) says what an
    interrupted command leaves behind ("<dir> is marked incomplete")."""
    try:
        yield
    except (KeyboardInterrupt, HarmonyError, *also, *inputs) as exc:
        msg = ("interrupted" if isinstance(exc, KeyboardInterrupt) else
               f"{exc.filename + ': ' if exc.filename else ''}{exc.strerror or exc}"
               if isinstance(exc, OSError) else str(exc))
        if marked and isinstance(exc, (KeyboardInterrupt, Interrupted)):
            said = marked() if callable(marked) else marked
            msg = f"{msg}; {said}" if said else msg
        fail(msg, exit_status(exc, inputs))


def left_behind(out: Path) -> str:
    """What a run stopped half-way left in ``out``, in a few words (its manifest says)."""
    try:
        status = json.loads((out / "manifest.json").read_text()).get("status")
    except (OSError, ValueError):
        return "nothing was started" if not out.exists() else f"{out} holds no run"
    if status == "captured":
        return f"{out} holds the capture, not analysed (`harmony report {out}` analyses it)"
    return f"{out} is {'complete' if status == 'complete' else 'marked incomplete'}"


def fail(msg: str, code: int = 1):
    click.echo(f"harmony: error: {msg}", err=True)
    sys.exit(code)


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
    try:  # a real write: root passes permission checks that /proc or a read-only mount do not
        tempfile.TemporaryDirectory(dir=base, prefix=".harmony-check-").cleanup()
    except OSError as exc:
        raise click.BadParameter(f"{out}: cannot write under {base} ({exc.strerror})",
                                 param_hint="--out") from None


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
        raise click.BadParameter(f"CPU {','.join(map(str, offline))} is not online "
                                 f"(online: {','.join(map(str, online))})", param_hint="--cpus")
    return cpus


def default_out(prefix: str) -> Path:
    """The directory a command writes when not given --out: ``runs/<prefix>-<time>``."""
    return Path("runs") / f"{prefix}-{datetime.datetime.now():%Y%m%d-%H%M%S}"
