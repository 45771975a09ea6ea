"""How Harmony's large arrays get their memory: small pages, not numpy's huge-page request.

numpy asks the kernel for transparent huge pages (``madvise(MADV_HUGEPAGE)``) on every array of
4 MiB or more. Harmony's decoders and reconstructions allocate, fill once and free many such
arrays, each of which the kernel must back with fresh memory. On the 2-vCPU VM Harmony is
developed on (Firecracker, THP "madvise"), a process's first huge pages cost 2-3.4 s per GB to
fault in against 0.55 s per GB for 4 KiB pages (most likely the host takes the guest's free
2 MiB blocks back and backs them again only when they are touched), and the decode + tables of 2.1 M events took 1.07-1.31 s with
huge pages, 0.71-0.80 s without (first pass in a process; 0.71-0.86 -> 0.52-0.57 s the second
time). On bare metal huge pages may well be the cheaper ones.

So Harmony turns numpy's request off when its probes or analyses are imported, unless the
``NUMPY_MADVISE_HUGEPAGE`` environment variable (numpy's own switch: 1 = ask) says what to do.
"""

from __future__ import annotations

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
