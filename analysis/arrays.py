"""Array helpers the reconstruction runs on every event.

``in_set`` replaces ``np.isin`` (a sort of both arrays) by a table look-up, exploiting what the
members are: small non-negative integers (pids, codes). On millions of events it is ~20x faster.
``index_of`` gives each value's position among a few keys the same way (pids in a run's task
table, CPUs in a CPU set); ``sorted_unique`` is ``np.unique`` without numpy's slow hashing.
``event_mask`` selects events by name through the category codes of the canonical table, and
``event_kinds`` maps them to a kernel's own codes. ``LastResult`` keeps an analysis's last
result for the next caller asking about the same events. ``growing_windows`` reads rows near one
place first (a look-up that most often ends within a few events of it).
"""

from __future__ import annotations

import weakref

import numpy as np
import pandas as pd


def in_set(values: np.ndarray, members) -> np.ndarray:
    """``np.isin(values, members)`` for integer arrays, as one gather from a boolean table when the
    members are small non-negative integers (pids, record codes)."""
    members = np.asarray(members, dtype=np.int64)
    values = np.asarray(values)
    if not members.size:
        return np.zeros(values.shape, dtype=bool)
    top = int(members.max())
    if members.min() < 0 or top >= TABLE_KEYS_MAX:
        return np.isin(values, members)
    # value v at v + 1; clipped: 0 (v < 0), top + 2 (v > top)
    table = np.zeros(top + 3, dtype=bool)
    table[members + 1] = True
    # the look-up's indices as wide as the values (at least int32), not int64: two temporaries
    # of 8 bytes a value were the checks' peak at 10 M events. v + 1 wraps only at the type's
    # greatest value, far above any member (TABLE_KEYS_MAX), and a wrapped index clips to 0:
    # not a member, as it should
    wide = np.int32 if values.dtype.itemsize <= 4 else np.int64
    return np.take(table, values.astype(wide, copy=False) + wide(1), mode="clip")


def sorted_unique(values) -> np.ndarray:
    """``np.unique(values)`` by sorting. numpy >= 2.3 hashes when no index, inverse or counts is
    asked for: 1.0 s for 1.1 M distinct timestamps here, against 37 ms sorted (the same for a
    few distinct values)."""
    s = np.sort(np.asarray(values), kind="stable")
    if not len(s):
        return s
    keep = np.empty(len(s), dtype=bool)
    keep[0] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    return s[keep]


#: the largest key (plus one) a look-up table is made for: pid_max is at most 2**22, CPU numbers
#: far below; a larger key is a damaged trace's
TABLE_KEYS_MAX = 1 << 24

#: the slots a look-up table may have whatever the number of values looked up; beyond, at most
#: one slot a value (filling a slot costs about what looking a value up does)
TABLE_MIN_SLOTS = 1 << 16


def keys_fit(*keys) -> bool:
    """Every one of ``keys`` (arrays or lists of integers) fits a :func:`key_table`: none below 0
    or of TABLE_KEYS_MAX or more (the compiled passes' condition for one)."""
    return all(len(k) == 0 or (0 <= int(np.min(k)) and int(np.max(k)) < TABLE_KEYS_MAX)
               for k in keys)


def key_table(keys, dtype=np.int32) -> np.ndarray:
    """A look-up table of ``keys`` (integers in [0, TABLE_KEYS_MAX)): slot v + 1 holds v's
    position in ``keys`` (the first, if it repeats), every other slot -1; slot 0 stands for any
    value below 0 and the last for any above the largest key, both -1. Looked up by
    ``np.take(table, values + 1, mode="clip")`` (:func:`index_of`), and the same way by the
    compiled passes (clipped at both ends). ``dtype``: the positions' type."""
    keys = np.asarray(keys, dtype=np.int64)
    if len(keys) and not (0 <= int(keys.min()) and int(keys.max()) < TABLE_KEYS_MAX):
        raise ValueError(f"key_table: keys must lie in [0, {TABLE_KEYS_MAX})")
    if len(keys) and len(keys) - 1 > np.iinfo(dtype).max:
        raise ValueError(f"key_table: {len(keys)} positions do not fit {np.dtype(dtype)}")
    table = np.full(int(keys.max(initial=-1)) + 3, -1, dtype)
    distinct, first = np.unique(keys, return_index=True)
    table[distinct + 1] = first
    return table


def index_of(values, keys, dtype=np.int64) -> np.ndarray:
    """Position in ``keys`` of each of ``values`` (integers), the first if a key repeats; -1 for
    a value not among them; of type ``dtype`` (a narrower one: less memory for many values).

    Non-negative keys below TABLE_KEYS_MAX, as a run's pids and CPU numbers: one gather from a
    :func:`key_table` of at most max(TABLE_MIN_SLOTS, len(values)) slots, the values read in
    their own integer type (no 64-bit copy of them). Else a table of the keys' span when it is
    under 65536 (negative keys), else a binary search."""
    keys = np.asarray(keys).astype(np.int64)
    values = np.asarray(values)
    if len(keys) and len(keys) - 1 > np.iinfo(dtype).max:
        raise ValueError(f"index_of: {len(keys)} positions do not fit {np.dtype(dtype)}")
    if not len(keys):
        return np.full(values.shape, -1, dtype)
    lo, hi = int(keys.min()), int(keys.max())
    if (values.dtype.kind in "iu" and lo >= 0 and hi < TABLE_KEYS_MAX
            and hi + 3 <= max(TABLE_MIN_SLOTS, values.size) and hi < np.iinfo(values.dtype).max):
        # v + 1 wraps only for the type's largest value, which is no key: to the type's smallest
        # (or 0, unsigned), clipped to slot 0, -1 as it should be
        return np.take(key_table(keys, dtype), values + 1, mode="clip")
    values = values.astype(np.int64)
    if hi - lo < 1 << 16:
        table = np.full(hi - lo + 2, -1, dtype)      # the last slot: any value outside
        distinct, first = np.unique(keys, return_index=True)
        table[distinct - lo] = first
        inside = (values >= lo) & (values <= hi)
        return table[np.where(inside, values - lo, hi - lo + 1)]
    order = np.argsort(keys, kind="stable")
    at = order[np.minimum(np.searchsorted(keys[order], values), len(keys) - 1)]
    return np.where(keys[at] == values, at, -1).astype(dtype, copy=False)


