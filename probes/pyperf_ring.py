"""Events opened through the python-perf binding, and the ring buffers it mapped, read in this
process (the ``pyperf`` probe's kernel side: :mod:`harmony.probes.pyperf`).

What the binding does: it makes each tracepoint event (``perf.evsel``), opens it on every CPU
(``perf.evlist(perf.cpu_map(), perf.thread_map(-1)).open()``: one perf_event_open() per event
and CPU) and maps one ring buffer per CPU (``evlist.mmap()``: the first event's, the others
redirected into it with PERF_EVENT_IOC_SET_OUTPUT); ``evlist.get_pollfd()`` gives back every
event's file descriptor. What it does not, and this module does instead:

- **read the rings fast enough.** Its reader (``evlist.read_on_cpu``) makes a Python object of
  every record and every tracepoint field one attribute look-up at a time: measured here 1.2 us a
  record, 6 us with the fields the events table needs (a CPU's worth at 170 k events/s, the rate
  of a ping-pong storm). :class:`Ring` reads a ring where the binding mapped it (found in
  ``/proc/self/maps``: the ``[perf_event]`` mappings that ``evlist.mmap()`` added) and copies
  its records as they are, whole, into a file: ``data_head`` read from the ring's control page,
  the bytes from ``data_tail`` to it written out, ``data_tail`` moved to it. The records are
  decoded after the run (:mod:`harmony.probes.pyperf_decode`). This relies on the x86 memory
  order (a load is not passed by a later load): Python cannot place the read barrier a weakly
  ordered CPU needs between ``data_head`` and the data, so the probe records on x86-64 only;
- **filter, enable, disable, count.** The binding (6.1) has no call for these; they are the
  perf_event ioctls on its descriptors: PERF_EVENT_IOC_SET_FILTER (the scheduler's softirq only:
  the filter is tried on every descriptor, and the kernel takes it where the event has the
  ``vec`` field it names, the softirq events, and refuses it on the others), _ENABLE, _DISABLE;
  and read(), whose ``read_format`` PERF_FORMAT_LOST gives each event's hits and the samples
  the kernel could not write (the ring full);
- **release.** Its objects' deallocation neither unmaps the rings nor closes the descriptors
  (binding 6.1: after ``del evlist`` both are still there, and the events with them): the rings
  are unmapped and the descriptors closed here (:meth:`OpenEvents.close`), and the binding's
  objects are then kept alive for the life of the process (:data:`_KEPT`), so that a binding
  whose deallocation does release them cannot release what has been released (an address or
  descriptor number that may by then be another's).

libperf (inside the binding) prints its debug lines to stderr when it maps the rings; they are
caught (:func:`captured_stderr`) and kept in the recording's facts, not shown.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import dataclasses
import errno
import fcntl
import mmap
import os
import platform
import select
import struct
import sys
import tempfile
import threading
import time

from harmony.core.errors import ProbeError

PAGE = mmap.PAGESIZE
IOC_ENABLE, IOC_DISABLE = 0x2400, 0x2401              # _IO('$', 0), _IO('$', 1)
IOC_SET_FILTER = 0x40082406                           # _IOW('$', 6, char *)
# struct perf_event_mmap_page: where data_head, data_tail, data_offset, data_size are
USER_HEAD, USER_TAIL, USER_DATA_OFFSET, USER_DATA_SIZE = 1024, 1032, 1040, 1048
SAMPLE_TIME, SAMPLE_CPU, SAMPLE_RAW = 1 << 2, 1 << 7, 1 << 10
#: what every sample holds: its time (the perf clock), its CPU, the tracepoint's payload
SAMPLE_TYPE = SAMPLE_TIME | SAMPLE_CPU | SAMPLE_RAW
FORMAT_LOST = 1 << 4
#: how long the drain waits for a ring to fill to its watermark before it reads them all anyway
DRAIN_IDLE_MS = 50

_libc = ctypes.CDLL(None, use_errno=True)
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.munmap.restype = ctypes.c_int

#: the binding's objects of every set of events opened, never freed (see the module docstring)
_KEPT: list = []
#: held while rings are mapped and found (the mappings before and after), and while they are
#: unmapped: a ring unmapped meanwhile, and another mapped where it was, would go unseen
MAP_LOCK = threading.RLock()
#: the threads closing events in the background (:meth:`OpenEvents.close`)
_CLOSING: list[threading.Thread] = []


def keep_alive(objects) -> None:
    """Keep the binding's ``objects`` for the life of the process (see the module docstring)."""
    _KEPT.append(objects)


