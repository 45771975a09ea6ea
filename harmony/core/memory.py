"""How Harmony's large arrays get their memory: small pages, not numpy's huge-page request, and
freed memory kept for the next arrays.

numpy asks the kernel for transparent huge pages (``madvise(MADV_HUGEPAGE)``) on every array of
4 MiB or more. Harmony's decoders and reconstructions allocate, fill once and free many such
arrays, each of which the kernel must back with fresh memory. On the 2-vCPU VM Harmony is
developed on (Firecracker, THP "madvise"), a process's first huge pages cost 2-3.4 s per GB to
fault in against 0.55 s per GB for 4 KiB pages (most likely the host takes the guest's free
2 MiB blocks back and backs them again only when they are touched), and the decode + tables of
2.1 M events took 1.07-1.31 s with huge pages, 0.71-0.80 s without (first pass in a process;
0.71-0.86 -> 0.52-0.57 s the second time). On bare metal huge pages may well be the cheaper ones.

So Harmony's entry points -- the ``harmony`` command, the suite's background analyser, the
benchmarks -- turn numpy's request off (:func:`tune_allocations`; importing Harmony changes
nothing: a program using it as a library calls that itself, if it wants it), unless the
``NUMPY_MADVISE_HUGEPAGE`` environment variable (numpy's own switch: 1 = ask) says what to do.

For the same reason Harmony asks glibc's malloc to keep what is freed for the next arrays
(:func:`keep_freed_memory`): the decoder's and the state machine's temporaries are freed while
the tables are built, and by default glibc gives most of them back to the kernel, whose next
arrays are then fresh memory to fault in again. Kept, 2.1 M events faulted ~64 k pages instead
of ~85 k while the tables were built, and the first decode + tables in a process took 0.93x the
time (paired runs, median; 0.83x the second time), 0.90x at 0.19 M events.

Arrays of 32 MiB or more (a column of ~4 M events) glibc maps on their own whatever its
threshold, and unmaps when freed, so from ~4 M events on every large array was fresh memory
again. So the main thread's arrays never get a mapping of their own (``M_MMAP_MAX`` 0): they
come from the heap, where freed ones are reused. At 14 M events the first decode + tables took
0.83x the time (6 paired runs, 4.08 -> 3.28 s; 0.72x the second time in a process); at 10 M,
``bench/ingest.py`` went from 1.60 to 3.98 M events/s. And every thread allocates from that one
heap (``M_ARENA_MAX`` 1): a thread of its own arena got none of the memory kept and prefaulted,
and kept what it freed apart from it (an import's checks run beside its tables on a side thread:
its peak at 7.06 M events 1217 MiB with their own arena, 1158 in the one heap, as before them;
the whole import 0.88x the time of the import before either, 5 pairs: the one arena's lock,
shared by every thread, was not measured apart).

The cost: a process keeps the memory it freed, up to its peak, for its next arrays (only what is
free at the heap's top beyond 1 GiB is given back). The environment's malloc settings
(``GLIBC_TUNABLES``, ``MALLOC_*_``) replace all of this.

What remains is the first touch of the memory a trace needs (~3 us a page here, ~40 % of the
CPU time of a first decode + tables). The decoder knows the trace's size before it allocates
anything, and a decode keeps two CPUs busy only ~80 % of the time, so :func:`prefault_heap` has a
thread at ``SCHED_IDLE`` (it runs only on a CPU nothing else wants) fault in heap memory ahead
of the arrays, with ``madvise(MADV_POPULATE_WRITE)``, which never changes a page's contents and
so cannot race with the arrays being written. Measured on 2.1 M events (paired runs in new
processes, 12 pairs each): the first decode + tables took 0.84-0.88x the time with 2.5 bytes
prefaulted per byte of pages (1.5: 0.91x, 3.5: 0.94x; at the work's own priority 0.92x), 0.94x
at 0.66 M events, 1.04x at 0.19 M (hence nothing below 64 MiB). Memory prefaulted and never used is
resident all the same: once the decoder came to allocate less, 2.5 set a whole import's peak, and
the decoders now ask 1.5 (:data:`harmony.probes.ringbuf_decode.PREFAULT_PER_PAGE_BYTE`).
``HARMONY_PREFAULT=0`` turns it off.

The consequence for code that runs while a large trace's tables are held: a process's peak is
the heap it has touched, not what it holds at once, so a temporary as long as a table raises the
peak even when it is freed at once, wherever the heap's free holes are too small or too few for
it. Such work reads its input a chunk at a time (``reconstruct.ALLOCATION_CHUNK``,
``CHANGES_CHUNK``), writes its result where it stays (a room cut in place, not copied out), or
frees what it is done with before it allocates more (the task records' arranged build). At
4.09 M events of a ping-pong these took a whole import from 155 to 145 bytes an event, the peak
moving on to the next step at each one (bench/README.md: followed with ``malloc_info`` and
``RssAnon`` around each step, then line by line).

Arrow's buffers (the Parquet files written, read back) come from glibc's malloc too
(:func:`arrow_from_malloc`), not from pyarrow's default (mimalloc in its wheels), which keeps
the pages of its own arenas (~45 MB resident by the end of a 10 M-event import, for at most
7 MB in use at once) beside the heap's free memory the next arrays would have taken. A 10
M-event import's peak: 1425 -> 1388 MiB in the same time (0.993x, 6 pairs); a perf.data of
9.9 M events ~45 MB less. ``ARROW_DEFAULT_MEMORY_POOL`` (Arrow's own switch) set in the
environment wins.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
import threading


def small_pages() -> bool:
    """Stop numpy from asking for huge pages in this process (unless ``NUMPY_MADVISE_HUGEPAGE``
    is set); returns whether numpy asks for them now."""
    try:
        from numpy._core import multiarray  # numpy 2
    except ImportError:
        from numpy.core import multiarray  # numpy 1.26
    if not hasattr(multiarray, "_set_madvise_hugepage"):
        return False
    if "NUMPY_MADVISE_HUGEPAGE" not in os.environ:
        multiarray._set_madvise_hugepage(False)
    return bool(multiarray._get_madvise_hugepage())


#: glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -2, -4, -8
_MMAP_MAX = 0                 # no array gets a mapping of its own: all come from the heap
_TRIM_THRESHOLD = 1 << 30     # free memory kept at the heap's top before it is given back
_TOP_PAD = 64 << 20           # the heap grows by at least this much at a time

#: whether keep_freed_memory set glibc's parameters (prefault_heap relies on them)
_kept = False


def _user_tuned_malloc() -> bool:
    """The user set glibc's malloc parameters in the environment: theirs win."""
    return "malloc" in os.environ.get("GLIBC_TUNABLES", "") or any(
        k.startswith("MALLOC_") and k.endswith("_") for k in os.environ)


