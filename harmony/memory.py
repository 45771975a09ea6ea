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

So Harmony turns numpy's request off when its probes or analyses are imported, unless the
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
``bench/ingest.py`` went from 1.60 to 3.98 M events/s. (Arrays over 64 MiB allocated by a worker
thread are still mapped: glibc's thread arenas cannot hold them.)

The cost: a process keeps the memory it freed, up to its peak, for its next arrays (only what is
free at the heap's top beyond 1 GiB is given back). The environment's malloc settings
(``GLIBC_TUNABLES``, ``MALLOC_*_``) replace all of this.
"""

from __future__ import annotations

import ctypes
import os


def small_pages() -> bool:
    """Stop numpy from asking for huge pages in this process (unless ``NUMPY_MADVISE_HUGEPAGE``
    is set); returns whether numpy asks for them now."""
    try:
        from numpy._core import multiarray     # numpy 2
    except ImportError:
        from numpy.core import multiarray      # numpy 1.26
    if not hasattr(multiarray, "_set_madvise_hugepage"):
        return False
    if "NUMPY_MADVISE_HUGEPAGE" not in os.environ:
        multiarray._set_madvise_hugepage(False)
    return bool(multiarray._get_madvise_hugepage())


#: glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_MAX = -1, -2, -4
_MMAP_MAX = 0                 # no array gets a mapping of its own: all come from the heap
_TRIM_THRESHOLD = 1 << 30     # free memory kept at the heap's top before it is given back
_TOP_PAD = 64 << 20           # the heap grows by at least this much at a time


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
    return all(mallopt(param, value) == 1 for param, value in (
        (_M_MMAP_MAX, _MMAP_MAX), (_M_TRIM_THRESHOLD, _TRIM_THRESHOLD), (_M_TOP_PAD, _TOP_PAD)))


def tune_allocations() -> None:
    """What the probes and the analyses call when imported: :func:`small_pages` and
    :func:`keep_freed_memory`."""
    small_pages()
    keep_freed_memory()