def can_read_rings() -> str | None:
    """Why this machine's rings cannot be read from Python (None: they can): see the module
    docstring."""
    machine = platform.machine()
    if machine not in ("x86_64", "AMD64"):
        return (f"a {machine} CPU: reading a perf ring needs a read barrier Python cannot place "
                "(the probe reads rings on x86-64 only)")
    return None


def perf_mappings() -> list[tuple[int, int]]:
    """[start, end) of every perf ring buffer mapped in this process (``/proc/self/maps``)."""
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            if line.rstrip().endswith("[perf_event]"):
                lo, hi = line.split(None, 1)[0].split("-")
                out.append((int(lo, 16), int(hi, 16)))
    return out


@contextlib.contextmanager
def captured_stderr(lines: list[str]):
    """File descriptor 2 goes to a temporary file for the block; its lines are appended to
    ``lines``, and those not libperf's are written to the real stderr after it."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield lines
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            text = tmp.read().decode("utf-8", "replace").splitlines()
            lines.extend(text)
            other = [ln for ln in text if not ln.startswith("libperf:")]
            if other:
                os.write(2, ("\n".join(other) + "\n").encode())


class Ring:
    """One ring buffer mapped at [start, end): a control page, then the data area."""

    def __init__(self, start: int, end: int):
        self.start, self.length = start, end - start
        self.head = ctypes.c_uint64.from_address(start + USER_HEAD)
        self.tail = ctypes.c_uint64.from_address(start + USER_TAIL)
        offset = ctypes.c_uint64.from_address(start + USER_DATA_OFFSET).value or PAGE
        size = ctypes.c_uint64.from_address(start + USER_DATA_SIZE).value or self.length - PAGE
        if size & (size - 1) or offset + size > self.length:
            raise ProbeError(f"perf ring at {start:#x}: data area of {size} bytes at {offset} "
                             f"does not fit its {self.length}-byte mapping")
        self.size = size
        self.data = memoryview((ctypes.c_char * size).from_address(start + offset)).cast("B")
        self.unmapped = False

    def used(self) -> int:
        """Bytes written and not read yet."""
        return self.head.value - self.tail.value

    def copy_to(self, fd: int) -> int:
        """Write every whole record written since the last call to ``fd``, then hand their
        space back to the kernel; returns the bytes written."""
        head, tail = self.head.value, self.tail.value
        n = head - tail
        if n <= 0:
            return 0
        if n > self.size:
            raise ProbeError(f"perf ring at {self.start:#x}: {n} bytes unread in a "
                             f"{self.size}-byte ring (its head moved past its tail)")
        a = tail & (self.size - 1)
        parts = ([self.data[a:a + n]] if a + n <= self.size else
                 [self.data[a:], self.data[:a + n - self.size]])
        for part in parts:
            while len(part):
                done = os.write(fd, part)
                part = part[done:]
        self.tail.value = head
        return n

    def unmap(self) -> None:
        if not self.unmapped:
            self.data.release()
            self.unmapped = True
            with MAP_LOCK:
                failed = _libc.munmap(self.start, self.length) != 0
            if failed:
                e = ctypes.get_errno()
                raise ProbeError(f"munmap of the perf ring at {self.start:#x}: "
                                 f"{os.strerror(e)}")


@dataclasses.dataclass(frozen=True)
class EventSpec:
    """A tracepoint to open: ``system:name``, with a filter for the kernel or none."""

    system: str
    name: str
    filter: str | None = None

    @property
    def label(self) -> str:
        return f"{self.system}:{self.name}"


class OpenEvents:
    """Tracepoints opened on every CPU through the binding, their rings mapped (see the module
    docstring); created disabled. ``pages``: data pages per ring (a power of two);
    ``watermark``: bytes of a ring after which the kernel wakes a poller (0: every record)."""

    def __init__(self, perf, specs: list[EventSpec], pages: int, watermark: int = 0,
                 sample_type: int = SAMPLE_TYPE):
        self.specs, self.pages, self.log = list(specs), pages, []
        self.fds: list[int] = []
        self.rings: list[Ring] = []
        self.closed = False
        cpus, threads = perf.cpu_map(), perf.thread_map(-1)
        self.cpus = list(cpus)
        evlist = perf.evlist(cpus, threads)
        evsels = []
        for spec in self.specs:
            config = perf.tracepoint(spec.system, spec.name)
            if config is None or config < 0:
                raise ProbeError(f"python-perf: no tracepoint {spec.label} (perf.tracepoint "
                                 f"gave {config})")
            evsel = perf.evsel(type=perf.TYPE_TRACEPOINT, config=config, freq=0,
                               sample_period=1, sample_type=sample_type,
                               read_format=FORMAT_LOST, sample_id_all=1, disabled=1,
                               watermark=int(watermark > 0), wakeup_events=watermark or 1)
            evlist.add(evsel)
            evsels.append(evsel)
        keep_alive((evlist, evsels, cpus, threads))
        wait_closed()
        with MAP_LOCK:
            before = set(perf_mappings())
            try:
                with captured_stderr(self.log):
                    evlist.open()
                    evlist.mmap(pages=pages)
                failed = None
            except OSError as exc:
                failed = exc
            self._adopt(evlist, before)
        if failed is not None:
            exc = failed
            self.close()
            raise ProbeError(f"python-perf could not open the events "
                             f"({', '.join(s.label for s in self.specs)}) on every CPU: "
                             f"{exc.strerror or exc}"
                             + (" (need root?)" if exc.errno in (errno.EACCES, errno.EPERM)
                                else "")) from None
        expect = (pages + 1) * PAGE
        odd = [(a, b) for a, b in ((r.start, r.start + r.length) for r in self.rings)
               if b - a != expect]
        if len(self.rings) != len(self.cpus) or odd:
            self.close()
            raise ProbeError(f"python-perf mapped {len(self.rings)} rings for "
                             f"{len(self.cpus)} CPUs (of {expect} bytes each expected: "
                             f"{odd or 'sizes right'})")

    def _adopt(self, evlist, before: set) -> None:
        """Take over the descriptors and the rings the binding made (see the module docstring)."""
        try:
            self.fds = [f.fileno() for f in evlist.get_pollfd()]
        except (OSError, ValueError):
            self.fds = []
        new = sorted(m for m in perf_mappings() if m not in before)
        self.rings = [Ring(a, b) for a, b in new]

    def set_filter(self, text: str) -> int:
        """Set ``text`` as the filter of every event that takes it; returns how many
        descriptors took it (the events with the field it names, on every CPU)."""
        arg = text.encode() + b"\0"
        took = 0
        for fd in self.fds:
            try:
                fcntl.ioctl(fd, IOC_SET_FILTER, arg)
                took += 1
            except OSError:
                pass
        return took

    def _ioctl_all(self, request: int, what: str) -> None:
        for fd in self.fds:
            try:
                fcntl.ioctl(fd, request, 0)
            except OSError as exc:
                raise ProbeError(f"python-perf: could not {what} its events: "
                                 f"{exc.strerror or exc}") from None

    def enable(self) -> None:
        self._ioctl_all(IOC_ENABLE, "enable")

    def disable(self) -> None:
        self._ioctl_all(IOC_DISABLE, "disable")

    def counts(self) -> tuple[int, int | None]:
        """(hits, samples lost) summed over every event and CPU, as the kernel counts them since
        the events were opened; lost is None where the kernel does not count them (before
        Linux 6.0: no PERF_FORMAT_LOST)."""
        hits, lost = 0, 0
        for fd in self.fds:
            data = os.read(fd, 64)
            if len(data) < 16:
                lost = None
            values = struct.unpack(f"<{len(data) // 8}Q", data)
            hits += values[0]
            if lost is not None:
                lost += values[1]
        return hits, lost

    def close(self, background: bool = False) -> None:
        """Disable the events, unmap the rings, close the descriptors (the kernel then removes
        the events). Idempotent. The descriptors' closing takes ~0.03 s an event (the kernel
        unregisters each tracepoint's perf handler, an RCU grace period each, one after the
        other whatever the threads): ``background`` leaves it to a thread of its own
        (:func:`wait_closed` waits for every such thread; so does the next set of events
        opened, and the process's exit)."""
        if self.closed:
            return
        self.closed = True
        for fd in self.fds:
            try:
                fcntl.ioctl(fd, IOC_DISABLE, 0)
            except OSError:
                pass
        if background:
            t = threading.Thread(target=self._release, name="pyperf-close", daemon=True)
            _CLOSING.append(t)
            t.start()
        else:
            self._release()

    def _release(self) -> None:
        self.release_error = None
        for ring in self.rings:
            try:
                ring.unmap()
            except ProbeError as exc:
                self.release_error = str(exc)
        for fd in self.fds:
            try:
                os.close(fd)
            except OSError:
                pass
        if self.release_error and threading.current_thread().name != "pyperf-close":
            raise ProbeError(self.release_error)


def wait_closed(timeout: float | None = None) -> None:
    """Wait for the events being closed in the background (:meth:`OpenEvents.close`)."""
    while _CLOSING:
        t = _CLOSING[0]
        t.join(timeout)
        if t.is_alive():
            return
        _CLOSING.remove(t)


atexit.register(wait_closed, 10.0)


class Drain(threading.Thread):
    """Copies every ring's records into one file until stopped, then once more.

    It waits on every event's descriptor (a ring filled to its watermark wakes it), at most
    :data:`DRAIN_IDLE_MS`, or until :meth:`finish`; then copies what each ring holds. One
    thread for all the rings: each copy is a write() of whole records, during which the thread
    holds no GIL."""

    def __init__(self, rings: list[Ring], fds: list[int], path: str,
                 stall_ns: tuple[int, int] | None = None):
        super().__init__(name="pyperf-drain", daemon=True)
        self.rings, self.fds, self.path = rings, fds, path
        self.stall_ns = stall_ns    # (from, until) CLOCK_MONOTONIC ns: no reading (expert option)
        self.stopping = threading.Event()
        self.bytes = 0
        self.passes = 0
        self.most_used = 0            # the fullest any ring was at a pass, in bytes
        self.error: BaseException | None = None
        self._wake_r, self._wake_w = os.pipe()

    def run(self):
        try:
            poller = select.poll()
            for fd in [*self.fds, self._wake_r]:
                poller.register(fd, select.POLLIN)
            out = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                ready = False
                while True:
                    final = self.stopping.is_set()
                    if self.stall_ns and not final and self.stall_ns[0] <= \
                            time.clock_gettime_ns(time.CLOCK_MONOTONIC) < self.stall_ns[1]:
                        self.stopping.wait(0.01)
                        continue
                    got = 0
                    for ring in self.rings:
                        self.most_used = max(self.most_used, ring.used())
                        got += ring.copy_to(out)
                    self.bytes += got
                    self.passes += 1
                    if final:
                        return
                    if ready and not got:       # woken with nothing to read (a descriptor in
                        self.stopping.wait(DRAIN_IDLE_MS / 1e3)   # error): no busy loop
                    ready = bool(poller.poll(DRAIN_IDLE_MS))
            finally:
                os.close(out)
        except BaseException as exc:      # reported by the probe's stop(), never lost
            self.error = exc

    def finish(self) -> None:
        """Have the drain copy what is left (the events disabled first) and end; waits for it."""
        self.stopping.set()
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass
        if self.is_alive():
            self.join()
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass


__all__ = ["DRAIN_IDLE_MS", "Drain", "EventSpec", "OpenEvents", "Ring", "SAMPLE_TYPE",
           "can_read_rings", "captured_stderr", "keep_alive", "perf_mappings", "wait_closed"]
