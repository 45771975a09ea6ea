"""Every error Harmony raises on purpose: one base class, one line for the user.

A :class:`HarmonyError`'s message is a single line that says what went wrong and, where a path is
involved, names it; the CLI prints it after ``harmony: error:`` and exits with the status
:func:`harmony.cli.common.exit_status` maps it to (the one place that does). Anything else that
escapes is a bug.

The classes stay importable from the modules that raise them (``harmony.store.RunError``,
``harmony.probes.ProbeError``...), as they were.
"""

from __future__ import annotations


class HarmonyError(RuntimeError):
    """Base of Harmony's errors; the message is one line for the user."""


class ParameterError(HarmonyError, ValueError):
    """A parameter, option or file given to Harmony is not acceptable; nothing was started."""


class RunError(HarmonyError):
    """A run directory is missing, corrupt or incomplete; the message names the path."""


class IncompleteRun(RunError):
    """A run directory whose run is not complete (interrupted, failed, or captured and not
    analysed yet): ``path`` the directory, ``status`` its manifest's."""

    def __init__(self, message: str, path=None, status: str | None = None):
        super().__init__(message)
        self.path, self.status = path, status


class ProbeError(HarmonyError):
    """A probe could not start, record or decode; the message is one line for the user."""


class TraceCorrupt(ProbeError):
    """A stored trace cannot be decoded; the message names the file."""


class ImportFailed(HarmonyError):
    """A trace was read but cannot be analysed as asked (no such task, no such marker...)."""


class ControllerError(HarmonyError):
    """The workload could not be created or released; the message is one line for the user."""


class HostBusy(HarmonyError):
    """Another Harmony run holds this host."""


class Interrupted(HarmonyError):
    """SIGTERM or SIGHUP arrived during a run; ``signal`` is its number."""

    def __init__(self, message: str, signal: int = 15):
        super().__init__(message)
        self.signal = signal


def stop_behind(exc: BaseException) -> BaseException | None:
    """The Ctrl-C (KeyboardInterrupt) or :class:`Interrupted` that ``exc`` was raised while
    handling, if any (its ``__context__`` chain): an error of the cleanup after a stop, which
    must be handled as the stop, never as a failure to go on after."""
    e = exc
    while e is not None and not isinstance(e, (KeyboardInterrupt, Interrupted)):
        e = e.__context__           # never a cycle: Python breaks one as it sets a context
    return e


class CpusetUnavailable(HarmonyError):
    """No usable cpuset hierarchy (the message says why); the release falls back to affinity."""


class ForkServerError(HarmonyError):
    """The fork server did not answer as it should; it is killed and not used again."""


class FormatError(HarmonyError, ValueError):
    """A tracefs event format text cannot be parsed."""


class SchedDebugError(HarmonyError, ValueError):
    """The text is not a sched debug file this parser understands; the message says why."""


class KernelError(HarmonyError):
    """A kernel under test cannot be had: not fetched, or its image cannot be read."""


class UnknownKernel(KernelError, ParameterError):
    """A ``--kernel`` that is neither a known name nor a kernel image (bad input: exit 2)."""


class VmError(HarmonyError):
    """A virtual machine did not boot, or its guest stopped before it finished; the message
    names the kernel."""


class ScxError(HarmonyError):
    """A sched_ext scheduler under test could not be started, or was ejected by the kernel."""


class UnknownScheduler(ScxError, ParameterError):
    """An ``--scx`` that names no known scheduler nor an executable (bad input: exit 2)."""
