"""Each task's own scheduler counters, read from ``/proc/<pid>/sched``.

The kernel counts, per task: ``se.nr_migrations`` (``set_task_cpu`` to another CPU: the same
place that fires ``sched_migrate_task``), ``nr_switches`` (voluntary + involuntary switches away
from it: one per ``sched_switch`` whose prev is the task) and ``se.sum_exec_runtime`` (CPU time,
printed in ms with 6 decimals; brought up to date at ticks and switches, so a running task's lags
by up to a tick). Read at the start and at the end of a run, their differences are what the trace
must show between the two reads: :mod:`harmony.analysis.counters` compares them. A kernel that
counts scheduler statistics (``CONFIG_SCHEDSTATS``, with ``kernel.sched_schedstats`` 1: a run
turns it on, :mod:`harmony.probes.schedstat`) prints more, of which Harmony reads
``nr_wakeups_migrate`` (its wake-ups that moved it: ``ttwu_stat`` of a wake-up whose
``select_task_rq`` chose another CPU, the migrations of cause ``wakeup``) and
``nr_forced_migrations`` (moves by ``load_balance`` of a task whose cache was still hot).

A read is not an instant: each row carries the window [before_ns, after_ns] (CLOCK_MONOTONIC, the
probes' clock) in which the kernel produced it. The file needs scheduler debugging built in
(``CONFIG_SCHED_DEBUG``, on kernels that still have that option); :func:`available` says whether
this one prints the counters, and :func:`doctor_check` answers for them in ``harmony doctor``.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from harmony.core.columns import Table
from harmony.hostfacts import OK, WARN, check

if TYPE_CHECKING:   # frame()'s annotation; the guest agent keeps rows, loads no pandas
    import pandas as pd

_KEYS = (b"se.nr_migrations", b"nr_switches", b"se.sum_exec_runtime")
#: counted only by a kernel with CONFIG_SCHEDSTATS while kernel.sched_schedstats is 1 (else not
#: printed): the names since 5.16 (``stats.``), then before it (``se.statistics.``)
_SCHEDSTAT_KEYS = ((b"nr_wakeups_migrate", b"se.statistics.nr_wakeups_migrate"),
                   (b"nr_forced_migrations", b"se.statistics.nr_forced_migrations"))

#: The ``kernel_counters`` table of a run (kernel_counters.parquet): :meth:`CounterReads.frame`.
KERNEL_COUNTERS = Table("kernel_counters", "one row per task read, in the order of the reads", [
    ("read",          "str",   'the read\'s label: "start" or "end" of the run'),
    ("pid",           "int32", "the task"),
    ("before_ns",     "int64", "ns, CLOCK_MONOTONIC, just before the file was read"),
    ("after_ns",      "int64", "ns, CLOCK_MONOTONIC, just after"),
    ("nr_migrations", "int64", "se.nr_migrations: its moves to another CPU"),
    ("nr_switches",   "int64", "nr_switches: its switches away (voluntary + involuntary)"),
    ("sum_exec_ns",   "int64", "se.sum_exec_runtime: its CPU time (ns)"),
    ("nr_wakeups_migrate",   "int64", "its wake-ups that moved it to another CPU (schedstats; -1: "
                                      "not counted, a kernel without CONFIG_SCHEDSTATS or with "
                                      "kernel.sched_schedstats 0)"),
    ("nr_forced_migrations", "int64", "its moves by a load balance despite its cache being hot "
                                      "(schedstats; -1: not counted)"),
])
#: the table's dtypes by column
DTYPES = {c.name: c.dtype for c in KERNEL_COUNTERS.columns}


def _value(text: bytes, key: bytes) -> bytes | None:
    """The value after ``key`` and its colon, on a line that starts with ``key``."""
    at = text.find(b"\n" + key + b" ")
    if at < 0:
        return None
    colon = text.find(b":", at)
    end = text.find(b"\n", colon)
    return text[colon + 1:end if end >= 0 else None].strip()


def _ms_to_ns(value: bytes) -> int:
    """``1.475086`` (ms, as the kernel's SPLIT_NS prints it) -> 1475086 ns."""
    whole, _, frac = value.partition(b".")
    return int(whole) * 1_000_000 + int((frac + b"000000")[:6])


def parse(text: bytes) -> tuple[int, int, int, int, int] | None:
    """(nr_migrations, nr_switches, sum_exec_ns, nr_wakeups_migrate, nr_forced_migrations) from a
    ``/proc/<pid>/sched`` text, the last two -1 where the kernel does not print them (not
    counting scheduler statistics); None if one of the first three is missing or not a
    number."""
    values = [_value(text, k) for k in _KEYS]
    if any(v is None for v in values):
        return None
    stats = []
    for names in _SCHEDSTAT_KEYS:
        v = next((v for v in (_value(text, k) for k in names) if v is not None), None)
        stats.append(int(v) if v is not None and v.isdigit() else -1)
    try:
        return int(values[0]), int(values[1]), _ms_to_ns(values[2]), *stats
    except ValueError:
        return None


def read(pid: int) -> tuple[int, ...] | None:
    """(before_ns, after_ns, then :func:`parse`'s counters) of ``pid`` now; None if the task is
    gone or its file cannot be read."""
    before = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    try:        # one read() of the whole file (~2 KB): half the time of a buffered open()
        fd = os.open(f"/proc/{pid}/sched", os.O_RDONLY)
        try:
            text = os.read(fd, 1 << 16)
        finally:
            os.close(fd)
    except OSError:
        return None
    after = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    got = parse(b"\n" + text)
    return None if got is None else (before, after, *got)


def available() -> tuple[bool, str]:
    """(True, "") if this kernel prints the counters in /proc/<pid>/sched, else (False, why)."""
    try:
        with open("/proc/self/sched", "rb") as f:
            text = f.read()
    except OSError as exc:
        return False, f"/proc/<pid>/sched is not readable ({exc.strerror or exc}): a kernel " \
                      "without scheduler debugging"
    if parse(b"\n" + text) is None:
        return False, "/proc/<pid>/sched does not print se.nr_migrations, nr_switches and " \
                      "se.sum_exec_runtime on this kernel"
    return True, ""


def doctor_check() -> dict:
    """``harmony doctor``'s ``task_counters`` check: :func:`available`, and what it means
    for runs."""
    ok, why = available()
    if ok:
        return check(OK, "/proc/<pid>/sched prints se.nr_migrations, nr_switches and "
                         "se.sum_exec_runtime: each run's trace is checked against them",
                     readable=True)
    return check(WARN, why + "; runs are not checked against the tasks' own counters",
                 readable=False)


class CounterReads:
    """The counters of ``pids``, read whenever :meth:`take` is called (~20 us a task here);
    :meth:`frame` gives them as a table (:data:`KERNEL_COUNTERS`)."""

    def __init__(self, pids: list[int]):
        self.pids = list(pids)
        self.rows: list[tuple] = []
        self.missing: dict[str, int] = {}        # read -> tasks whose file could not be read

    def take(self, label: str) -> None:
        for pid in self.pids:
            got = read(pid)
            if got is None:
                self.missing[label] = self.missing.get(label, 0) + 1
            else:
                self.rows.append((label, pid, *got))

    def frame(self) -> pd.DataFrame:
        return KERNEL_COUNTERS.from_rows(self.rows)