def keep_freed_memory() -> bool:
    """Ask glibc's malloc to keep freed memory for reuse (see the module doc), unless the
    environment sets its parameters already or the C library is not glibc; returns whether the
    parameters were set."""
    if _user_tuned_malloc():
        return False
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
        libc.gnu_get_libc_version    # glibc's (musl has a mallopt that does nothing)
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    global _kept
    _kept = all(mallopt(param, value) == 1 for param, value in (
        (_M_MMAP_MAX, _MMAP_MAX), (_M_TRIM_THRESHOLD, _TRIM_THRESHOLD), (_M_TOP_PAD, _TOP_PAD),
        (_M_ARENA_MAX, 1)))
    return _kept


_MADV_POPULATE_WRITE = 23            # Linux >= 5.14; older kernels refuse it (EINVAL)
_PREFAULT_CHUNK = 4 << 20            # one madvise call: the work it holds up is a few ms at most
_PREFAULT_MIN = 64 << 20             # below (~0.5 M events) it was no faster (0.19 M: 1.04x)
#: the most prefaulted at once: freed at the heap's top, more than the trim threshold (less the
#: growth pad) would be given back at once
PREFAULT_MAX = _TRIM_THRESHOLD - 2 * _TOP_PAD


def prefault_heap(nbytes: int) -> threading.Thread | None:
    """Fault in ``nbytes`` (at most :data:`PREFAULT_MAX`) of fresh heap memory for the arrays
    this process is about to allocate, on a thread at ``SCHED_IDLE`` (see the module doc); returns
    the thread, or None when nothing is done: freed memory is not kept (the environment tunes
    malloc, or the C library is not glibc), ``HARMONY_PREFAULT=0``, or ``nbytes`` is small.
    :func:`stop_prefault` stops it (a run's capture does, before anything is measured: a task
    runnable at SCHED_IDLE still counts in the run queue the experiment watches).

    The heap is grown by ``nbytes`` (malloc, then free: the block becomes free memory at the
    heap's top, where the next arrays come from), and the thread populates it a chunk at a time.
    It stops at the end, or at the first chunk the kernel refuses (no MADV_POPULATE_WRITE before
    Linux 5.14, or the heap was shrunk meanwhile). Populating never changes a page's contents,
    so arrays may be written in the same memory meanwhile."""
    nbytes = min(int(nbytes), PREFAULT_MAX)
    stop_prefault()     # a previous decode's: this one's memory is what matters now
    if _prefault_off() or nbytes < _PREFAULT_MIN:
        return None
    libc = _libc()
    block = libc.malloc(nbytes)
    if not block:
        return None
    libc.free(block)
    page = os.sysconf("SC_PAGE_SIZE")
    lo, hi = -(-block // page) * page, (block + nbytes) // page * page
    stop = threading.Event()
    thread = threading.Thread(target=_populate, args=(libc, lo, hi, stop), name="harmony-prefault",
                              daemon=True)
    _prefaults.append((thread, stop))
    thread.start()
    return thread


def stop_prefault() -> None:
    """Stop every :func:`prefault_heap` thread of this process and wait for it (at most one
    madvise call of a few ms)."""
    while _prefaults:
        thread, stop = _prefaults.pop()
        stop.set()
        if thread.is_alive():   # not one whose start a Ctrl-C interrupted: it never ran
            thread.join()


_prefaults: list[tuple[threading.Thread, threading.Event]] = []


def _populate(libc, lo: int, hi: int, stop: threading.Event) -> None:
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))   # this thread only
    except (AttributeError, OSError):
        return      # at the work's own priority it would compete with the work it is to speed up
    while lo < hi and not stop.is_set():
        n = min(_PREFAULT_CHUNK, hi - lo)
        if libc.madvise(lo, n, _MADV_POPULATE_WRITE):    # ctypes lets go of the GIL meanwhile
            return
        lo += n


