"""The ``pyperf`` probe: the sched tracepoints opened through the kernel's python-perf binding
(:mod:`harmony.probes.perf_binding`) and read from its ring buffers in this process: no ``perf
record`` to start and stop, no perf.data for it to write and finish.

It sees what the ``perf`` probe sees (the same kernel interface: perf_event_open() tracepoint
events, one ring buffer per CPU, every hit sampled), so it shares that probe's blind spots (no
event in the context of CPU 1's idle task or PID 1's threads on this host: see
:mod:`harmony.probes.perf`; every run reports them from its own stream), and it cross-checks
the tracefs probe as perf does (``--probe pyperf --crosscheck tracefs``). It records the same
events: :data:`~harmony.probes.schema.SCHED_EVENTS` and, where the kernel has them,
:data:`~harmony.probes.schema.CAUSE_EVENTS` (the scheduler's softirq filtered on its vector, as
the other probes do).

How, and what the binding could not do (:mod:`harmony.probes.pyperf_ring`): the events are made,
opened on every CPU and their rings mapped by the binding (``perf.evsel``, ``perf.evlist``,
``perf.cpu_map``, ``perf.thread_map``), created disabled; the filter, enabling, disabling and the
kernel's counts are ioctls and reads on the descriptors it hands back; one drain thread
(:class:`~harmony.probes.pyperf_ring.Drain`, raised to SCHED_FIFO with the run's other threads
as the tracefs probe's drains are) copies the rings' records, whole and undecoded, into
``records.raw`` while the run lasts; they are decoded after it
(:mod:`harmony.probes.pyperf_decode`). The samples are stamped on perf's clock: the binding has
no way to ask for CLOCK_MONOTONIC (``perf record -k``), so the probe ties the two clocks when it
starts and when it stops (:mod:`harmony.probes.pyperf_clock`) and the decode maps every stamp;
the run's notes and manifest (``capture.clock_tie``) say so, with the offset and its bound.

Lost events: a full ring makes the kernel count the samples it could not write, both in a
PERF_RECORD_LOST record it writes into the ring once there is room again (counted by CPU) and in
each event's own count, read from its descriptor at the stop (PERF_FORMAT_LOST, Linux 6.0+): the
latter is the run's ``lost_events`` (it also holds a loss whose LOST record never came, the ring
still full at the stop). The descriptors also give every event's hits: the hits that were neither
written nor counted lost (``unwritten``) are the blind spots' hits, counted by the kernel itself.

Markers: user-space CLOCK_MONOTONIC stamps in ``markers.jsonl``, as the perf probe's (a
``trace_marker`` write goes to the ftrace ring buffer only).

Files in ``out_dir``::

    records.raw    the rings' records (perf_event.h's layout), chunk after chunk
    formats/       header_page and <system>/<event>/format of every event recorded
    markers.jsonl  one JSON object per mark(): ts (CLOCK_MONOTONIC ns), cpu, pid, text
    meta.json      written by stop(): the binding, the events, the rings, the clock ties, the
                   kernel's counts, the drain's figures, libperf's lines, notes

A suite or batch (:meth:`PyperfProbe.session`) keeps the events open across its runs, disabled
between them: opening them costs ~15 ms, but closing them ~0.4 s (the kernel unregisters each
tracepoint's perf handler, an RCU grace period each), paid once at the session's end.

Expert options (testing how a run reports lost events; never needed in normal use):
``HARMONY_PYPERF_PAGES=N`` data pages per ring (a power of two; default from the run's length,
as the perf probe's ``-m``), ``HARMONY_PYPERF_DRAIN_STALL=A:B`` the drain stops reading from A
s after the start for B s.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from pathlib import Path

from harmony import hostfacts
from harmony.hostfacts import MISSING, OK, WARN, check
from harmony.core.osutil import atomic_write, online_cpus, sched_getcpu
from harmony.probes import perf_binding
from harmony.probes.base import (REQUIRED_TRACEPOINTS, Capture, Probe, ProbeError, TraceCorrupt,
                                 drain_stall_from_env)
from harmony.probes.perf import CLOCK_NAME, mmap_pages_for, read_markers
from harmony.probes.pyperf_clock import tie
from harmony.probes.pyperf_ring import (DRAIN_IDLE_MS, SAMPLE_TYPE, Drain, EventSpec, OpenEvents,
                                        can_read_rings)
from harmony.probes.schema import CAUSE_EVENTS, SCHED_EVENTS
from harmony.probes.tracefs import TRACEFS

ENV_PAGES = "HARMONY_PYPERF_PAGES"
ENV_DRAIN_STALL = "HARMONY_PYPERF_DRAIN_STALL"
RECORDS = "records.raw"


def event_specs(events_dir: Path = TRACEFS / "events") -> tuple[list[EventSpec], list[str]]:
    """The events the probe records that this kernel has (every SCHED_EVENTS one, then the
    CAUSE_EVENTS with their filters), and the names of those it lacks."""
    specs, missing = [], []
    for system, name, flt in [("sched", e, None) for e in SCHED_EVENTS] + list(CAUSE_EVENTS):
        if (events_dir / system / name / "format").is_file():
            specs.append(EventSpec(system, name, flt))
        else:
            missing.append(name if system == "sched" else f"{system}:{name}")
    return specs, missing


def _label(spec: EventSpec) -> str:
    """The name an events table gives the event (bare for the sched system)."""
    return spec.name if spec.system == "sched" else spec.label


def _expert_options() -> tuple[int | None, tuple[float, float] | None]:
    """HARMONY_PYPERF_PAGES, HARMONY_PYPERF_DRAIN_STALL; ProbeError (one line) if malformed."""
    pages = None
    text = os.environ.get(ENV_PAGES)
    if text:
        try:
            pages = int(text)
        except ValueError:
            pages = 0
        if pages <= 0 or pages & (pages - 1):
            raise ProbeError(f"{ENV_PAGES}={text!r}: not a power of two")
    return pages, drain_stall_from_env(ENV_DRAIN_STALL)


class _KeptEvents:
    """The events a :meth:`PyperfProbe.session` keeps open across its runs."""

    def __init__(self, events: OpenEvents, config: tuple, facts: dict, formats: dict):
        self.events, self.config, self.facts, self.formats = events, config, facts, formats
        self.user: PyperfProbe | None = None
        self.runs = 0


class PyperfProbe(Probe):
    """Records the sched tracepoints through the python-perf binding; see the module docstring."""

    name = "pyperf"
    _available_ok_until = 0.0
    _kept: _KeptEvents | None = None
    _session_open = False

    def __init__(self, out_dir: Path, cpus: list[int], duration_s: float):
        super().__init__(out_dir, cpus, duration_s)
        self.meta: dict = {}
        self._events: OpenEvents | None = None
        self._kept_here: _KeptEvents | None = None
        self._drain: Drain | None = None
        self._markers = None
        self._lock = threading.Lock()
        self._counts_at_start: tuple[int, int | None] = (0, 0)
        self._stopped = True

    # ------------------------------------------------------------------------ availability
    @classmethod
    def available(cls) -> tuple[bool, str]:
        why = cls._cannot()
        if why:
            return False, why
        if time.monotonic() < cls._available_ok_until:
            return True, ""
        specs = [s for s in event_specs()[0] if s.name == "sched_switch"]
        ok, why, _ = try_open(perf_binding.find().module, specs)
        if not ok:
            return False, why
        cls._available_ok_until = time.monotonic() + 60.0
        return True, ""

    @classmethod
    def _cannot(cls) -> str | None:
        """Why this probe cannot record here, short of opening an event (None: nothing says)."""
        binding = perf_binding.find()
        if not binding.loaded:
            return f"python-perf binding: {binding.why_not}"
        why = can_read_rings()
        if why:
            return why
        lacking = [e for e in REQUIRED_TRACEPOINTS if e in event_specs()[1]]
        if lacking:
            return (f"tracepoints missing from {TRACEFS / 'events'}: {', '.join(lacking)} "
                    "(tracefs not mounted?)")
        return None

    # ------------------------------------------------------------------------ recording
    def _config(self) -> tuple:
        pages, stall = _expert_options()
        wanted = pages or mmap_pages_for(self.duration_s, len(online_cpus()) or 1)
        return wanted, stall

    def start(self) -> None:
        if not self._stopped:
            raise ProbeError("pyperf probe already started")
        why = self._cannot()       # the events' own opening says the rest, in one line
        if why:
            raise ProbeError(why)
        perf = perf_binding.find().module
        pages, stall = self._config()
        self.out_dir.mkdir(parents=True, exist_ok=True)
        for stale in (RECORDS, "markers.jsonl", "meta.json"):
            (self.out_dir / stale).unlink(missing_ok=True)
        t0 = time.perf_counter()
        kept = PyperfProbe._kept
        if kept is not None and kept.user is not None:
            kept = None                  # in use by another probe of this process: its own
        elif kept is not None and (kept.config[0] < pages or kept.events.closed):
            PyperfProbe._kept = None     # smaller rings, or not trusted: ended, new ones made
            kept.events.close()
            kept = None
        if kept is None:
            events, facts, formats = self._open(perf, pages)
            if PyperfProbe._session_open and PyperfProbe._kept is None:
                kept = PyperfProbe._kept = _KeptEvents(events, (pages,), facts, formats)
        else:
            events, facts, formats = kept.events, dict(kept.facts), kept.formats
            facts["events_reused"] = kept.runs
        if kept is not None:
            kept.user, kept.runs = self, kept.runs + 1
            self._kept_here = kept
        self._events = events
        self._stopped = False
        try:
            self._save_formats(formats)
            self._begin(perf, events, facts, stall, t0)
        except BaseException:
            self._abort()
            raise

    def _open(self, perf, pages: int) -> tuple[OpenEvents, dict, dict]:
        """Open the events (disabled), set the softirq filter; (events, facts, format files)."""
        specs, missing = event_specs()
        t = time.perf_counter()
        events = OpenEvents(perf, specs, pages, watermark=pages * os.sysconf("SC_PAGE_SIZE") // 2)
        filters = {}
        try:
            for text in dict.fromkeys(s.filter for s in specs if s.filter):
                took = events.set_filter(text)
                which = [s.label for s in specs if s.filter == text]
                want = len(which) * len(events.cpus)
                filters.update({w: text if took == want else
                                f"none (the kernel took it on {took} of {want} descriptors)"
                                for w in which})
            formats = {}
            for name in ("header_page", "header_event"):
                formats[name] = (TRACEFS / "events" / name).read_bytes()
            for s in specs:
                formats[f"{s.system}/{s.name}/format"] = \
                    (TRACEFS / "events" / s.system / s.name / "format").read_bytes()
        except BaseException:
            events.close()
            raise
        facts = {"events_enabled": [_label(s) for s in specs], "events_missing": missing,
                 "event_filters": filters, "ring_pages": pages, "rings": len(events.rings),
                 "cpus": events.cpus, "libperf_log": events.log[-40:],
                 "open_s": round(time.perf_counter() - t, 4)}
        return events, facts, formats

    def _save_formats(self, formats: dict) -> None:
        for rel, data in formats.items():
            path = self.out_dir / "formats" / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)

    def _begin(self, perf, events: OpenEvents, facts: dict, stall, t0: float) -> None:
        """Tie the clocks, start the drain, enable the events."""
        tie_start = tie(perf, events.cpus)
        self._counts_at_start = events.counts()
        stall_ns = None
        if stall:
            lo = time.clock_gettime_ns(time.CLOCK_MONOTONIC) + int(stall[0] * 1e9)
            stall_ns = (lo, lo + int(stall[1] * 1e9))
        self._drain = Drain(events.rings, events.fds, str(self.out_dir / RECORDS), stall_ns)
        self._drain.start()
        events.enable()
        self.meta = {
            "probe": self.name, "binding": perf_binding.find().facts(), **facts,
            "sample_type": SAMPLE_TYPE, "clock": CLOCK_NAME, "clock_source": "perf",
            "clock_tie": {"start": tie_start}, "cpus_online": online_cpus(),
            "kernel": os.uname().release, "duration_s": self.duration_s,
            "drain_stall_s": list(stall) if stall else None,
            "started_ns": time.clock_gettime_ns(time.CLOCK_MONOTONIC),
            "start_s": round(time.perf_counter() - t0, 4)}
        self._markers = open(self.out_dir / "markers.jsonl", "a", encoding="utf-8")

    def mark(self, text: str) -> int:
        with self._lock:
            if self._stopped or self._markers is None:
                raise ProbeError("pyperf probe is not recording: call start() before mark()")
            ts = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
            self._markers.write(json.dumps({"ts": ts, "cpu": sched_getcpu(),
                                            "pid": threading.get_native_id(),
                                            "text": text.rstrip("\n")}) + "\n")
            self._markers.flush()
        return ts

    def stop(self) -> None:
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        t0 = time.perf_counter()
        errors: list[str] = []
        events, drain = self._events, self._drain
        try:
            events.disable()
        except ProbeError as exc:
            errors.append(str(exc))
        self.meta["stopped_ns"] = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        if drain is not None:
            drain.finish()
            if drain.error is not None:
                errors.append(f"the drain failed: {type(drain.error).__name__}: {drain.error}")
            self.meta["drain"] = {"bytes": drain.bytes, "passes": drain.passes,
                                  "most_used_bytes": drain.most_used,
                                  "ring_bytes": events.rings[0].size if events.rings else None,
                                  "idle_ms": DRAIN_IDLE_MS}
        try:
            hits, lost = events.counts()
            h0, l0 = self._counts_at_start
            self.meta["kernel_counts"] = {"hits": hits - h0,
                                          "lost": None if lost is None or l0 is None
                                          else lost - l0}
        except OSError as exc:
            errors.append(f"reading the events' counts: {exc.strerror or exc}")
        try:
            self.meta["clock_tie"]["stop"] = tie(perf_binding.find().module, events.cpus)
        except ProbeError as exc:
            self.meta.setdefault("notes", []).append(f"no clock tie at the stop ({exc}): the "
                                                     "start's offset is used throughout")
        self._release(errors)
        self.meta["stop_s"] = round(time.perf_counter() - t0, 4)
        if self._markers is not None:
            self._markers.close()
            self._markers = None
        self.meta["errors"] = errors
        try:
            atomic_write(self.out_dir / "meta.json", json.dumps(self.meta, indent=1))
        except OSError as exc:
            errors.append(f"writing {self.out_dir / 'meta.json'}: {exc.strerror or exc}")
        if errors:
            raise ProbeError("pyperf probe: " + "; ".join(errors))

    def _release(self, errors: list[str]) -> None:
        """The events handed back to the session (if this run went well), or closed: in the
        background when this run went well (their descriptors' closing takes ~0.3 s of the
        kernel's, see :meth:`OpenEvents.close`; the next events opened wait for it)."""
        kept = self._kept_here
        self._kept_here = None
        if kept is not None and PyperfProbe._kept is kept and not errors:
            kept.user = None
            self.meta["events_kept"] = True
            return
        if kept is not None and PyperfProbe._kept is kept:
            PyperfProbe._kept = None
        try:
            self._events.close(background=not errors)
        except ProbeError as exc:
            errors.append(str(exc))
        self.meta["events_closed"] = "in the background" if not errors else "at the stop"

    def _abort(self) -> None:
        """Undo a start that failed part way."""
        self._stopped = True
        if self._drain is not None:
            self._drain.finish()
        if self._markers is not None:
            self._markers.close()
            self._markers = None
        try:
            self._release(["start failed"])
        except ProbeError:
            pass

    # ------------------------------------------------------------------------ a session
    @classmethod
    @contextlib.contextmanager
    def session(cls):
        """Consecutive captures of this process share the open events until the block ends
        (see the module docstring); the block's end closes them, also on error (in the
        background where every run went well: see :meth:`OpenEvents.close`)."""
        if cls._session_open:
            raise ProbeError("a pyperf session is already open in this process")
        PyperfProbe._session_open = True
        try:
            yield
        finally:
            PyperfProbe._session_open = False
            kept, PyperfProbe._kept = PyperfProbe._kept, None
            if kept is not None:
                ok = kept.user is None
                if not ok:
                    try:
                        kept.user.stop()   # still recording: the block ended by an error
                    except ProbeError:
                        pass
                kept.events.close(background=ok)

    # ------------------------------------------------------------------------ decoding
    @classmethod
    def decode_dir(cls, out_dir: Path) -> Capture:
        # the decoder (pandas, numpy) is imported to decode only
        from harmony.probes.pyperf_decode import decode_records
        from harmony.probes.formats import load_formats_dir, load_header_page
        from harmony.probes.ringbuf import load_meta

        d = Path(out_dir)
        meta = load_meta(d)
        ties = meta.get("clock_tie")
        if not isinstance(ties, dict) or not _is_tie(ties.get("start")) \
                or (ties.get("stop") is not None and not _is_tie(ties["stop"])):
            raise TraceCorrupt(f"{d / 'meta.json'}: no clock tie (clock_tie.start) to put the "
                               "perf clock's stamps on CLOCK_MONOTONIC")
        sample_type = meta.get("sample_type")
        if not isinstance(sample_type, int):
            raise TraceCorrupt(f"{d / 'meta.json'}: bad sample_type {str(sample_type)[:40]}")
        fdir = d / "formats"
        hp = load_header_page(fdir / "header_page")
        formats = load_formats_dir(fdir)
        t = time.perf_counter()
        rr = decode_records(d / RECORDS, sample_type, formats, hp, ties["start"],
                            ties.get("stop"))
        decode_s = time.perf_counter() - t
        notes = [str(n) for n in meta.get("notes", [])] + rr.notes
        notes.append(clock_note(ties))
        counts = meta.get("kernel_counts") or {}
        from_records = sum(rr.lost_by_cpu.values())
        lost = counts.get("lost")
        if not isinstance(lost, int):
            lost = from_records
            notes.append("the kernel does not count each event's lost samples here (before "
                         "Linux 6.0): lost events are those the rings' PERF_RECORD_LOST say")
        elif lost != from_records:
            notes.append(f"the events' own counts say {lost} samples lost, the rings' "
                         f"PERF_RECORD_LOST {from_records} (a ring still full at the stop "
                         "writes no LOST record)")
        if lost:
            notes.append(f"{lost} sched events lost (perf ring buffer full); lost_by_cpu is from "
                         "PERF_RECORD_LOST records")
        hits = counts.get("hits")
        unwritten = (hits - lost - rr.n_samples) if isinstance(hits, int) else None
        if unwritten:
            notes.append(f"the kernel counted {hits} hits of the recorded events and wrote "
                         f"{rr.n_samples} samples, {lost} lost: {unwritten} hits were neither "
                         "written nor counted lost (perf's blind contexts; see silent_contexts)")
        notes.append("markers are not in the kernel trace: mark() timestamps CLOCK_MONOTONIC in "
                     "user space (markers.jsonl)")
        out = {k: v for k, v in meta.items() if k != "notes"}
        out.update({"probe": cls.name, "clock": CLOCK_NAME, "lost_events": int(lost),
                    "lost_by_cpu": rr.lost_by_cpu, "bytes": rr.bytes,
                    "n_events": int(len(rr.events)), "n_samples": rr.n_samples,
                    "unwritten_hits": unwritten, "records": rr.records,
                    "decoder": rr.decoder, "decode_s": round(decode_s, 3), "notes": notes})
        return Capture(events=rr.events, markers=read_markers(d / "markers.jsonl"), meta=out)

    # ------------------------------------------------------------------------ doctor
    @classmethod
    def doctor_check(cls, facts: dict, test_record: bool = True) -> dict:
        """``harmony doctor``'s ``pyperf`` check: is the binding there, does it load in this
        Python (and why not: no linux-perf, another Python ABI, the import's error), and
        (``test_record``) can it open the required sched tracepoints that tracefs has on every
        CPU, map their rings and close them again (~0.1 s: the kernel's unregistering)."""
        binding = perf_binding.find()
        base = dict(binding=binding.facts(), can_record_sched=False, events_tested=[],
                    test_s=None, error=None)
        if not binding.loaded:
            status = MISSING if binding.path is None else WARN
            return check(status, binding.why_not, **base)
        where = f"{binding.package or 'binding'}: {binding.path} loads"
        why = can_read_rings()
        if why:
            return check(WARN, f"{where}; {why}", **{**base, "error": why})
        if not test_record:
            return check(OK, f"{where}; recording not tested", **base)
        present = facts["sched_tracepoints"].get("present", [])
        specs = [EventSpec("sched", e) for e in REQUIRED_TRACEPOINTS if e in present] \
            or [EventSpec("sched", "sched_switch")]
        ok, error, elapsed = try_open(binding.module, specs)
        if not ok and not hostfacts.is_root():
            error += " (need root?)"
        base.update(can_record_sched=ok, events_tested=[s.name for s in specs],
                    test_s=round(elapsed, 3), error=error or None)
        if ok:
            return check(OK, f"{where}; opens {', '.join(base['events_tested'])} on every CPU",
                         **base)
        return check(WARN, f"{where}; cannot open the sched tracepoints: {error}", **base)


def try_open(perf, specs: list[EventSpec]) -> tuple[bool, str, float]:
    """Open ``specs`` on every CPU through the binding, map a one-page ring each, enable,
    disable and close them: (whether it worked, why not, seconds)."""
    t = time.monotonic()
    try:
        events = OpenEvents(perf, specs, pages=1)
    except ProbeError as exc:
        return False, str(exc), time.monotonic() - t
    try:
        events.enable()
        events.disable()
    except ProbeError as exc:
        return False, str(exc), time.monotonic() - t
    finally:
        events.close()
    return True, "", time.monotonic() - t


def _is_tie(tie_: object) -> bool:
    return (isinstance(tie_, dict) and isinstance(tie_.get("perf_ns"), int)
            and isinstance(tie_.get("per_cpu"), dict)
            and (isinstance(tie_.get("offset_ns"), int) or not tie_.get("one_clock")))


def clock_note(ties: dict) -> str:
    """What the clock ties say, one line for the run's notes."""
    a, b = ties["start"], ties.get("stop")
    if a.get("one_clock"):
        text = (f"perf clock tied to CLOCK_MONOTONIC: the binding cannot set the events' clock "
                f"(no clockid in perf.evsel), so every stamp is mapped by the offset measured "
                f"at the start, {a['offset_ns'] / 1e3:.1f} us (the true one at most "
                f"{a['bound_ns'] / 1e3:.1f} us below)")
    else:
        text = ("perf clock tied to CLOCK_MONOTONIC per CPU (the CPUs' perf clocks disagree: "
                f"offsets {({c: p['offset_ns'] for c, p in a['per_cpu'].items()})} ns)")
    if b is None:
        return text + "; no tie at the stop, no drift corrected"
    if a.get("one_clock") and b.get("one_clock"):
        return text + (f", and the one at the stop ({b['offset_ns'] - a['offset_ns']:+d} ns "
                       "drift, interpolated)")
    return text + "; drift interpolated to the stop's tie"


__all__ = ["PyperfProbe", "clock_note", "event_specs", "try_open"]
