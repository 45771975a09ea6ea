"""The one interface every capture backend implements.

A probe records the sched tracepoints of the whole host into files under its ``out_dir`` while an
experiment runs, then decodes those files into a :class:`Capture`. Callers never branch on the
backend: they pick one by name with :func:`harmony.probes.get_probe` and use this interface.

Life cycle::

    probe = get_probe("tracefs")(out_dir, cpus=[0, 1], duration_s=5.0)
    probe.start()            # recording is live when this returns
    probe.mark("harmony t0") # a marker on the trace clock
    ...
    probe.stop()             # idempotent; always removes every piece of kernel state it created
    capture = probe.decode() # also works later, from the files alone: Probe.decode_dir(out_dir)

A probe also answers for itself in ``harmony doctor`` (:mod:`harmony.doctor`): its check of this
host (:meth:`Probe.doctor_check`) and whether it can record here (:meth:`Probe.cannot_record`).
"""

from __future__ import annotations

import abc
import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:   # annotations only: the guest agent (harmony.vm.guest) loads no pandas
    import pandas as pd

from harmony.core.errors import ProbeError, TraceCorrupt  # noqa: F401  (raised here)

#: the sched tracepoints no recording probe can do without (the others of
#: :data:`harmony.probes.schema.SCHED_EVENTS` add detail)
REQUIRED_TRACEPOINTS = ("sched_switch", "sched_migrate_task", "sched_wakeup")

#: trace clocks whose timestamps are not nanoseconds (the kernel's trace_clocks with in_ns = 0),
#: and what they count: every duration Harmony derives from such a trace would be wrong
NOT_NS_CLOCKS = {"counter": "events (a counter, not a time)", "uptime": "jiffies",
                 "x86-tsc": "CPU cycles", "ppc-tb": "time-base ticks"}


@dataclasses.dataclass
class Capture:
    """What a probe saw.

    events:  canonical events table (see :mod:`harmony.probes.schema`)
    markers: markers table (ts, cpu, pid, text)
    meta:    facts about the recording, all JSON-serialisable. Keys every probe fills:
             ``probe`` (name), ``clock`` (trace clock name, e.g. "mono"), ``events_enabled`` (list),
             ``lost_events`` (int, total events the kernel or tool reported lost; -1 if unknown),
             ``lost_by_cpu`` ({cpu: n}), ``bytes`` (raw bytes recorded), ``n_events`` (decoded
             rows), ``notes`` (list of str: anything the probe could not see or had to repair).
    """

    events: pd.DataFrame
    markers: pd.DataFrame
    meta: dict


class Probe(abc.ABC):
    """A capture backend. Subclasses set ``name`` and implement the abstract methods."""

    name: str = ""
    #: the name of this probe's check among ``harmony doctor``'s facts (None: the probe's name)
    check_name: str | None = None

    def __init__(self, out_dir: Path, cpus: list[int], duration_s: float):
        # absolute: a backend may run its recorder in another directory (perf runs in out_dir)
        self.out_dir = Path(out_dir).absolute()
        self.cpus = list(cpus)
        self.duration_s = float(duration_s)

    @classmethod
    @abc.abstractmethod
    def available(cls) -> tuple[bool, str]:
        """(True, "") if this probe can record on this host now, else (False, one-line reason)."""

    @abc.abstractmethod
    def start(self) -> None:
        """Begin recording; return once events are being captured."""

    @abc.abstractmethod
    def mark(self, text: str) -> int:
        """Write ``text`` as a marker into the trace; return its time on the trace clock (ns)."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Stop recording, flush everything to ``out_dir`` and remove all kernel state.
        Idempotent."""

    @classmethod
    @abc.abstractmethod
    def decode_dir(cls, out_dir: Path) -> Capture:
        """Decode a recording stored in ``out_dir``; raise TraceCorrupt naming the bad file."""

    def decode(self) -> Capture:
        return self.decode_dir(self.out_dir)

    def helper_tids(self) -> list[int]:
        """The threads of the processes this probe runs beside the caller's (``perf record``),
        while it records: a run raises them with its own threads for its window and counts their
        CPU time as its own, not as foreign load. None by default (a probe recording from the
        caller's own threads)."""
        return []

    @classmethod
    def reclaim_stale(cls) -> list[str]:
        """Remove kernel state left by Harmony processes that no longer exist;
        return what was removed."""
        return []

    @classmethod
    def doctor_check(cls, facts: dict, test_record: bool = True) -> dict | None:
        """This probe's check in ``harmony doctor``: a dict ``{"status": "ok" | "warn" | "missing",
        "detail": one line, ...facts}`` (:func:`harmony.hostfacts.check`), stored under
        :attr:`check_name`. ``facts``: the doctor's checks of the host (``tracefs``,
        ``sched_tracepoints``, ...); ``test_record``: the check may try a short test recording.
        None by default: a probe that does not record on this host (one that replays recordings
        made elsewhere) has nothing to check, and the doctor does not count it."""
        return None

    @classmethod
    def cannot_record(cls, facts: dict) -> str | None:
        """Why this probe cannot record here, read from the doctor's ``facts`` (its own check
        among them), as ``"<what>: <detail of the check that says so>"``; None if it can.

        By default: its check says it cannot record the sched tracepoints (``can_record_sched``
        false), or tracefs lacks one of :data:`REQUIRED_TRACEPOINTS`."""
        own, tracepoints = facts[cls.check_name or cls.name], facts["sched_tracepoints"]
        if not own.get("can_record_sched"):
            return f"{cls.name}: {own['detail']}"
        if missing_tracepoints(tracepoints):
            return f"{cls.name}: {tracepoints['detail']}"
        return None

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()
        return False


def missing_tracepoints(tracepoints: dict) -> list[str]:
    """The :data:`REQUIRED_TRACEPOINTS` that the doctor's ``sched_tracepoints`` check
    did not find."""
    present = tracepoints.get("present", [])
    return [t for t in REQUIRED_TRACEPOINTS if t not in present]


def drain_stall_from_env(name: str) -> tuple[float, float] | None:
    """A test's drain stall (``AFTER:SECONDS``: the drains stop reading AFTER s into a capture
    for SECONDS s) from the environment variable ``name``; None where it is unset, ProbeError
    (one line) where it is malformed."""
    text = os.environ.get(name)
    if not text:
        return None
    try:
        after, length = (float(x) for x in text.split(":"))
    except ValueError:
        after = length = -1.0
    if after < 0 or length <= 0:
        raise ProbeError(f"{name}={text!r}: expected AFTER:SECONDS, e.g. 0.5:1")
    return after, length