def _prefault_off() -> str | None:
    """Why :func:`prefault_heap` does nothing in this process whatever the size, or None."""
    if not _kept:
        return ("freed memory is not kept for the next arrays (malloc parameters set in the "
                "environment, or not glibc)")
    if os.environ.get("HARMONY_PREFAULT", "1") == "0":
        return "HARMONY_PREFAULT=0"
    return None


def describe() -> tuple[bool, str]:
    """(whether decodes get their memory faulted in ahead of them here, a line saying why)."""
    off = _prefault_off()
    if off:
        return False, off + ": decodes fault their memory in as they go"
    page = mmap.PAGESIZE
    with mmap.mmap(-1, page) as probe:
        cell = ctypes.c_char.from_buffer(probe)
        refused = _libc().madvise(ctypes.addressof(cell), page, _MADV_POPULATE_WRITE)
        errno = ctypes.get_errno()
        del cell            # the mapping cannot close while a ctypes object points into it
    if refused:
        return False, (f"madvise(MADV_POPULATE_WRITE) refused ({os.strerror(errno)}; Linux >= "
                       f"5.14 has it): decodes fault their memory in as they go")
    return True, (f"a decode needing {_PREFAULT_MIN >> 20} MiB or more (~0.5 M events) has it "
                  f"faulted in ahead of it at SCHED_IDLE (HARMONY_PREFAULT=0 turns it off)")


_libc_funcs = None


def _libc():
    """glibc's malloc, free and madvise through ctypes (looked up once)."""
    global _libc_funcs
    if _libc_funcs is None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.malloc.argtypes, libc.malloc.restype = [ctypes.c_size_t], ctypes.c_void_p
        libc.free.argtypes, libc.free.restype = [ctypes.c_void_p], None
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        libc.madvise.restype = ctypes.c_int
        _libc_funcs = libc
    return _libc_funcs


def arrow_from_malloc() -> str:
    """Have Arrow allocate its buffers with the C library's malloc (see the module doc), unless
    ``ARROW_DEFAULT_MEMORY_POOL`` is set in the environment; returns the pool Arrow will use.
    Before pyarrow is imported this only sets that variable, which Arrow reads once (importing
    pyarrow is not paid for here); after, it sets the pool too."""
    chosen = os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
    pa = sys.modules.get("pyarrow")
    if pa is not None and chosen == "system":
        pa.set_memory_pool(pa.system_memory_pool())
    return pa.default_memory_pool().backend_name if pa is not None else chosen


def tune_allocations() -> None:
    """What Harmony's entry points call first: :func:`small_pages`, :func:`keep_freed_memory`
    and :func:`arrow_from_malloc`."""
    small_pages()
    keep_freed_memory()
    arrow_from_malloc()