def event_codes(events: pd.DataFrame, *names: str) -> tuple[np.ndarray, list[int]] | None:
    """(each row's category code, the codes of those of ``names`` the events have) when the
    ``event`` column is categorical, as in the canonical table; else None."""
    col = events["event"]
    if not isinstance(col.dtype, pd.CategoricalDtype):
        return None
    cats = col.cat.categories
    return col.cat.codes.to_numpy(), [cats.get_loc(n) for n in names if n in cats]


def event_mask(events: pd.DataFrame, *names: str) -> np.ndarray:
    """Boolean array: the rows of ``events`` whose ``event`` is one of ``names``. On the canonical
    (categorical) column a comparison of codes, without pandas' per-call overhead."""
    by_code = event_codes(events, *names)
    if by_code is None:
        return events["event"].isin(names).to_numpy()
    c, codes = by_code
    if not codes:
        return np.zeros(len(c), dtype=bool)
    return c == codes[0] if len(codes) == 1 else in_set(c, codes)


def event_kinds(events: pd.DataFrame, kinds: dict[str, int]) -> tuple[np.ndarray, np.ndarray]:
    """(codes, lut): event e's kind is lut[codes[e]] (codes[e] < 0: none), its value in ``kinds``
    (event name -> a code 0..127) or -1 for another event: what a compiled kernel reads. The
    event column's category codes when it is categorical, as in the canonical table (no pass over
    the events here), else the kinds themselves (lut: the identity)."""
    col = events["event"]
    if isinstance(col.dtype, pd.CategoricalDtype):
        cats = col.cat.categories
        lut = np.full(max(1, len(cats)), -1, np.int8)
        for name, code in kinds.items():
            if name in cats:
                lut[cats.get_loc(name)] = code
        return col.cat.codes.to_numpy(), lut
    kind = np.full(len(events), -1, np.int8)
    for name, code in kinds.items():
        kind[event_mask(events, name)] = code
    return kind, np.arange(max(kinds.values(), default=0) + 1).astype(np.int8)


def growing_windows(start: int, stop: int, first: int, most: int | None = None):
    """[lo, hi) ranges of rows from ``start`` towards ``stop`` (backwards if stop < start), the
    first ``first`` long, each next one 4x the last (at most ``most`` long), until ``stop``: a
    search that stops at the window where it finds what it wants reads about as much as it
    needed, and a whole pass at worst (whose temporaries ``most`` bounds)."""
    size = first
    while start != stop:
        end = min(start + size, stop) if stop > start else max(start - size, stop)
        yield (start, end) if stop > start else (end, start)
        start, size = end, 4 * size if most is None else min(4 * size, most)


#: every LastResult (:func:`forget_results` drops what each keeps for one events table)
_KEEPERS: weakref.WeakSet = weakref.WeakSet()


def forget_results(events: pd.DataFrame) -> None:
    """Drop every result an analysis kept for ``events`` (:class:`LastResult`): the table was
    changed in place."""
    for keeper in list(_KEEPERS):
        keeper.forget(events)


class LastResult:
    """The last result an analysis computed from an events table, for the next call about the
    same table: keyed by the table object (held weakly), its length and the caller's key (the
    pids asked about). Analyses never modify an events table in place (but
    :func:`harmony.analysis.ties.order_ties`, which drops what is kept for it:
    :func:`forget_results`), so the object's identity is a safe key; the result is dropped with
    the object (else it would hold memory of the size of the trace until the next trace's)."""

    def __init__(self) -> None:
        self._held: tuple | None = None       # (weak ref to the events, key, len, value)
        _KEEPERS.add(self)

    def get(self, events: pd.DataFrame, key):
        """The value kept for ``events`` and ``key``, else None."""
        held = self._held
        if held is not None and held[0]() is events and held[1] == key and held[2] == len(events):
            return held[3]
        return None

    def put(self, events: pd.DataFrame, key, value):
        """Keep ``value`` (and nothing else) for ``events`` and ``key``; returns it."""
        self._held = (weakref.ref(events, self._forget), key, len(events), value)
        return value

    def value(self):
        """The value kept, whatever it was kept for (None if none)."""
        return None if self._held is None else self._held[3]

    def clear(self) -> None:
        self._held = None

    def forget(self, events: pd.DataFrame) -> None:
        """Drop the value if it was kept for ``events``."""
        if self._held is not None and self._held[0]() is events:
            self._held = None

    def _forget(self, ref) -> None:
        """The events object of the kept value is gone: drop the value."""
        if self._held is not None and self._held[0] is ref:
            self._held = None
